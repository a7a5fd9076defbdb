"""Reading the pages of the key groups a scan in key order reaches next, while it reads the current one.

Why. A background materialization reads a whole lmdb table key group by key group. In a long-running table the
pages of a key group lie anywhere in the file, so on a table larger than the page cache every leaf page is a page
fault, and lmdb takes them one at a time: key groups of a 10 GB table read at 32 MB/s with a cold cache and at
612 MB/s from memory (docs/benchmarks.md). Threads that walk the keys of the next key groups meanwhile wait on
the disk together (py-lmdb lets go of the GIL inside each cursor step): 106 MB/s with 16 of them.

When. Only once the reader found its reads slow (:meth:`KeyGroupReadAhead.read`): a table in memory pays a clock
read per key group. From then on the threads stay at most :data:`AHEAD` key groups in front of the reader, so
what they bring in is still in memory when it is read. Best effort: a thread lmdb refuses stops, and the reader
reads what is left itself.
"""

from __future__ import annotations

import threading
from collections import deque
from itertools import islice
from types import TracebackType

import lmdb

from spate.state.lmdb_scan import key_group_keys

THREADS = 16  # key groups read at once
AHEAD = 32  # key groups the threads may be in front of the reader
MIN_PROBE_BYTES = 1 << 20  # reads judged together: less than this says little about where the table's pages are
COLD_BYTES_PER_S = 100e6  # reads slower than this came mostly from disk (32 MB/s cold, 612 warm)
STEP_KEYS = 4096  # keys walked between two looks at whether the reader is done


class KeyGroupReadAhead:
    """Threads reading ahead of a reader that reads ``key_groups`` of ``env`` in order. Use as a context
    manager: leaving it stops and joins the threads (before ``env`` may be closed)."""

    def __init__(self, env: lmdb.Environment, key_groups: range) -> None:
        self._env = env
        self._end = key_groups.stop
        self._changed = threading.Condition()
        self._next = key_groups.start  # the next key group a thread takes
        self._limit = key_groups.start  # threads take key groups below this
        self._stopped = False
        self._threads: list[threading.Thread] = []
        self._probed = (0, 0.0)  # bytes and seconds of the reader's key groups not judged yet

    def reading(self, kg: int) -> None:
        """The reader starts on ``kg``: the threads skip what it has passed and may go up to ``kg`` + AHEAD."""
        with self._changed:
            self._next = max(self._next, kg + 1)
            self._limit = kg + 1 + AHEAD
            self._changed.notify_all()

    def read(self, nbytes: int, seconds: float) -> None:
        """The reader read its key group, ``nbytes`` in ``seconds``. Key groups are judged together until they
        come to :data:`MIN_PROBE_BYTES` (small ones, as with a high max parallelism, say little alone); if those
        were slow, the threads start."""
        if self._threads:
            return
        self._probed = (self._probed[0] + nbytes, self._probed[1] + seconds)
        probed_bytes, probed_s = self._probed
        if probed_bytes < MIN_PROBE_BYTES:
            return
        self._probed = (0, 0.0)
        if probed_bytes >= COLD_BYTES_PER_S * probed_s:
            return
        self._threads = [threading.Thread(target=self._work, name="spate-read-ahead", daemon=True)
                         for _ in range(THREADS)]
        for thread in self._threads:
            thread.start()

    @property
    def started(self) -> bool:
        return bool(self._threads)

    def _work(self) -> None:
        while (kg := self._take()) is not None and self._walk(kg):
            pass

    def _take(self) -> int | None:
        """The next key group to read ahead, once the reader is near enough; None when there is none."""
        with self._changed:
            while not self._stopped and self._next < self._end and self._next >= self._limit:
                self._changed.wait()
            if self._stopped or self._next >= self._end:
                return None
            self._next += 1
            return self._next - 1

    def _walk(self, kg: int) -> bool:
        """Walk key group ``kg``'s keys in a read transaction of this thread; False if lmdb refused."""
        try:
            with self._env.begin() as txn:
                keys = key_group_keys(txn.cursor(), kg)
                while not self._stopped and len(deque(islice(keys, STEP_KEYS), maxlen=1)):
                    pass
        except lmdb.Error:  # e.g. the map grown by the subtask since: the reader reads the pages itself
            return False
        return True

    def __enter__(self) -> KeyGroupReadAhead:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        with self._changed:
            self._stopped = True
            self._changed.notify_all()
        for thread in self._threads:
            thread.join()
