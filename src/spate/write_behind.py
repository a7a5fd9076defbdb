"""A local file whose write-back to disk is started as it grows, as RocksDB's ``bytes_per_sync`` does.

Why. A materialization or a full snapshot writes gigabytes in seconds. Left to the OS, they sit in the page
cache as dirty pages (1-2 GB measured) until the kernel writes them back in bursts, and every ``fsync`` meanwhile
(a checkpoint's metadata, a marker) waits behind the burst: the blog workload's slowest checkpoints, 0.1-0.9 s
against ~35 ms, each with more than 1 GB dirty. Asking the OS to start writing each few megabytes back as soon as
they are written (``sync_file_range(SYNC_FILE_RANGE_WRITE)``: the call does not wait for the disk) keeps the
backlog small. Where the call does not exist (not Linux), files are written as before.

A checkpoint file is also let go from the page cache once written back (``drop_behind``): see
:mod:`spate.page_cache`.
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Callable
from typing import Any

from spate.page_cache import drop_cached

WRITE_BEHIND_BYTES = 8 << 20
_SYNC_FILE_RANGE_WRITE = 2  # from <fcntl.h>
_SYNC_FILE_RANGE_WAIT = 1 | 2 | 4  # WAIT_BEFORE | WRITE | WAIT_AFTER: the range written back, waited for


def _sync_file_range() -> Callable[[int, int, int, int], int] | None:
    """libc's ``sync_file_range`` (ctypes releases the GIL around it), or None where there is none."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        call = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    call.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    call.restype = ctypes.c_int
    return call  # type: ignore[no-any-return]


SYNC_FILE_RANGE = _sync_file_range()


def start_write_back(fd: int) -> None:
    """Ask the OS to start writing every dirty page of the file open as ``fd`` (any mode) back to disk, without
    waiting for it: for a file written by someone else (lmdb)."""
    if SYNC_FILE_RANGE is not None:
        SYNC_FILE_RANGE(fd, 0, 0, _SYNC_FILE_RANGE_WRITE)  # length 0: to the end of the file


def wait_written_back(fd: int, length: int) -> None:
    """Write the first ``length`` bytes of the file open as ``fd`` back to disk and wait until they are (the pages
    of it, not the file's metadata: not an ``fsync``). A background writer calling it a step behind goes no faster
    than the disk takes its file, and keeps no more than a step of it in the page cache."""
    if SYNC_FILE_RANGE is not None and length > 0:
        SYNC_FILE_RANGE(fd, 0, length, _SYNC_FILE_RANGE_WAIT)


class WriteBehindFile:
    """An unbuffered binary file being written from the start: after every :data:`WRITE_BEHIND_BYTES`, the OS is
    asked to start writing what was written since back to disk. With ``drop_behind`` (a checkpoint file, read again
    only by a restore), the bytes whose write-back was asked for a step earlier then leave the page cache (those on
    disk by then: nothing waits for the disk). Writes and closes like the file it wraps."""

    def __init__(self, raw: Any, every: int = WRITE_BEHIND_BYTES, drop_behind: bool = False) -> None:
        self._raw = raw
        self._every = every
        self._drop_behind = drop_behind and SYNC_FILE_RANGE is not None  # else its pages are dirty still
        self.written = 0
        self.started_up_to = 0  # bytes whose write-back was asked for
        self.dropped_up_to = 0  # bytes let go from the page cache

    def write(self, data: Any) -> int | None:
        n = self._raw.write(data)
        self.written += len(data) if n is None else n
        if self.written - self.started_up_to >= self._every:
            self._start_write_back()
        return n

    def _start_write_back(self) -> None:
        if SYNC_FILE_RANGE is not None:  # a failure only means the OS writes these back later, as it would anyway
            SYNC_FILE_RANGE(self._raw.fileno(), self.started_up_to, self.written - self.started_up_to,
                            _SYNC_FILE_RANGE_WRITE)
        if self._drop_behind and self.started_up_to > self.dropped_up_to:
            drop_cached(self._raw.fileno(), self.dropped_up_to, self.started_up_to - self.dropped_up_to)
            self.dropped_up_to = self.started_up_to
        self.started_up_to = self.written

    def close(self) -> None:
        if self._drop_behind and self.started_up_to and not self._raw.closed:
            # again from the start: a range still being written back at its step was left in the cache then
            drop_cached(self._raw.fileno(), 0, self.started_up_to)
        self._raw.close()

    @property
    def closed(self) -> bool:
        return bool(self._raw.closed)

    def __enter__(self) -> WriteBehindFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
