"""State change records and the change set that collects them between two sequence numbers.

Records mirror the table operations, so replay is the same operation on any table kind. Within a change set
that has not been uploaded yet, repeated changes to one entry are coalesced: a key updated 100 times between
checkpoints is logged once (the blog's space amplification comes from not doing this).
"""

from __future__ import annotations

from collections.abc import Sequence

from spate.state.layout import primary_length
from spate.state.table import StateTable

PUT, DELETE, MAP_PUT, MAP_DELETE, APPEND = 1, 2, 3, 4, 5


class ChangeSet:
    """Changes of one subtask since the last sequence number, per key group, coalesced per entry."""

    def __init__(self, coalesce: bool = True) -> None:
        self.coalesce = coalesce
        self._seq = 0  # without coalescing every record gets its own slot
        self._groups: dict[int, dict[bytes, tuple[int, bytes]]] = {}
        self._map_primaries: dict[int, set[bytes]] = {}
        self.size = 0  # bytes of the pending records (after coalescing)

    def __bool__(self) -> bool:
        return bool(self._groups)

    def put(self, kg: int, primary: bytes, value: bytes) -> None:
        self._set(kg, primary, PUT, value)

    def put_many(self, entries: Sequence[tuple[int, bytes, bytes]]) -> None:
        """``put`` of each (key group, primary, value)."""
        if not self.coalesce:
            for kg, primary, value in entries:
                self._set(kg, primary, PUT, value)
            return
        groups, size = self._groups, self.size
        for kg, key, value in entries:
            group = groups.get(kg)
            if group is None:
                group = groups[kg] = {}
            else:
                prev = group.pop(key, None)  # re-insert at the end: replay order = order of last change
                if prev is not None:
                    size -= len(key) + len(prev[1]) + 3
            group[key] = (PUT, value)
            size += len(key) + len(value) + 3
        self.size = size

    def append(self, kg: int, primary: bytes, data: bytes) -> None:
        group = self._groups.get(kg)
        prev = group.get(primary) if group is not None and self.coalesce else None
        if prev is None:
            self._set(kg, primary, APPEND, data)
        elif prev[0] == DELETE:
            self._set(kg, primary, PUT, data)
        else:  # PUT or APPEND: extend what is pending
            self._set(kg, primary, prev[0], prev[1] + data)

    def delete(self, kg: int, primary: bytes) -> None:
        maps = self._map_primaries.get(kg)
        if maps and primary in maps and self.coalesce:  # the delete covers pending map entries of this primary
            maps.discard(primary)
            group = self._groups[kg]
            for key in [k for k in group if k.startswith(primary)]:
                self.size -= len(key) + len(group.pop(key)[1]) + 3
        self._set(kg, primary, DELETE, b"")

    def map_put(self, kg: int, primary: bytes, user_key: bytes, value: bytes) -> None:
        self._map_primaries.setdefault(kg, set()).add(primary)
        self._set(kg, primary + user_key, MAP_PUT, value)

    def map_delete(self, kg: int, primary: bytes, user_key: bytes) -> None:
        self._map_primaries.setdefault(kg, set()).add(primary)
        self._set(kg, primary + user_key, MAP_DELETE, b"")

    def _set(self, kg: int, key: bytes, op: int, value: bytes) -> None:
        if not self.coalesce:
            self._seq += 1
            key = key + b"\x00" + self._seq.to_bytes(8, "big")  # a unique slot; stripped in records()
        group = self._groups.get(kg)
        if group is None:
            group = self._groups[kg] = {}
        else:
            prev = group.pop(key, None)  # re-insert at the end: replay order = order of last change
            if prev is not None:
                self.size -= len(key) + len(prev[1]) + 3
        group[key] = (op, value)
        self.size += len(key) + len(value) + 3

    def key_groups(self) -> list[int]:
        return sorted(self._groups)

    def records(self, kg: int) -> list[bytes | int]:
        """[op, key, value, op, key, value, ...] of one key group, in replay order."""
        out: list[bytes | int] = []
        for key, (op, value) in self._groups[kg].items():
            out += (op, key if self.coalesce else key[:-9], value)
        return out


def replay(table: StateTable, kg: int, records: list, remap: dict[bytes, bytes] | None = None) -> int:
    """Apply ``records`` (as from :meth:`ChangeSet.records`) of key group ``kg`` to ``table``."""
    if records and all(op == PUT for op in records[0::3]):  # common case: bulk insert, no per-record dispatch
        keys = records[1::3]
        if remap:
            keys = [remap.get(k[:2], k[:2]) + k[2:] for k in keys]
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

