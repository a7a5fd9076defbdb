"""``heap`` table: dicts per key group in this process. Fastest; lives and dies with the process."""

from __future__ import annotations

from collections.abc import Iterator

from spate.state.layout import primary_length
from spate.state.table import StateTable


class HeapTable(StateTable):
    """``{kg: {primary: value | {user_key: value}}}``."""

    kind = "heap"

    def __init__(self) -> None:
        self._data: dict[int, dict[bytes, bytes | dict[bytes, bytes]]] = {}
        self._meta: dict[str, bytes] = {}

    def get(self, kg: int, primary: bytes) -> bytes | None:
        d = self._data.get(kg)
        return d.get(primary) if d is not None else None  # type: ignore[return-value]

    def put(self, kg: int, primary: bytes, value: bytes) -> None:
        d = self._data.get(kg)
        if d is None:
            d = self._data[kg] = {}
        d[primary] = value

    def delete(self, kg: int, primary: bytes) -> None:
        d = self._data.get(kg)
        if d is not None:
            d.pop(primary, None)

    def map_get(self, kg: int, primary: bytes, user_key: bytes) -> bytes | None:
        d = self._data.get(kg)
        m = d.get(primary) if d is not None else None
        return m.get(user_key) if m is not None else None  # type: ignore[union-attr]

    def map_put(self, kg: int, primary: bytes, user_key: bytes, value: bytes) -> None:
        d = self._data.get(kg)
        if d is None:
            d = self._data[kg] = {}
        m = d.get(primary)
        if m is None:
            m = d[primary] = {}
        m[user_key] = value  # type: ignore[index]

    def map_delete(self, kg: int, primary: bytes, user_key: bytes) -> None:
        d = self._data.get(kg)
        m = d.get(primary) if d is not None else None
        if m is not None:
            m.pop(user_key, None)  # type: ignore[union-attr]
            if not m:
                del d[primary]  # type: ignore[union-attr]

    def map_items(self, kg: int, primary: bytes) -> list[tuple[bytes, bytes]]:
        d = self._data.get(kg)
        m = d.get(primary) if d is not None else None
        return list(m.items()) if m else []  # type: ignore[union-attr]

    def state_entries(self, kg: int, sid_prefix: bytes) -> Iterator[tuple[bytes, bytes, bytes]]:
        d = self._data.get(kg)
        if not d:
            return
        for primary, v in list(d.items()):
            if primary[:2] != sid_prefix:
                continue
            if isinstance(v, dict):
                for uk, mv in list(v.items()):
                    yield primary, uk, mv
            else:
                yield primary, b"", v

    def key_group_entries(self, kg: int) -> Iterator[tuple[bytes, bytes]]:
        d = self._data.get(kg)
        if not d:
            return
        for primary, v in sorted(d.items()):
            if isinstance(v, dict):
                for uk, mv in sorted(v.items()):
                    yield primary + uk, mv
            else:
                yield primary, v

    def restore_entry(self, kg: int, flat: bytes, value: bytes) -> None:
        plen = primary_length(flat)
        if plen == len(flat):
            self.put(kg, flat, value)
        else:
            self.map_put(kg, flat[:plen], flat[plen:], value)

    def get_meta(self, name: str) -> bytes | None:
        return self._meta.get(name)

    def put_meta(self, name: str, value: bytes) -> None:
        self._meta[name] = value

    def approx_bytes(self) -> int:
        total = 0
        for d in self._data.values():
            for k, v in d.items():
                total += len(k) + (sum(len(a) + len(b) for a, b in v.items()) if isinstance(v, dict) else len(v))
        return total

    def close(self) -> None:
        pass

    def destroy(self) -> None:
        self._data.clear()
        self._meta.clear()
