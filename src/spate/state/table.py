"""The interface every state table implements (``heap`` and ``lmdb``).

Tables store bytes. Value-like states keep one entry per (key group, primary); map states and timers keep
one entry per user key under their primary. See :mod:`spate.state.layout`.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Protocol


class TableView(Protocol):
    """What a snapshot reads: the flat entries of one key group."""

    def key_group_flat(self, kg: int) -> list[bytes]: ...


class StateTable(ABC):
    """Byte-level storage of one subtask's keyed state, addressed by key group."""

    kind: str

    @abstractmethod
    def get(self, kg: int, primary: bytes) -> bytes | None: ...

    @abstractmethod
    def put(self, kg: int, primary: bytes, value: bytes) -> None: ...

    def put_existed(self, kg: int, primary: bytes, value: bytes) -> bool:
        """``put``, and whether an entry was there before (the changelog asks; lmdb knows it for free)."""
        existed = self.get(kg, primary) is not None
        self.put(kg, primary, value)
        return existed

    def append(self, kg: int, primary: bytes, data: bytes) -> None:
        """Append ``data`` to the value at ``primary`` (list state adds elements this way)."""
        old = self.get(kg, primary)
        self.put(kg, primary, old + data if old else data)

    def get_many(self, kgs: Sequence[int], primaries: Sequence[bytes]) -> list[bytes | None]:
        """The values at many (key group, primary) pairs (bulk state reads)."""
        get = self.get
        return [get(kg, p) for kg, p in zip(kgs, primaries, strict=True)]

    def put_many(self, entries: Sequence[tuple[int, bytes, bytes]]) -> None:
        """Put many (key group, primary, value) entries (bulk state writes)."""
        put = self.put
        for kg, primary, value in entries:
            put(kg, primary, value)

    def put_many_existed(self, entries: Sequence[tuple[int, bytes, bytes]]) -> list[bool]:
        """``put_many``, and per entry whether it existed just before its own put (the changelog asks; lmdb knows
        it from the put itself, other tables look the entries up first)."""
        if not entries:
            return []
        kgs, primaries, _values = zip(*entries, strict=True)
        found = self.get_many(kgs, primaries)
        self.put_many(entries)
        existed = [v is not None for v in found]
        if len(set(zip(kgs, primaries, strict=True))) < len(entries):  # a key put twice existed at its second put
            seen: set[tuple[int, bytes]] = set()
            for i, key in enumerate(zip(kgs, primaries, strict=True)):
                existed[i] = existed[i] or key in seen
                seen.add(key)
        return existed

    @abstractmethod
    def delete(self, kg: int, primary: bytes) -> None:
        """Remove a value entry, or every user-key entry of a map primary."""

    @abstractmethod
    def map_get(self, kg: int, primary: bytes, user_key: bytes) -> bytes | None: ...

    @abstractmethod
    def map_put(self, kg: int, primary: bytes, user_key: bytes, value: bytes) -> None: ...

    def map_put_existed(self, kg: int, primary: bytes, user_key: bytes, value: bytes) -> bool:
        """``map_put``, and whether the entry was there before."""
        existed = self.map_get(kg, primary, user_key) is not None
        self.map_put(kg, primary, user_key, value)
        return existed

    @abstractmethod
    def map_delete(self, kg: int, primary: bytes, user_key: bytes) -> None: ...

    @abstractmethod
    def map_items(self, kg: int, primary: bytes) -> list[tuple[bytes, bytes]]: ...

    @abstractmethod
    def state_entries(self, kg: int, sid_prefix: bytes) -> Iterator[tuple[bytes, bytes, bytes]]:
        """Every (primary, user_key, value) of one state in one key group."""

    @abstractmethod
    def key_group_flat(self, kg: int) -> list[bytes]:
        """Every entry of a key group as ``[primary + user_key, value, ...]``."""

    def consistent_view(self) -> AbstractContextManager[TableView]:
        """A read-only view of the table as of now, for snapshots (see the implementations)."""
        return contextlib.nullcontext(self)

    @abstractmethod
    def restore_key_group(self, kg: int, flat: list[bytes], map_sids: frozenset[bytes],
                          digest: int | None = None) -> None:
        """Insert the entries of a snapshot's key group (``flat`` as from :meth:`key_group_flat`);
        keys whose state-id prefix is in ``map_sids`` are map entries or timers. ``digest``: the entries'
        integrity digest as the snapshot carries it (a table that keeps a digest adds it instead of hashing
        them; None: not known)."""

    @abstractmethod
    def get_meta(self, name: str) -> bytes | None: ...

    @abstractmethod
    def put_meta(self, name: str, value: bytes) -> None: ...

    def commit(self) -> None:
        """Make every write so far durable in the table (lmdb commits; the heap has nothing to do)."""

    @abstractmethod
    def approx_bytes(self) -> int: ...

    def entry_count(self) -> int | None:
        """How many state entries the table holds (values, map entries, timers; not its metadata), or None
        when that is not cheap to know (it is reported per batch)."""
        return None

    def learn_entry_count(self, count: int) -> None:
        """The table holds ``count`` entries, as the checkpoint it was restored to recorded for exactly its key
        groups: a table that cannot count them cheaply counts on from it. The others count anyway."""

    @abstractmethod
    def close(self) -> None: ...

    @abstractmethod
    def destroy(self) -> None:
        """Close and delete the table's data (used before a restore replaces it)."""


class WrappedTable(StateTable):
    """A table that forwards every call to ``inner``; subclasses override what they add to it (the changelog
    logs writes, profiling times them). Code that needs the innermost table follows ``inner``."""

    def __init__(self, inner: StateTable) -> None:
        self.inner = inner
        self.kind = inner.kind

    def get(self, kg: int, primary: bytes) -> bytes | None:
        return self.inner.get(kg, primary)

    def get_many(self, kgs: Sequence[int], primaries: Sequence[bytes]) -> list[bytes | None]:
        return self.inner.get_many(kgs, primaries)

    def put(self, kg: int, primary: bytes, value: bytes) -> None:
        self.inner.put(kg, primary, value)

    def put_existed(self, kg: int, primary: bytes, value: bytes) -> bool:
        return self.inner.put_existed(kg, primary, value)

    def put_many(self, entries: Sequence[tuple[int, bytes, bytes]]) -> None:
        self.inner.put_many(entries)

    def put_many_existed(self, entries: Sequence[tuple[int, bytes, bytes]]) -> list[bool]:
        return self.inner.put_many_existed(entries)

    def append(self, kg: int, primary: bytes, data: bytes) -> None:
        self.inner.append(kg, primary, data)

    def delete(self, kg: int, primary: bytes) -> None:
        self.inner.delete(kg, primary)

    def map_get(self, kg: int, primary: bytes, user_key: bytes) -> bytes | None:
        return self.inner.map_get(kg, primary, user_key)

    def map_put(self, kg: int, primary: bytes, user_key: bytes, value: bytes) -> None:
        self.inner.map_put(kg, primary, user_key, value)

    def map_put_existed(self, kg: int, primary: bytes, user_key: bytes, value: bytes) -> bool:
        return self.inner.map_put_existed(kg, primary, user_key, value)

    def map_delete(self, kg: int, primary: bytes, user_key: bytes) -> None:
        self.inner.map_delete(kg, primary, user_key)

    def map_items(self, kg: int, primary: bytes) -> list[tuple[bytes, bytes]]:
        return self.inner.map_items(kg, primary)

    def state_entries(self, kg: int, sid_prefix: bytes) -> Iterator[tuple[bytes, bytes, bytes]]:
        return self.inner.state_entries(kg, sid_prefix)

    def key_group_flat(self, kg: int) -> list[bytes]:
        return self.inner.key_group_flat(kg)

    def consistent_view(self) -> AbstractContextManager[TableView]:
        return self.inner.consistent_view()

    def restore_key_group(self, kg: int, flat: list[bytes], map_sids: frozenset[bytes],
                          digest: int | None = None) -> None:
        self.inner.restore_key_group(kg, flat, map_sids, digest)

    def get_meta(self, name: str) -> bytes | None:
        return self.inner.get_meta(name)

    def put_meta(self, name: str, value: bytes) -> None:
        self.inner.put_meta(name, value)

    def commit(self) -> None:
        self.inner.commit()

    def approx_bytes(self) -> int:
        return self.inner.approx_bytes()

    def entry_count(self) -> int | None:
        return self.inner.entry_count()

    def learn_entry_count(self, count: int) -> None:
        self.inner.learn_entry_count(count)

    def close(self) -> None:
        self.inner.close()

    def destroy(self) -> None:
        self.inner.destroy()


def unwrapped(table: StateTable) -> StateTable:
    """The table under every :class:`WrappedTable` around ``table`` (the changelog's, the profiler's): what holds
    the entries."""
    while isinstance(table, WrappedTable):
        table = table.inner
    return table
