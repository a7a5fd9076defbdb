"""Restoring changelog-enabled keyed state: the materialized snapshot(s) plus the change sets logged since.

As fast as restoring a full snapshot of the same state, by three means:

* reading ahead: a few threads fetch (storage read, checksum, decode) the change sets and the materialized key
  groups, in a bounded window, while this thread writes what has arrived;
* folding the log: the change sets are all read first (the log since a materialization is bounded, see
  :class:`~spate.changelog.state.ChangelogConfig`), then each key group's records are applied at once: in a
  key group whose records are all ``PUT`` / ``DELETE`` (value state, the common case) only each key's last
  change matters, so each key is written once, not once per change set;
* merging: a key group with a materialized frame and only ``PUT`` s in the log is written to the table once,
  instead of once for the frame and once per change set: each logged key is found in the frame (sorted) by
  bisection, so the work follows the log, not the whole key group; keys the log added since the materialization
  (few) are inserted where they sort, so the key group goes in one write (one transaction, one commit) in key
  order, in lmdb's append mode (:mod:`spate.state.lmdb_append`). Its digest is the frame's, adjusted by the
  entries the log replaced and put.

Why folding is exact: ``PUT`` and ``DELETE`` records carry primaries, which are self-delimiting
(:func:`~spate.state.layout.primary_length`), so a record of one key never touches another's entry except
that a ``DELETE`` also removes the map entries under its primary, which ``PUT`` s never write. So per key the
last change wins, and a key deleted earlier in the log and then put is deleted, then put (the delete goes to
whatever the base holds under it). A key group with any other record (``APPEND``, ``MAP_PUT``,
``MAP_DELETE``, whose effect depends on what precedes them) is replayed record by record, in order.
Key groups are disjoint parts of the table, so the order among them does not matter.
"""

from __future__ import annotations

import functools
import os
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import compress, repeat
from operator import eq, is_not, not_

from spate.changelog.changeset import DELETE, PUT, replay
from spate.changelog.format import read_change_set
from spate.changelog.table import ChangelogTable
from spate.frames import RangeReader
from spate.fs import CheckpointStorage
from spate.heap import bulk_phase
from spate.open_files import OpenFiles
from spate.snapshot.handles import ChangeSetHandle, KeyedHandle, KeyGroupsHandle, NativeSnapshotHandle, held_key_groups
from spate.snapshot.keyed import map_sids, read_key_group_frames, remapped, remapped_keys, sid_remap
from spate.snapshot.native import NativeSource
from spate.snapshot.read_ahead import read_ahead
from spate.state.keyed import KeyedStateBackend
from spate.state.layout import U16, ascending
from spate.state.lmdb_digest import MASK64, key_group_digest
from spate.state.lmdb_table import LmdbTable
from spate.state.table import StateTable

READ_THREADS = 3  # storage reads release the GIL; decoding does not, so a few are enough
READ_AHEAD_BYTES = 32 << 20  # stored bytes read ahead of what is being applied (bounds the memory it takes)
CHUNK_BYTES = 4 << 20  # a materialized snapshot is fetched in ranged reads of about this many bytes
# the key groups are restored in parts of about this much log, each part's log decoded and held while its
# materialized key groups are merged with it: this bounds the restore's memory whatever the log's length
PART_LOG_BYTES = 64 << 20
MIN_READ_BYTES = 256 << 10  # as long as a part of a change set is about this long (object stores: few requests)
MAX_PARTS = 64  # and no more parts (each reads every change set once)
COLLECT_FROM_BYTES = 64 << 20  # a restore this large collects garbage cycles first (spate.heap): worth the pass
# [op, key, value, op, key, value, ...] of one key group: of one change set as read (state ids mapped to the
# backend's), then of all of them in log order
Records = list
Offsets = dict[int, tuple[int, int]]
FOLDABLE = frozenset((PUT, DELETE))


def restore_keyed_state(backend: KeyedStateBackend, storage: CheckpointStorage, materialized: list[KeyedHandle],
                        changelog: list[ChangeSetHandle], context: str) -> None:
    """Materialized snapshots, then every change set in order, keeping only the backend's key groups.
    Replayed changes go to the table under any changelog wrapper: they are already durable.

    The key groups are restored in parts (contiguous ranges): a part's change sets are read (their frames of
    the part's key groups), then its materialized key groups, each merged with its log as it arrives, while
    the next part's reads are under way. A native snapshot (:mod:`spate.snapshot.native`) is downloaded once,
    next to an lmdb table's directory, and read key group by key group."""
    table = backend.table.inner if isinstance(backend.table, ChangelogTable) else backend.table
    owned = backend.key_groups
    # states are adopted in the order a sequential restore adopts them: snapshots, then change sets
    snapshots = [(sid_remap(backend, h.states), map_sids(backend, h.states)) for h in materialized]
    remaps = [sid_remap(backend, h.states) for h in changelog]
    last_frame = {kg: i for i, h in enumerate(materialized) for kg in held_key_groups(h) if kg in owned}
    scratch = os.path.dirname(table.path) if isinstance(table, LmdbTable) else None
    natives = {i: NativeSource(storage, h, context, scratch) for i, h in enumerate(materialized)
               if isinstance(h, NativeSnapshotHandle)}
    log_bytes = sum(n for h in changelog for kg, (_o, n) in h.offsets.items() if kg in owned)
    # what to read, in order: (bytes, read, where its result goes: change set j or materialized handle i)
    reads: list[tuple[int, Callable[[], Iterable], tuple[bool, int]]] = []
    files = OpenFiles(storage)  # each file opened once: on an object store, one request less per read
    for part in _split(owned, part_count(log_bytes, len(changelog))):
        for j, h in enumerate(changelog):
            if offsets := _within(h.offsets, part):
                read = functools.partial(_change_set, files, h, offsets, remaps[j], context)
                reads.append((_span(offsets), read, (True, j)))
        for i, m in enumerate(materialized):
            if isinstance(m, NativeSnapshotHandle):
                # a few key groups per read, as for frames: the reads ahead stay within their bytes
                kgs, per_kg = [kg for kg in m.held if kg in part], max(1, m.size // max(1, len(m.groups)))
                step = max(1, CHUNK_BYTES // per_kg)
                for at in range(0, len(kgs), step):
                    reads.append((per_kg * len(kgs[at:at + step]),
                                  functools.partial(natives[i].key_groups, kgs[at:at + step]), (False, i)))
                continue
            for chunk in _chunks(_within(m.offsets, part)):
                reads.append((_span(chunk), functools.partial(_key_groups, files, m, chunk, context), (False, i)))
        reads.append((0, list, (True, -1)))  # the part's end: apply its log of key groups not materialized
    log: dict[int, Records] = {}
    collect = sum(size for size, _read, _to in reads) >= COLLECT_FROM_BYTES
    with files, ThreadPoolExecutor(READ_THREADS, thread_name_prefix="spate-restore") as pool, bulk_phase(collect):
        fetched = read_ahead(pool, [(size, read) for size, read, _to in reads], READ_AHEAD_BYTES)
        try:
            for (_size, _read, (is_log, n)), groups in zip(reads, fetched, strict=True):
                if is_log and n < 0:
                    for kg in sorted(log):
                        apply_logged(table, kg, log[kg])
                    log.clear()
                elif is_log:
                    for kg, records in groups:
                        log.setdefault(kg, []).extend(records)
                else:
                    remap, maps = snapshots[n]
                    for kg, flat, digest in groups:
                        frame = MaterializedFrame(remapped(flat, remap), maps, None if remap else digest)
                        logged = log.pop(kg, None) if last_frame[kg] == n else None
                        if logged is None:
                            table.restore_key_group(kg, frame.flat, maps, frame.digest)
                        else:
                            apply_logged(table, kg, logged, frame)
        finally:
            fetched.close()  # cancels the reads not under way yet
            for native in natives.values():
                native.close()
    backend.table.commit()


@dataclass(frozen=True)
class MaterializedFrame:
    """A key group's entries as a materialized snapshot holds them: ``flat`` (state ids already this
    backend's), the state ids of map states and timers ``maps``, and the digest the frame carried (None: not
    known, or no longer valid after mapping state ids)."""

    flat: list[bytes]
    maps: frozenset[bytes] = frozenset()
    digest: int | None = None


def apply_logged(table: StateTable, kg: int, logged: Records, frame: MaterializedFrame | None = None) -> None:
    """Apply key group ``kg``'s change-set records ``logged`` (of every change set, in log order) to ``table``,
    after its materialized ``frame`` if it has one; folded where that is exact (module doc)."""
    if not FOLDABLE.issuperset(logged[0::3]):
        if frame is not None:
            table.restore_key_group(kg, frame.flat, frame.maps, frame.digest)
        replay(table, kg, logged)
        return
    puts, deleted = fold(logged)
    if frame is not None and not deleted:  # one write of the key group: its frame updated by the log
        merged = _merged(kg, frame, puts)
        table.restore_key_group(kg, merged.flat, merged.maps, merged.digest)
        return
    if frame is not None:
        table.restore_key_group(kg, frame.flat, frame.maps, frame.digest)
    for key in deleted:
        table.delete(kg, key)
    if puts:
        table.restore_key_group(kg, _sorted_flat(puts), frozenset())


def _flat(entries: dict[bytes, bytes]) -> list[bytes]:
    """``[key, value, key, value, ...]`` of ``entries``, in their order (slice assignment: no tuple per entry)."""
    flat: list[bytes] = [b""] * (2 * len(entries))
    flat[0::2] = entries.keys()
    flat[1::2] = entries.values()
    return flat


def _sorted_flat(entries: dict[bytes, bytes]) -> list[bytes]:
    """:func:`_flat` of ``entries`` in key order: the keys sorted alone (no tuple per entry; the log's runs of keys,
    each change set's in key order, merge fast), their values looked up after."""
    keys = sorted(entries)
    flat: list[bytes] = [b""] * (2 * len(keys))
    flat[0::2] = keys
    flat[1::2] = map(entries.__getitem__, keys)
    return flat


def _merged(kg: int, frame: MaterializedFrame, puts: dict[bytes, bytes]) -> MaterializedFrame:
    """Key group ``kg``'s ``frame`` with the log's ``puts`` applied, its digest adjusted. A frame in key order
    (an lmdb table's) is updated where the log's keys sort in it, found by bisection: the work follows the log
    (bounded), not the frame (the whole key group), and the keys new since the materialization (few) go where
    they sort, so the key group is still appended in one write. A heap table's frame (insertion order) keeps
    its order."""
    keys = frame.flat[0::2]
    if not ascending(keys):
        return _merged_unordered(kg, frame, puts)
    flat = frame.flat.copy()  # a copy of the pointers only (one C loop): the frame stays as it was
    put_keys = sorted(puts)
    put_values = list(map(puts.__getitem__, put_keys))
    at = list(map(bisect_left, repeat(keys), put_keys))
    keys.append(b"")  # what a key sorting after the last is compared with: no state key is empty (a state id starts it)
    found = list(map(eq, map(keys.__getitem__, at), put_keys))
    slots = [2 * i + 1 for i in compress(at, found)]
    replaced = list(compress(put_keys, found))
    olds = list(map(flat.__getitem__, slots))
    deque(map(flat.__setitem__, slots, compress(put_values, found)), maxlen=0)
    digest = None
    if frame.digest is not None:
        prefix = U16.pack(kg)
        digest = (frame.digest - key_group_digest(prefix, replaced, olds)
                  + key_group_digest(prefix, put_keys, put_values)) & MASK64
    if len(replaced) == len(put_keys):
        return MaterializedFrame(flat, frame.maps, digest)
    new = list(map(not_, found))
    added = _inserted(flat, list(compress(put_keys, new)), list(compress(put_values, new)), list(compress(at, new)))
    return MaterializedFrame(added, frame.maps, digest)


def _inserted(flat: list[bytes], keys: list[bytes], values: list[bytes], at: list[int]) -> list[bytes]:
    """``flat`` (``[key, value, ...]``, keys sorted) with ``keys`` (sorted, none of them in ``flat``) and their
    ``values`` inserted before the entries at positions ``at`` (where they sort): one slice copy per key added."""
    out: list[bytes] = []
    start = 0
    for key, value, pos in zip(keys, values, at, strict=True):
        out += flat[2 * start:2 * pos]
        out += (key, value)
        start = pos
    out += flat[2 * start:]
    return out


def _merged_unordered(kg: int, frame: MaterializedFrame, puts: dict[bytes, bytes]) -> MaterializedFrame:
    """:func:`_merged` of a frame in insertion order (a heap table's): the frame's keys first, in its order, values
    as the log left them, then the keys the log added, in the log's order."""
    merged = dict(zip(frame.flat[0::2], frame.flat[1::2], strict=True))
    digest = None if frame.digest is None else _merged_digest(kg, frame.digest, merged, puts)
    merged.update(puts)
    return MaterializedFrame(_flat(merged), frame.maps, digest)


def _merged_digest(kg: int, digest: int, entries: dict[bytes, bytes], puts: dict[bytes, bytes]) -> int:
    """The digest of key group ``kg``'s ``entries`` (whose digest is ``digest``) once ``puts`` are applied:
    the replaced entries' hashes taken out, the puts' added, each hashed once (in C loops)."""
    prefix, keys = U16.pack(kg), list(puts)
    olds = list(map(entries.get, keys))
    present = list(map(is_not, olds, repeat(None)))
    replaced = key_group_digest(prefix, list(compress(keys, present)), list(compress(olds, present)))  # type: ignore[arg-type]
    return (digest - replaced + key_group_digest(prefix, keys, list(puts.values()))) & MASK64


def fold(logged: Records) -> tuple[dict[bytes, bytes], list[bytes]]:
    """The effect of ``PUT`` / ``DELETE`` records ``logged`` (in log order): (each key's last value, if its last
    change puts it; every key deleted at some point, each once, to delete before the puts)."""
    ops, keys, values = logged[0::3], logged[1::3], logged[2::3]
    puts: dict[bytes, bytes] = {}
    deleted: dict[bytes, None] = {}
    start = 0
    while True:  # the puts between two deletes in one C loop each (the last put of a key wins)
        try:
            at = ops.index(DELETE, start)
        except ValueError:
            at = len(ops)
        puts.update(zip(keys[start:at], values[start:at], strict=True))
        if at == len(ops):
            return puts, list(deleted)
        puts.pop(keys[at], None)
        deleted[keys[at]] = None
        start = at + 1


def remapped_records(records: Records, remap: Mapping[bytes, bytes]) -> Records:
    """``records`` with their keys' state ids mapped by ``remap`` (in place; a change set written by another
    registry)."""
    records[1::3] = remapped_keys(records[1::3], remap)
    return records


# -- reading ahead --------------------------------------------------------------------------------------------
def _change_set(storage: RangeReader, handle: ChangeSetHandle, part: Offsets, remap: Mapping[bytes, bytes],
                context: str) -> Iterator[tuple[int, Records]]:
    """(key group, its records with their state ids mapped by ``remap``) of the key groups ``part`` of a change
    set: read here (a reading thread), decoded as the applying thread consumes them."""
    read = read_change_set(storage, handle, context, part, read_now=True)
    return ((kg, remapped_records(records, remap)) for kg, records in read) if remap else read


def _key_groups(storage: RangeReader, handle: KeyGroupsHandle, part: Offsets,
                context: str) -> Iterator[tuple[int, list[bytes], int | None]]:
    return read_key_group_frames(storage, handle, context, part, read_now=True)


def part_count(log_bytes: int, change_sets: int) -> int:
    """Into how many parts a restore splits its key groups for a log of ``log_bytes`` in ``change_sets``
    change sets: about :data:`PART_LOG_BYTES` of log each, while each part of a change set is read in at least
    :data:`MIN_READ_BYTES` (at least one part; :func:`_split` caps it at :data:`MAX_PARTS`)."""
    return max(1, min(-(-log_bytes // PART_LOG_BYTES), log_bytes // max(1, change_sets * MIN_READ_BYTES)))


def _split(owned: range, parts: int) -> list[range]:
    """``owned`` in up to ``parts`` (at most :data:`MAX_PARTS`) contiguous ranges of about equal length."""
    n = max(1, min(parts, MAX_PARTS, len(owned)))
    bounds = [owned.start + len(owned) * k // n for k in range(n + 1)]
    return [range(a, b) for a, b in zip(bounds, bounds[1:], strict=False)]


def _within(offsets: Mapping[int, tuple[int, int]], part: range) -> Offsets:
    """The key groups of ``offsets`` in ``part``, in the order of their offsets (their order in the file)."""
    return dict(sorted(((kg, at) for kg, at in offsets.items() if kg in part), key=lambda x: x[1][0]))


def _span(offsets: Offsets) -> int:
    return sum(n for _o, n in offsets.values())


def _chunks(offsets: Offsets) -> Iterator[Offsets]:
    """``offsets`` (in file order) in parts of about :data:`CHUNK_BYTES`."""
    part: Offsets = {}
    size = 0
    for kg, (offset, length) in offsets.items():
        part[kg] = (offset, length)
        size += length
        if size >= CHUNK_BYTES:
            yield part
            part, size = {}, 0
    if part:
        yield part
