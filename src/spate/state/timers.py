"""Timers per key and namespace, in event time and processing time.

The table is the source of truth (timers are entries under reserved state ids, so snapshots, restores and
rescaling treat them like any other keyed state); an in-memory heap per time domain is an index built
from the table when a timer is first used, so firing in timestamp order is O(log n) per timer. Built then, not when
the backend opens: a backend that only writes a restore's entries (and a table whose base is still being checked)
reads no timer.
"""

from __future__ import annotations

import builtins
import heapq
import struct
from collections.abc import Iterator
from typing import Any

from spate.errors import StateAccessError
from spate.serde import decode_key, encode_key
from spate.state.key_scope import KeyScope
from spate.state.layout import U16, length_prefixed, split_primary

EVENT_TIME = "event"
PROCESSING_TIME = "processing"
TIMER_SIDS = {EVENT_TIME: 0xFFF0, PROCESSING_TIME: 0xFFF1}
RESERVED_SIDS = frozenset(TIMER_SIDS.values())
_TS = struct.Struct(">Q")
_BIAS = 1 << 63  # timestamps are signed; biased big-endian bytes sort like the numbers


def _ts_bytes(ts: int) -> bytes:
    return _TS.pack(ts + _BIAS)


class TimerService:
    """Register, delete, list and fire timers of one subtask."""

    def __init__(self, backend: KeyScope) -> None:
        self._b = backend
        self._prefix = {dom: U16.pack(sid) for dom, sid in TIMER_SIDS.items()}
        self._heaps: dict[str, list[tuple[int, int, bytes]]] | None = None  # built at first use

    def _heap(self, domain: str) -> list[tuple[int, int, bytes]]:
        if self._heaps is None:
            self.rebuild()
            assert self._heaps is not None
        return self._heaps[domain]

    def rebuild(self) -> None:
        """Re-create the in-memory index from the table."""
        table = self._b.table
        heaps = {}
        for dom, prefix in self._prefix.items():
            heap = []
            for kg in self._b.key_groups:
                for primary, uk, _ in table.state_entries(kg, prefix):
                    heap.append((_TS.unpack(uk)[0] - _BIAS, kg, primary))
            heapq.heapify(heap)
            heaps[dom] = heap
        self._heaps = heaps

    def _primary(self, domain: str, namespace: Any) -> bytes:
        if self._b._kg < 0:
            raise StateAccessError("timers belong to a key: register and delete them in process() or on_timer() "
                                   "(or for many keys at once with ctx.bulk_timers())")
        return self.primary_of(domain, self._b._key_part, namespace)

    def primary_of(self, domain: str, key_part: bytes, namespace: Any = None) -> bytes:
        """The primary of a key's timers (``key_part``: the key's length-prefixed bytes) in ``namespace``."""
        ns = length_prefixed(b"" if namespace is None else encode_key(namespace))
        return self._prefix[self._domain(domain)] + key_part + ns

    def register(self, domain: str, timestamp: int, namespace: Any = None) -> None:
        """Register a timer for the current key at ``timestamp`` (ms); registering twice keeps one."""
        self.register_at(domain, timestamp, self._b._kg, self._primary(domain, namespace))

    def register_at(self, domain: str, timestamp: int, kg: int, primary: bytes) -> None:
        """Register a timer of the key whose timer primary (:meth:`primary_of`) is ``primary``."""
        if not isinstance(timestamp, int) or isinstance(timestamp, bool):
            raise StateAccessError(f"timer timestamp must be an int (ms), got {timestamp!r}: pass epoch milliseconds "
                                   "as an int")
        heap = self._heap(domain)  # built before the put: the table's timers, without this one
        self._b.table.map_put(kg, primary, _ts_bytes(timestamp), b"")
        heapq.heappush(heap, (timestamp, kg, primary))
        self._b.dirty = True

    def delete(self, domain: str, timestamp: int, namespace: Any = None) -> None:
        """Delete the current key's timer at ``timestamp`` (no error if there is none)."""
        self.delete_at(timestamp, self._b._kg, self._primary(domain, namespace))

    def delete_at(self, timestamp: int, kg: int, primary: bytes) -> None:
        self._b.table.map_delete(kg, primary, _ts_bytes(timestamp))
        self._b.dirty = True

    def list(self, domain: str, namespace: Any = None) -> list[int]:
        """The current key's timers, in timestamp order."""
        return self.list_at(self._b._kg, self._primary(domain, namespace))

    def list_at(self, kg: int, primary: bytes) -> builtins.list[int]:
        return sorted(_TS.unpack(uk)[0] - _BIAS for uk, _ in self._b.table.map_items(kg, primary))

    def earliest(self, domain: str) -> int | None:
        """The earliest timer of ``domain`` (a lower bound: a deleted timer stays in the index until its time
        comes), None without one."""
        heap = self._heap(self._domain(domain))
        return heap[0][0] if heap else None

    def pop_due(self, domain: str, up_to: int) -> Iterator[tuple[int, Any]]:
        """Remove and yield (timestamp, namespace) of every timer ≤ ``up_to`` in timestamp order, with the
        backend's current key set to the timer's key. Timers registered meanwhile are included."""
        heap, b = self._heap(domain), self._b
        while heap and heap[0][0] <= up_to:
            ts, kg, primary = heapq.heappop(heap)
            uk = _ts_bytes(ts)
            if b.table.map_get(kg, primary, uk) is None:
                continue  # deleted, or a duplicate registration already fired
            b.table.map_delete(kg, primary, uk)
            b.dirty = True
            _sid, key_bytes, ns = split_primary(primary)
            b.set_current_key_encoded(kg, key_bytes)
            yield ts, (decode_key(ns) if ns else None)

    def take_due(self, domain: str, up_to: int) -> builtins.list[tuple[int, int, bytes, bytes]]:
        """Remove every timer ≤ ``up_to`` and return them as (timestamp, key group, key bytes, namespace bytes),
        in timestamp order (bulk firing: the current key is left alone)."""
        heap, table = self._heap(domain), self._b.table
        due = []
        while heap and heap[0][0] <= up_to:
            ts, kg, primary = heapq.heappop(heap)
            uk = _ts_bytes(ts)
            if table.map_get(kg, primary, uk) is None:
                continue  # deleted, or a duplicate registration already taken
            table.map_delete(kg, primary, uk)
            _sid, key_bytes, ns = split_primary(primary)
            due.append((ts, kg, key_bytes, ns))
        if due:
            self._b.dirty = True
        return due

    def fire_then_delete(self, domain: str, up_to: int) -> Iterator[tuple[int, Any]]:
        """Spark's order (transformWithState): the timers ≤ ``up_to`` when firing begins, in timestamp order, each
        yielded with the backend's current key set to its key while it is still registered (its handler lists
        it, and may delete or re-register it) and deleted once the consumer asks for the next one. The list is
        fixed when firing begins, as Spark reads it: a timer an earlier handler deleted still fires, and one
        registered meanwhile fires in a later batch."""
        heap, b = self._heap(domain), self._b
        due: list[tuple[int, int, bytes]] = []
        while heap and heap[0][0] <= up_to:
            entry = heapq.heappop(heap)
            ts, kg, primary = entry
            if (not due or due[-1] != entry) and b.table.map_get(kg, primary, _ts_bytes(ts)) is not None:
                due.append(entry)  # a timer registered twice is one timer
        for ts, kg, primary in due:
            _sid, key_bytes, ns = split_primary(primary)
            b.set_current_key_encoded(kg, key_bytes)
            yield ts, (decode_key(ns) if ns else None)
            b.table.map_delete(kg, primary, _ts_bytes(ts))
            b.dirty = True

    @staticmethod
    def _domain(domain: str) -> str:
        if domain not in TIMER_SIDS:
            raise StateAccessError(f"unknown time domain {domain!r}: use 'event' or 'processing'")
        return domain
