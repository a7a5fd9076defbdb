"""The operating system's reads and writes of one file of a local checkpoint root, below
:class:`~spate.fs.LocalStorage`: a small file written whole and fsynced beside its final path (to be linked or
renamed into place), and a range of a data file read once.

A checkpoint file is read once: by a restore, by a verification, by the check of the state a restart carries on
from. Kept in the page cache, its pages would push out the table's, which the batches after it read (measured at
10 GB of state: the 9.9 GiB snapshot a restart checked evicted 3.4 GiB of the table's 14.6 GiB file, read back one
page fault at a time by the next minutes of batches). :func:`read_once` lets go of what it read, as
:class:`~spate.write_behind.WriteBehindFile` lets go of what it wrote.
"""

from __future__ import annotations

import os

from spate.layout import temporary_path
from spate.page_cache import drop_cached


def write_synced_temp(full: str, data: bytes) -> str:
    """Write ``data`` to a fresh temporary file next to ``full``, fsynced; return its path."""
    os.makedirs(os.path.dirname(full), exist_ok=True)
    tmp = temporary_path(full)
    with open(tmp, "wb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())
    return tmp


def read_once(full: str, offset: int, length: int) -> bytes:
    """``length`` bytes at ``offset`` of the file ``full`` (fewer only past its end), its pages let go of after.
    Raises ``FileNotFoundError`` when there is no such file."""
    return _read(full, offset, length, let_go=True)


def read_kept(full: str, offset: int, length: int) -> bytes:
    """As :func:`read_once`, its pages left in the page cache: for a file read again soon (a restored table's
    base, hard-linked from the checkpoint)."""
    return _read(full, offset, length, let_go=False)


def _read(full: str, offset: int, length: int, let_go: bool) -> bytes:
    fd = os.open(full, os.O_RDONLY | os.O_CLOEXEC)
    try:
        data = _pread_fully(fd, length, offset)
        if let_go:
            drop_cached(fd, offset, len(data))
    finally:
        os.close(fd)
    return data


def _pread_fully(fd: int, length: int, offset: int) -> bytes:
    """One call reads at most about 2 GB: the rest is read by the next."""
    data = os.pread(fd, length, offset)
    if len(data) == length or not data:
        return data
    parts = [data]
    got = len(data)
    while got < length and (more := os.pread(fd, length - got, offset + got)):
        parts.append(more)
        got += len(more)
    return b"".join(parts)
