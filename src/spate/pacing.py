"""How fast a background job may move bytes through the disk: RocksDB's rate limiter, for a materialization's
native file (written, then read back for its CRC-32), so that it leaves the disk to the batches.

A pace is a rate with a burst: bytes moved after an idle spell go at once up to :data:`BURST_S` seconds' worth,
then each call waits until the rate allows what it moved. The wait is a sleep of the calling thread."""

from __future__ import annotations

import time
from collections.abc import Callable

from spate.errors import SettingError

BURST_S = 1.0  # what an idle spell saves up, in seconds of the rate


class Pace:
    """Keeps the bytes reported to :meth:`moved` at ``bytes_per_s`` on average (None: no limit).

    Raises:
        SettingError: a rate that is not positive.
    """

    def __init__(self, bytes_per_s: float | None, *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        if bytes_per_s is not None and not bytes_per_s > 0:
            raise SettingError(f"a pace must be a positive number of bytes a second, got {bytes_per_s}: pass a "
                               "positive rate, or None for no limit")
        self.bytes_per_s = bytes_per_s
        self._clock, self._sleep = clock, sleep
        self._free_at = clock()  # when what has moved so far is within the rate

    def moved(self, n: int) -> None:
        """``n`` bytes were moved: wait until the rate allows them."""
        if self.bytes_per_s is None or n <= 0:
            return
        now = self._clock()
        self._free_at = max(self._free_at, now - BURST_S) + n / self.bytes_per_s
        if self._free_at > now:
            self._sleep(self._free_at - now)

