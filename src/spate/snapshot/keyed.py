"""Full snapshots of a subtask's keyed state, written key group by key group, and their readers."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from itertools import chain

import msgpack

from spate.errors import CorruptFileError
from spate.frames import Frame, FrameKind, RangeReader, frame_parts, read_span_frames
from spate.fs import CheckpointStorage
from spate.heap import bulk_phase
from spate.segments import SegmentWriter
from spate.snapshot.handles import KeyGroupsHandle
from spate.state.descriptors import MAP
from spate.state.keyed import KeyedStateBackend, StateMeta
from spate.state.layout import U16, primary_length
from spate.state.lmdb_digest import key_group_digest
from spate.state.table import StateTable, TableView
from spate.state.timers import RESERVED_SIDS

ExpiryFilters = Mapping[bytes, Callable[[bytes], bytes | None]]


@dataclass(frozen=True)
class SnapshotScope:
    """What a keyed snapshot of one backend holds: its key groups, the descriptors of its states (recorded in the
    handle) and, per state-id prefix of a TTL'd state, what of a stored value is still live (as of the backend's
    ``now_ms`` when the scope was taken: :meth:`of`)."""

    key_groups: range
    metas: tuple[StateMeta, ...]
    filters: ExpiryFilters

    @staticmethod
    def of(backend: KeyedStateBackend) -> SnapshotScope:
        """The scope of a snapshot of ``backend`` taken now."""
        return SnapshotScope(backend.key_groups, tuple(backend.state_metas), expiry_filters(backend))


def write_keyed_snapshot(backend: KeyedStateBackend, out: SegmentWriter,
                         compress: bool = False) -> KeyGroupsHandle | None:
    """Write every live entry of ``backend`` as one logical file; None if there is no keyed state at all.

    What has expired (TTL) is left out of the snapshot and then removed from the live table too."""
    table = backend.table
    table.commit()
    expired: list[tuple[int, bytes, bytes | None]] = []
    with bulk_phase(), table.consistent_view() as view:
        handle = write_key_groups(view, SnapshotScope.of(backend), out, compress=compress, expired=expired)
    _purge(table, expired)
    return handle


def expiry_filters(backend: KeyedStateBackend) -> dict[bytes, Callable[[bytes], bytes | None]]:
    """Per state-id prefix of a TTL'd state: what of a stored value is still live at ``backend.now_ms``."""
    return {U16.pack(m.sid): f for m in backend.state_metas if (f := backend.expiry_filter(m.sid))}


def write_key_groups(view: TableView, scope: SnapshotScope, out: SegmentWriter, *, compress: bool = False,
                     expired: list[tuple[int, bytes, bytes | None]] | None = None) -> KeyGroupsHandle | None:
    """Write the key groups of ``scope`` from ``view`` as a keyed snapshot file (works from any thread for a view
    that is consistent); expired data is left out and, if ``expired`` is given, noted there. The frames are
    written as they are made: the snapshot is never whole in memory."""
    dropped: list[tuple[int, bytes, bytes | None]] = [] if expired is None else expired
    filters = scope.filters

    def parts_of(kg: int) -> tuple[bytes, ...]:
        flat = view.key_group_flat(kg)
        if filters and flat:
            flat = _drop_expired(kg, flat, filters, dropped)
        return key_group_frame_parts(kg, flat, compress) if flat else ()

    def frames() -> Iterator[tuple[int, tuple[bytes, ...]]]:
        for kg in scope.key_groups:
            parts = parts_of(kg)
            if parts:
                yield kg, parts
            parts = ()  # not kept while the next key group is read and framed

    return write_frames(frames(), scope, out)


def key_group_frame(kg: int, flat: list[bytes], compress: bool = False) -> bytes:
    """The snapshot frame of key group ``kg`` holding ``flat`` ([key, value, ...], keys without the key-group
    prefix), with the key group's digest."""
    return b"".join(key_group_frame_parts(kg, flat, compress))


def key_group_frame_parts(kg: int, flat: list[bytes], compress: bool = False) -> tuple[bytes, bytes]:
    """:func:`key_group_frame` as (header, payload)."""
    digest = key_group_digest(U16.pack(kg), flat[0::2], flat[1::2])
    return frame_parts(FrameKind.KEY_GROUP, msgpack.packb([kg, flat, digest], use_bin_type=True), compress)


def write_frames(frames: Iterable[tuple[int, tuple[bytes, ...]]], scope: SnapshotScope,
                 out: SegmentWriter) -> KeyGroupsHandle | None:
    """Write the key groups' frames (``(kg, the frame's parts)`` in key-group order, empty key groups left out)
    of ``scope`` as one keyed snapshot file; None if there are none. Each frame is let go as soon as it is
    written: one key group of a large state is tens of MB, and the next is made meanwhile."""
    offsets: dict[int, tuple[int, int]] = {}

    def placed() -> Iterator[bytes]:
        pos = 0
        for kg, parts in frames:
            length = sum(map(len, parts))
            offsets[kg] = (pos, length)
            pos += length
            yield from parts
            parts = ()

    made = placed()
    first = next(made, None)
    if first is None:
        return None
    ref = out.write_parts(chain((first,), made))
    key_groups = scope.key_groups
    return KeyGroupsHandle(ref.path, key_groups.start, key_groups.stop - 1, offsets, ref.length,
                           tuple(m.to_dict() for m in scope.metas), ref.offset)


def _drop_expired(kg: int, flat: list[bytes], filters: ExpiryFilters,
                  expired: list[tuple[int, bytes, bytes | None]]) -> list[bytes]:
    """``flat`` without expired data; every entry that changed is noted in ``expired`` (new value or None)."""
    out: list[bytes] = []
    for i in range(0, len(flat), 2):
        key, value = flat[i], flat[i + 1]
        f = filters.get(key[:2])
        if f is not None:
            live = f(value)
            if live is not value:
                expired.append((kg, key, live))
            if live is None:
                continue
            value = live
        out += (key, value)
    return out


def _purge(table: StateTable, expired: list[tuple[int, bytes, bytes | None]]) -> None:
    """Apply what the snapshot left out to the live table, so expired state does not pile up."""
    for kg, key, live in expired:
        plen = primary_length(key)
        if plen < len(key):
            table.map_delete(kg, key[:plen], key[plen:])
        elif live is None:
            table.delete(kg, key)
        else:
            table.put(kg, key, live)


def read_key_groups(storage: RangeReader, handle: KeyGroupsHandle, context: str = "",
                    only: Mapping[int, tuple[int, int]] | None = None) -> Iterator[tuple[int, list[bytes]]]:
    """Yield (key group, [flat key, value, flat key, value, ...]) for every key group of ``handle`` (or only
    those of ``only``, a part of its offsets), verifying each frame's checksum. One ranged read fetches their
    span of the file."""
    for kg, flat, _digest in read_key_group_frames(storage, handle, context, only):
        yield kg, flat


def read_key_group_frames(storage: RangeReader, handle: KeyGroupsHandle, context: str = "",
                          only: Mapping[int, tuple[int, int]] | None = None, *, read_now: bool = False,
                          ) -> Iterator[tuple[int, list[bytes], int | None]]:
    """As :func:`read_key_groups`, each key group with the digest its frame carries
    (:func:`~spate.state.lmdb_digest.key_group_digest`; None in frames written before spate carried it).

    The frames are read and decoded as the result is consumed; with ``read_now`` every frame is read and verified
    before this returns, and only the decoding is left to the thread that consumes the result. A restore reads in
    threads and decodes where it applies: the entries are allocated by the thread that keeps them, and a reading
    thread never holds the GIL through a decode while the applying thread waits for it (docs/benchmarks.md)."""
    offsets = handle.offsets if only is None else only
    if not offsets:
        return iter(())
    where, frames = read_span_frames(storage, handle.path, offsets, FrameKind.KEY_GROUP, context,
                                     handle.file_offset)
    return _key_group_entries(handle, where, list(frames) if read_now else frames, only)


def _key_group_entries(handle: KeyGroupsHandle, where: str, frames: Iterable[Frame],
                       only: Mapping[int, tuple[int, int]] | None) -> Iterator[tuple[int, list[bytes], int | None]]:
    for fr in frames:
        kg, flat, digest = _key_group_payload(fr.payload, where, fr.offset)
        if handle.offsets.get(kg, (None,))[0] != fr.offset:
            if handle.start <= kg <= handle.end:
                raise CorruptFileError(f"{where}: key group {kg} found at offset {fr.offset}, where the "
                                       "checkpoint metadata does not expect it")
            continue
        if only is None or kg in only:
            yield kg, flat, digest


def _key_group_payload(payload: bytes | memoryview, where: str, offset: int) -> tuple[int, list[bytes], int | None]:
    """``[kg, flat, digest]``, or ``[kg, flat]`` as written before the digest was carried."""
    fields = msgpack.unpackb(payload, raw=False)
    if not isinstance(fields, list) or len(fields) not in (2, 3):
        raise CorruptFileError(f"{where} at offset {offset}: a key-group frame that is not [key group, entries] "
                               "or [key group, entries, digest] (written by a newer spate? upgrade spate)")
    return fields[0], fields[1], fields[2] if len(fields) == 3 else None


def sid_remap(backend: KeyedStateBackend, states: tuple[dict, ...]) -> dict[bytes, bytes]:
    """State-id prefixes of a snapshot's writer → this backend's (registering states it does not know)."""
    remap = {}
    for m in states:
        meta = StateMeta.from_dict(m)
        local = backend.adopt(meta)
        if local != meta.sid:
            remap[U16.pack(meta.sid)] = U16.pack(local)
    return remap


def map_sids(backend: KeyedStateBackend, states: tuple[dict, ...]) -> frozenset[bytes]:
    """This backend's state-id prefixes of the map states of a snapshot's registry ``states``, and the timers'
    (what :meth:`~spate.state.table.StateTable.restore_key_group` stores as map entries)."""
    return frozenset([U16.pack(backend.adopt(StateMeta.from_dict(m))) for m in states
                      if m["kind"] == MAP] + [U16.pack(sid) for sid in RESERVED_SIDS])


def restore_keyed_snapshot(backend: KeyedStateBackend, storage: CheckpointStorage,
                           handle: KeyGroupsHandle, context: str = "") -> int:
    """Insert the entries of ``handle`` that fall in the backend's key groups; returns entries restored."""
    return _restore_digested(backend, handle.states, read_key_group_frames(storage, handle, context))


def restore_key_groups(backend: KeyedStateBackend, states: tuple[dict, ...],
                       groups: Iterable[tuple[int, list[bytes]]]) -> int:
    """Insert ``groups`` ((key group, flat entries) written by a table whose state registry is ``states``) that
    fall in the backend's key groups, its state ids mapped to the backend's; returns entries restored."""
    return _restore_digested(backend, states, ((kg, flat, None) for kg, flat in groups))


def _restore_digested(backend: KeyedStateBackend, states: tuple[dict, ...],
                      groups: Iterable[tuple[int, list[bytes], int | None]]) -> int:
    """:func:`restore_key_groups` of key groups with the digest their frame carried (None: not known)."""
    remap = sid_remap(backend, states)
    maps = map_sids(backend, states)
    table, owned, count = backend.table, backend.key_groups, 0
    with bulk_phase():
        for kg, flat, digest in groups:
            if kg not in owned:
                continue
            table.restore_key_group(kg, remapped(flat, remap), maps, None if remap else digest)
            count += len(flat) // 2
    return count


def remapped(flat: list[bytes], remap: Mapping[bytes, bytes]) -> list[bytes]:
    """``flat`` with its keys' state ids mapped by ``remap`` (in place; a digest of the entries no longer
    holds where it is not empty)."""
    if remap:
        flat[0::2] = remapped_keys(flat[0::2], remap)
    return flat


def remapped_keys(keys: list[bytes], remap: Mapping[bytes, bytes]) -> list[bytes]:
    """``keys`` (state id, then the rest) with their state ids mapped by ``remap`` (ids it does not name kept)."""
    return [remap.get(k[:2], k[:2]) + k[2:] for k in keys]
