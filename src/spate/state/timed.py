"""``TimedTable``: wraps a state table and adds up the time spent in its reads and writes (profiling only:
``spate bench spark --profile`` reports it as the batch's state time)."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any

from spate.state.table import StateTable, TableView


class TimedTable(StateTable):
    """``inner`` with the seconds spent in its reads and writes added up in :attr:`seconds`."""

    def __init__(self, inner: StateTable) -> None:
        self.inner = inner
        self.kind = inner.kind
        self.seconds = 0.0

    def _timed(self, method: Any, *args: Any) -> Any:
        started = time.perf_counter()
        try:
            return method(*args)
        finally:
            self.seconds += time.perf_counter() - started

    def get(self, kg: int, primary: bytes) -> bytes | None:
        return self._timed(self.inner.get, kg, primary)

    def put(self, kg: int, primary: bytes, value: bytes) -> None:
        self._timed(self.inner.put, kg, primary, value)

    def append(self, kg: int, primary: bytes, data: bytes) -> None:
        self._timed(self.inner.append, kg, primary, data)

    def get_many(self, kgs: Sequence[int], primaries: Sequence[bytes]) -> list[bytes | None]:
        return self._timed(self.inner.get_many, kgs, primaries)

    def put_many(self, entries: Sequence[tuple[int, bytes, bytes]]) -> None:
        self._timed(self.inner.put_many, entries)

    def delete(self, kg: int, primary: bytes) -> None:
        self._timed(self.inner.delete, kg, primary)

    def map_get(self, kg: int, primary: bytes, user_key: bytes) -> bytes | None:
        return self._timed(self.inner.map_get, kg, primary, user_key)

    def map_put(self, kg: int, primary: bytes, user_key: bytes, value: bytes) -> None:
        self._timed(self.inner.map_put, kg, primary, user_key, value)

    def map_delete(self, kg: int, primary: bytes, user_key: bytes) -> None:
        self._timed(self.inner.map_delete, kg, primary, user_key)

    def map_items(self, kg: int, primary: bytes) -> list[tuple[bytes, bytes]]:
        return self._timed(self.inner.map_items, kg, primary)

    def state_entries(self, kg: int, sid_prefix: bytes) -> Iterator[tuple[bytes, bytes, bytes]]:
        return self.inner.state_entries(kg, sid_prefix)

    def key_group_flat(self, kg: int) -> list[bytes]:
        return self.inner.key_group_flat(kg)

    def consistent_view(self) -> AbstractContextManager[TableView]:
        return self.inner.consistent_view()

    def restore_key_group(self, kg: int, flat: list[bytes], map_sids: frozenset[bytes]) -> None:
        self.inner.restore_key_group(kg, flat, map_sids)

    def get_meta(self, name: str) -> bytes | None:
        return self.inner.get_meta(name)

    def put_meta(self, name: str, value: bytes) -> None:
        self.inner.put_meta(name, value)

    def commit(self) -> None:
        self.inner.commit()

    def approx_bytes(self) -> int:
        return self.inner.approx_bytes()

    def close(self) -> None:
        self.inner.close()

    def destroy(self) -> None:
        self.inner.destroy()
