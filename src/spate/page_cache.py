"""What spate asks of the OS's page cache: checkpoint files out of it once they are on disk, and a table's file into
it ahead of a scan of the whole table.

Why. At 10 GB of state the lmdb table's file (17 GB) and the page cache (23 GB on a 24 GB machine) leave little
room. Every materialization wrote a 12 GB file, and the kernel kept those freshly written pages and evicted the
table's, which the next batches read back one 4 KB page fault at a time (measured: 2.5 million pages evicted and
read again in four minutes of batches). A checkpoint file is read again only by a restore, so its pages are let go
as soon as they are on disk (:func:`drop_cached`, used by :class:`~spate.write_behind.WriteBehindFile`, and by
:class:`~spate.snapshot.native_write.NativeFileBuilder` a commit behind as it builds a native snapshot).

The other way round: lmdb maps its files with readahead off, right for the random keys of a batch, so a scan of
the whole table (the integrity check of a local copy before it is trusted) read the file 4 KB at a time: 95 s for
10 GB of state, where the OS copies the same bytes in about 22 s. :func:`reading_ahead` reads the file in order,
in large reads on a thread of its own, just ahead of such a scan, when the file fits in the memory available.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator

READ_AHEAD_CHUNK = 8 << 20


def drop_cached(fd: int, offset: int, length: int) -> None:
    """Let the OS drop the cached pages of ``length`` bytes at ``offset`` of the file open as ``fd`` (those already
    written to disk; a dirty page stays). Best effort: where the OS has no such advice, nothing happens."""
    if length > 0 and hasattr(os, "posix_fadvise"):
        with contextlib.suppress(OSError):
            os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)


def available_memory() -> int | None:
    """The memory the OS could give without swapping (``MemAvailable``), or None where that is not known."""
    try:
        with open("/proc/meminfo", "rb") as f:
            for line in f:
                if line.startswith(b"MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


@contextlib.contextmanager
def reading_ahead(path: str) -> Iterator[bool]:
    """While inside, a thread reads the file ``path`` from its start into the page cache (the bytes are dropped),
    so that a scan of the whole file finds its pages there; it stops at the end of the file or when the block
    exits. Yields whether it reads: not when the file is larger than the memory available (its first pages would
    be evicted before the scan got to them) or cannot be opened."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        yield False
        return
    stop = threading.Event()
    reader: threading.Thread | None = None
    try:
        size, free = os.fstat(fd).st_size, available_memory()
        if free is not None and size <= free:
            reader = threading.Thread(target=_read_through, args=(fd, stop), name="spate-read-ahead", daemon=True)
            reader.start()
        yield reader is not None
    finally:
        stop.set()
        if reader is not None:
            reader.join()
        os.close(fd)


def _read_through(fd: int, stop: threading.Event) -> None:
    buf = bytearray(READ_AHEAD_CHUNK)
    offset = 0
    with contextlib.suppress(OSError):  # best effort: the scan reads what is left itself
        while not stop.is_set() and (n := os.preadv(fd, [buf], offset)) > 0:
            offset += n
