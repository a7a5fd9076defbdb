"""Reading checkpoint files ahead of their use: a few threads fetch (storage read, checksum, decode) while the
caller uses what arrived, within a bound on the bytes in flight."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Generator, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
MIN_IN_FLIGHT = 2  # reads under way whatever their size


def read_ahead(pool: ThreadPoolExecutor, reads: Iterable[tuple[int, Callable[[], T]]],
                budget: int) -> Generator[T, None, None]:
    """The results of ``reads`` ((bytes, read)) in order, each started as soon as the reads before it that
    are not consumed yet come to less than ``budget`` bytes, or are fewer than :data:`MIN_IN_FLIGHT` (a read
    larger than the budget, one key group of a large state, still overlaps the apply of the one before)."""
    pending: deque[tuple[int, Future[T]]] = deque()
    outstanding = 0
    try:
        for size, read in reads:
            while len(pending) >= MIN_IN_FLIGHT and outstanding + size > budget:
                done, future = pending.popleft()
                outstanding -= done
                yield future.result()
            pending.append((size, pool.submit(read)))
            outstanding += size
        while pending:
            yield pending.popleft()[1].result()
    finally:
        for _size, future in pending:
            future.cancel()
