"""How fast a background job may move bytes through the disk: RocksDB's rate limiter, for a materialization's
native file (written, and copied where the checkpoint storage is not its file system), so that it leaves the
disk to the batches.

A pace is a rate with a burst: bytes moved after an idle spell go at once up to :data:`BURST_S` seconds' worth,
then each call waits until the rate allows what it moved. The wait is a sleep of the calling thread. A pace may
hold only while the disk is behind (:func:`write_back_behind`): bytes moved while it keeps up go at full speed.
That is the case of a table smaller than the kernel's background write-back threshold, whose batches write
nothing back (docs/benchmarks.md), and which a pace would only slow down."""

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

    def __init__(self, bytes_per_s: float | None, *, busy: Callable[[], bool] | None = None,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> None:
        if bytes_per_s is not None and not bytes_per_s > 0:
            raise SettingError(f"a pace must be a positive number of bytes a second, got {bytes_per_s}: pass a "
                               "positive rate, or None for no limit")
        self.bytes_per_s = bytes_per_s
        self._busy = busy  # None: always paced
        self._clock, self._sleep = clock, sleep
        self._free_at = clock()  # when what has moved so far is within the rate

    def moved(self, n: int) -> None:
        """``n`` bytes were moved: wait until the rate allows them (at once while ``busy`` says the disk is not)."""
        if self.bytes_per_s is None or n <= 0:
            return
        now = self._clock()
        if self._busy is not None and not self._busy():
            self._free_at = max(self._free_at, now)  # bytes moved at full speed save up nothing
            return
        self._free_at = max(self._free_at, now - BURST_S) + n / self.bytes_per_s
        if self._free_at > now:
            self._sleep(self._free_at - now)


def write_back_behind(proc: str = "/proc") -> bool:
    """Whether the kernel's write-back is behind: more bytes dirty or being written back than its background
    threshold (``vm.dirty_background_bytes``, else ``vm.dirty_background_ratio`` percent of the available
    memory), past which it writes back all the time, so that whatever else is written waits for the disk. Where
    that cannot be read (not Linux), True: paced always."""
    try:
        with open(f"{proc}/meminfo") as f:
            info = {k: int(v.split()[0]) * 1024 for k, _, v in (line.partition(":") for line in f) if v.strip()}
        with open(f"{proc}/sys/vm/dirty_background_bytes") as f:
            threshold = int(f.read())
        if not threshold:
            with open(f"{proc}/sys/vm/dirty_background_ratio") as f:
                threshold = info["MemAvailable"] * int(f.read()) // 100
        return info["Dirty"] + info["Writeback"] > threshold
    except (OSError, ValueError, KeyError):
        return True
