"""State change records and the change set that collects them between two sequence numbers.

Records mirror the table operations, so replay is the same operation on any table kind. Within a change set
that has not been uploaded yet, repeated changes to one entry are coalesced: a key updated 100 times between
checkpoints is logged once (the blog's space amplification comes from not doing this).

Coalescing beyond Flink: an entry created and removed within one change set leaves no record at all, so a
window created, updated and purged between two uploads never reaches the changelog.

How. A change set ``k`` is replayed onto the state its sequence number starts from: the materialized snapshot
(taken atomically with sequence number ``m <= k``) plus change sets ``m .. k-1`` replayed, or, for the first
change set of a restored subtask's new log, the restored state. That is exactly the live table at the moment
change set ``k`` opened (the previous one closed at a checkpoint, a pre-emptive upload or a materialization),
and for an entry the change set holds no record of it is still the live table now: every change since went
through this change set. ("The last upload" is therefore the last sequence-number boundary, not the last
checkpoint.) So when a change set first touches an entry (``put``, ``put_many``, ``append``, ``map_put``),
:class:`~spate.changelog.table.ChangelogTable` learns whether it was there just before the write (from the
write itself where the table knows it, as lmdb's replace does, else by a lookup before writing), and the
record remembers whether it was absent (``new``); a change to an entry with a pending record asks nothing. A
closed change set is never changed again (it may be uploading while later changes go to the next one), and each
one asks about its own first touches, so the flag always refers to its own starting state. Only absence matters, and the
live table never lacks an entry its replay base has (a materialization may leave out expired entries, never
add any); an expired entry still in the table counts as existing, which only keeps a tombstone. Then:

* ``delete`` / ``map_delete`` of an entry whose record is ``new`` removes the record: replay starts without
  the entry and must end without it, so nothing needs to be said (an ``append`` to a ``new`` entry is logged
  as ``put``, which is the same there);
* ``delete`` of a map primary removes the primary's pending map entries (the delete covers them, as in any
  change set) and writes no tombstone if all of them were ``new``, the change set has no record of the
  primary itself, and the table holds nothing else under it (one ``map_items``, before deleting, only in
  that case): then the primary held nothing when the change set opened. This is ``MapState.clear()``;
  ``ListState.clear()`` and the value kinds are a plain ``delete``;
* a record that is not ``new`` (the entry existed, or was not looked up) is coalesced as before and keeps its
  tombstone, so an entry created before an upload and deleted after it is deleted on replay.

Replay order is unaffected: a dropped record changed nothing the remaining records depend on (a covering
primary delete that stays, before or after it, only removes more). Without coalescing nothing is looked up
and every record is kept.

What remains in the log: an entry that outlives an upload (a window spanning a checkpoint, or a pre-emptive
upload past ``preemptive_threshold``, or a materialization, in between) is logged in both change sets and
deleted by a tombstone; a delete of an entry the change set has no record of is logged even if it deletes
nothing (``clear()`` of a state never written: a value delete and a whole-map delete look alike to the table,
so telling a no-op from a real one would cost a scan); so is a ``map_delete`` of a user key never put; and a
map primary cleared while it holds entries older than the change set keeps its tombstone (it must: replay
has to remove them).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import repeat
from operator import itemgetter

from spate.snapshot.keyed import remapped_keys
from spate.state.layout import primary_length
from spate.state.table import StateTable

PUT, DELETE, MAP_PUT, MAP_DELETE, APPEND = 1, 2, 3, 4, 5
_OP, _VALUE = itemgetter(0), itemgetter(1)  # of a pending record (op, value, new)
FRAMING = 3  # bytes a record costs beyond its key and value, roughly (for ``size``)


class ChangeSet:
    """Changes of one subtask since the last sequence number, per key group, coalesced per entry.

    A pending record is ``(op, value, new)``: ``new`` says the entry did not exist when this change set first
    touched it (the caller looked it up; see the module docstring), so deleting it again needs no record."""

    def __init__(self, coalesce: bool = True) -> None:
        self.coalesce = coalesce
        self._seq = 0  # without coalescing every record gets its own slot
        # per key group: key -> (op, value, new); read (never written) by ChangelogTable to find first touches
        self.pending: dict[int, dict[bytes, tuple[int, bytes, bool]]] = {}
        self._maps: dict[int, dict[bytes, set[bytes]]] = {}  # map primary -> keys of its pending entries
        self.size = 0  # bytes of the pending records (after coalescing)

    def __bool__(self) -> bool:
        return bool(self.pending)

    def record_count(self) -> int:
        """How many records the change set holds (entries written or removed, once each with coalescing)."""
        return sum(len(group) for group in self.pending.values())

    # -- what the caller looks up first ------------------------------------------------------------------
    # A change to a key (a primary, or primary + user key) that has no record in ``pending`` is this change
    # set's first: with coalescing the caller looks the entry up and passes ``new``.
    def untouched_indices(self, entries: Sequence[tuple[int, bytes, bytes]]) -> list[int]:
        """The positions in ``entries`` (as for :meth:`put_many`) whose key has no pending record."""
        pending = self.pending
        if not self.coalesce:
            return []
        if not pending:  # the first changes after the change set opened
            return list(range(len(entries)))
        return [i for i, (kg, key, _v) in enumerate(entries) if key not in pending.get(kg, ())]

    def new_map_entries(self, kg: int, primary: bytes) -> int:
        """How many pending map entries ``primary`` has, if every one was created in this change set and there
        is no record of the primary itself; else 0. If the table holds exactly that many entries under it,
        deleting the primary needs no tombstone (pass ``fresh`` to :meth:`delete`)."""
        maps = self._maps.get(kg)
        keys = maps.get(primary) if maps is not None else None
        if not keys:
            return 0
        group = self.pending[kg]
        if primary in group or not all(group[k][2] for k in keys):
            return 0
        return len(keys)

    # -- changes --------------------------------------------------------------------------------------------
    def put(self, kg: int, primary: bytes, value: bytes, new: bool = False) -> None:
        self._set(kg, primary, PUT, value, new)

    def put_many(self, entries: Sequence[tuple[int, bytes, bytes]], new: Sequence[bool] | None = None) -> None:
        """``put`` of each (key group, primary, value); ``new[i]`` as ``put``'s ``new`` for ``entries[i]``."""
        if not self.coalesce:
            for kg, primary, value in entries:
                self._set(kg, primary, PUT, value)
            return
        groups, size = self.pending, self.size
        for (kg, key, value), fresh in zip(entries, repeat(False, len(entries)) if new is None else new, strict=True):
            group = groups.get(kg)
            if group is None:
                group = groups[kg] = {}
            else:
                prev = group.pop(key, None)  # re-insert at the end: replay order = order of last change
                if prev is not None:
                    size -= len(key) + len(prev[1]) + FRAMING
                    fresh = prev[2]  # as of the first touch
            group[key] = (PUT, value, fresh)
            size += len(key) + len(value) + FRAMING
        self.size = size

    def append(self, kg: int, primary: bytes, data: bytes, new: bool = False) -> None:
        prev = self._record(kg, primary) if self.coalesce else None
        if prev is None:  # appending to nothing is putting
            self._set(kg, primary, PUT if new and self.coalesce else APPEND, data, new)
        elif prev[0] == DELETE:
            self._set(kg, primary, PUT, data)
        else:  # PUT or APPEND: extend what is pending
            self._set(kg, primary, prev[0], prev[1] + data)

    def delete(self, kg: int, primary: bytes, fresh: bool = False) -> None:
        """Delete a value entry, or every entry of a map primary; ``fresh``: the table held only the entries
        :meth:`new_map_entries` counted under the primary (then there is no record of the primary itself)."""
        if self.coalesce:
            prev = self._record(kg, primary)
            if prev is not None and prev[2]:  # created in this change set: as if it never was
                self._drop(kg, primary)
                return
            covered = self._drop_map_entries(kg, primary)  # the delete covers them
            if fresh and covered:
                return
        self._set(kg, primary, DELETE, b"")

    def map_put(self, kg: int, primary: bytes, user_key: bytes, value: bytes, new: bool = False) -> None:
        key = primary + user_key
        self._set(kg, key, MAP_PUT, value, new)
        if self.coalesce:
            self._map_key(kg, primary, key)

    def map_delete(self, kg: int, primary: bytes, user_key: bytes) -> None:
        key = primary + user_key
        if self.coalesce:
            prev = self._record(kg, key)
            if prev is not None and prev[2]:  # created in this change set: as if it never was
                self._drop(kg, key)
                self._unmap_key(kg, primary, key)
                return
            self._map_key(kg, primary, key)
        self._set(kg, key, MAP_DELETE, b"")

    # -- bookkeeping ----------------------------------------------------------------------------------------
    def _record(self, kg: int, key: bytes) -> tuple[int, bytes, bool] | None:
        group = self.pending.get(kg)
        return group.get(key) if group is not None else None

    def _set(self, kg: int, key: bytes, op: int, value: bytes, new: bool = False) -> None:
        if not self.coalesce:
            self._seq += 1
            key = key + b"\x00" + self._seq.to_bytes(8, "big")  # a unique slot; stripped in records()
            new = False
        group = self.pending.get(kg)
        if group is None:
            group = self.pending[kg] = {}
        else:
            prev = group.pop(key, None)  # re-insert at the end: replay order = order of last change
            if prev is not None:
                self.size -= len(key) + len(prev[1]) + FRAMING
                new = prev[2]  # as of the first touch
        group[key] = (op, value, new)
        self.size += len(key) + len(value) + FRAMING

    def _drop(self, kg: int, key: bytes) -> None:
        """Forget the pending record of ``key`` (a key group left without records is forgotten too)."""
        group = self.pending[kg]
        self.size -= len(key) + len(group.pop(key)[1]) + FRAMING
        if not group:
            del self.pending[kg]

    def _map_key(self, kg: int, primary: bytes, key: bytes) -> None:
        maps = self._maps.get(kg)
        if maps is None:
            maps = self._maps[kg] = {}
        keys = maps.get(primary)
        if keys is None:
            maps[primary] = {key}
        else:
            keys.add(key)

    def _unmap_key(self, kg: int, primary: bytes, key: bytes) -> None:
        maps = self._maps[kg]
        keys = maps[primary]
        keys.discard(key)
        if not keys:
            del maps[primary]
            if not maps:
                del self._maps[kg]

    def _drop_map_entries(self, kg: int, primary: bytes) -> bool:
        """Drop the pending map entries of ``primary``; whether it had any."""
        maps = self._maps.get(kg)
        keys = maps.pop(primary, None) if maps is not None else None
        if not keys:
            return False
        if not maps:
            del self._maps[kg]
        for key in keys:
            self._drop(kg, key)
        return True

    # -- reading --------------------------------------------------------------------------------------------
    def key_groups(self) -> list[int]:
        return sorted(self.pending)

    def records(self, kg: int) -> list[bytes | int]:
        """[op, key, value, op, key, value, ...] of one key group, in replay order."""
        group = self.pending[kg]
        out: list[bytes | int] = [0] * (3 * len(group))
        out[0::3] = map(_OP, group.values())  # C loops: no Python step per record
        out[1::3] = group.keys() if self.coalesce else (key[:-9] for key in group)
        out[2::3] = map(_VALUE, group.values())
        return out


def replay(table: StateTable, kg: int, records: list, remap: dict[bytes, bytes] | None = None) -> int:
    """Apply ``records`` (as from :meth:`ChangeSet.records`) of key group ``kg`` to ``table``."""
    if records and all(op == PUT for op in records[0::3]):  # common case: bulk insert, no per-record dispatch
        keys = records[1::3]
        if remap:
            keys = remapped_keys(keys, remap)
        flat: list[bytes] = [None] * (2 * len(keys))  # type: ignore[list-item]
        flat[0::2], flat[1::2] = keys, records[2::3]
        table.restore_key_group(kg, flat, frozenset())
        return len(keys)
    n = 0
    for i in range(0, len(records), 3):
        op, key, value = records[i], records[i + 1], records[i + 2]
        if remap and (sid := remap.get(key[:2])) is not None:
            key = sid + key[2:]
        if op == PUT:
            table.put(kg, key, value)
        elif op == APPEND:
            table.append(kg, key, value)
        elif op == DELETE:
            table.delete(kg, key)
        elif op in (MAP_PUT, MAP_DELETE):
            plen = primary_length(key)
            if op == MAP_PUT:
                table.map_put(kg, key[:plen], key[plen:], value)
            else:
                table.map_delete(kg, key[:plen], key[plen:])
        else:
            raise ValueError(f"unknown state change operation {op}; written by a newer spate?")
        n += 1
    return n

