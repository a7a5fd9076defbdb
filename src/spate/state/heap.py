"""``heap`` table: dicts per key group in this process. Fastest; lives and dies with the process.

Per key group, value-like entries are one flat dict (``primary -> value``) so snapshots can stream it
without a Python-level loop; map entries and timers live in a second dict (``primary -> {user_key: value}``).
A consistent view (for asynchronous materialization) is copy-on-write per key group: a key group is copied
only if it is written before the view has read it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from itertools import chain

from spate.state.layout import primary_length
from spate.state.table import StateTable


class HeapTable(StateTable):
    """``values[kg] = {primary: value}``, ``maps[kg] = {primary: {user_key: value}}``."""

    kind = "heap"

    def __init__(self) -> None:
        self._values: dict[int, dict[bytes, bytes]] = {}
        self._maps: dict[int, dict[bytes, dict[bytes, bytes]]] = {}
        self._meta: dict[str, bytes] = {}
        self._views: list[_HeapView] = []

    def _preserve(self, kg: int) -> None:
        for view in self._views:
            view.preserve(kg)

    @contextlib.contextmanager
    def consistent_view(self) -> Iterator[_HeapView]:
        view = _HeapView(self)
        self._views.append(view)
        try:
            yield view
        finally:
            self._views.remove(view)

    def get(self, kg: int, primary: bytes) -> bytes | None:
        d = self._values.get(kg)
        return d.get(primary) if d is not None else None

    def put(self, kg: int, primary: bytes, value: bytes) -> None:
        if self._views:
            self._preserve(kg)
        d = self._values.get(kg)
        if d is None:
            d = self._values[kg] = {}
        d[primary] = value

    def delete(self, kg: int, primary: bytes) -> None:
        if self._views:
            self._preserve(kg)
        for store in (self._values, self._maps):
            d = store.get(kg)
            if d is not None:
                d.pop(primary, None)

    def map_get(self, kg: int, primary: bytes, user_key: bytes) -> bytes | None:
        d = self._maps.get(kg)
        m = d.get(primary) if d is not None else None
        return m.get(user_key) if m is not None else None

    def map_put(self, kg: int, primary: bytes, user_key: bytes, value: bytes) -> None:
        if self._views:
            self._preserve(kg)
        d = self._maps.get(kg)
        if d is None:
            d = self._maps[kg] = {}
        m = d.get(primary)
        if m is None:
            m = d[primary] = {}
        m[user_key] = value

    def map_delete(self, kg: int, primary: bytes, user_key: bytes) -> None:
        if self._views:
            self._preserve(kg)
        d = self._maps.get(kg)
        m = d.get(primary) if d is not None else None
        if m is not None:
            m.pop(user_key, None)
            if not m:
                del d[primary]  # type: ignore[union-attr]

    def map_items(self, kg: int, primary: bytes) -> list[tuple[bytes, bytes]]:
        d = self._maps.get(kg)
        m = d.get(primary) if d is not None else None
        return list(m.items()) if m else []

    def state_entries(self, kg: int, sid_prefix: bytes) -> Iterator[tuple[bytes, bytes, bytes]]:
        values = self._values.get(kg) or {}
        for primary, v in list(values.items()):
            if primary[:2] == sid_prefix:
                yield primary, b"", v
        maps = self._maps.get(kg) or {}
        for primary, m in list(maps.items()):
            if primary[:2] == sid_prefix:
                for uk, mv in list(m.items()):
                    yield primary, uk, mv

    def key_group_flat(self, kg: int) -> list[bytes]:
        return _flatten(self._values.get(kg, {}), self._maps.get(kg, {}))

    def restore_key_group(self, kg: int, flat: list[bytes], map_sids: frozenset[bytes],
                          digest: int | None = None) -> None:
        keys, values = flat[0::2], flat[1::2]
        if not map_sids:
            self._values.setdefault(kg, {}).update(zip(keys, values, strict=True))
            return
        for key, value in zip(keys, values, strict=True):
            if key[:2] in map_sids:
                plen = primary_length(key)
                self.map_put(kg, key[:plen], key[plen:], value)
            else:
                self.put(kg, key, value)

    def get_meta(self, name: str) -> bytes | None:
        return self._meta.get(name)

    def put_meta(self, name: str, value: bytes) -> None:
        self._meta[name] = value

    def approx_bytes(self) -> int:
        total = sum(len(k) + len(v) for d in self._values.values() for k, v in d.items())
        return total + sum(len(p) + len(u) + len(v) for d in self._maps.values() for p, m in d.items()
                           for u, v in m.items())

    def entry_count(self) -> int:
        """Per key group one ``len``, plus one per map primary."""
        values = sum(len(d) for d in self._values.values())
        return values + sum(len(m) for d in self._maps.values() for m in d.values())

    def close(self) -> None:
        pass

    def destroy(self) -> None:
        self._values.clear()
        self._maps.clear()
        self._meta.clear()


def _flatten(values: dict[bytes, bytes], maps: dict[bytes, dict[bytes, bytes]]) -> list[bytes]:
    flat = list(chain.from_iterable(values.items()))
    for primary, m in maps.items():
        for uk, v in m.items():
            flat += (primary + uk, v)
    return flat


class _HeapView:
    """The heap table as of the view's creation; safe to read from another thread while writes go on."""

    def __init__(self, table: HeapTable) -> None:
        self._table = table
        self._frozen: dict[int, tuple[dict[bytes, bytes], dict[bytes, dict[bytes, bytes]]]] = {}
        self._read: set[int] = set()
        self._lock = threading.Lock()

    def preserve(self, kg: int) -> None:
        """Called before the table changes key group ``kg``: keep a copy unless the view is done with it."""
        with self._lock:
            if kg in self._read or kg in self._frozen:
                return
            t = self._table
            self._frozen[kg] = (dict(t._values.get(kg, {})), {p: dict(m) for p, m in t._maps.get(kg, {}).items()})

    def key_group_flat(self, kg: int) -> list[bytes]:
        with self._lock:  # writers wait for this key group to be read, or find it read
            self._read.add(kg)
            frozen = self._frozen.pop(kg, None)
            if frozen is not None:
                return _flatten(*frozen)
            return _flatten(self._table._values.get(kg, {}), self._table._maps.get(kg, {}))
