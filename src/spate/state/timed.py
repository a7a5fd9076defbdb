"""``TimedTable``: wraps a state table and adds up the time spent in its reads and writes (profiling only:
``spate bench spark --profile`` reports it as the batch's state time)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from spate.state.table import StateTable, WrappedTable


class TimedTable(WrappedTable):
    """``inner`` with the seconds spent in its reads and writes added up in :attr:`seconds`."""

    def __init__(self, inner: StateTable) -> None:
        super().__init__(inner)
        self.seconds = 0.0

    def _timed(self, method: Any, *args: Any) -> Any:
        started = time.perf_counter()
        try:
            return method(*args)
        finally:
            self.seconds += time.perf_counter() - started

    def get(self, kg: int, primary: bytes) -> bytes | None:
        return self._timed(self.inner.get, kg, primary)

    def get_many(self, kgs: Sequence[int], primaries: Sequence[bytes]) -> list[bytes | None]:
        return self._timed(self.inner.get_many, kgs, primaries)

    def put(self, kg: int, primary: bytes, value: bytes) -> None:
        self._timed(self.inner.put, kg, primary, value)

    def put_existed(self, kg: int, primary: bytes, value: bytes) -> bool:
        return self._timed(self.inner.put_existed, kg, primary, value)

    def put_many(self, entries: Sequence[tuple[int, bytes, bytes]]) -> None:
        self._timed(self.inner.put_many, entries)

    def put_many_existed(self, entries: Sequence[tuple[int, bytes, bytes]]) -> list[bool]:
        return self._timed(self.inner.put_many_existed, entries)  # type: ignore[no-any-return]

    def append(self, kg: int, primary: bytes, data: bytes) -> None:
        self._timed(self.inner.append, kg, primary, data)

    def delete(self, kg: int, primary: bytes) -> None:
        self._timed(self.inner.delete, kg, primary)

    def map_get(self, kg: int, primary: bytes, user_key: bytes) -> bytes | None:
        return self._timed(self.inner.map_get, kg, primary, user_key)

    def map_put(self, kg: int, primary: bytes, user_key: bytes, value: bytes) -> None:
        self._timed(self.inner.map_put, kg, primary, user_key, value)

    def map_put_existed(self, kg: int, primary: bytes, user_key: bytes, value: bytes) -> bool:
        return self._timed(self.inner.map_put_existed, kg, primary, user_key, value)

    def map_delete(self, kg: int, primary: bytes, user_key: bytes) -> None:
        self._timed(self.inner.map_delete, kg, primary, user_key)

    def map_items(self, kg: int, primary: bytes) -> list[tuple[bytes, bytes]]:
        return self._timed(self.inner.map_items, kg, primary)
