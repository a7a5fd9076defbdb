"""An lmdb table's directory, shared safely across processes: an exclusive file lock while a process writes it
(another process may take it over afterwards), and a shared hold while a process has it open, which keeps
:func:`remove_if_unused` away."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import time
from collections.abc import Iterator

from spate.errors import SpateError

LOCK_FILE = "spate.lock"  # exclusive while a process writes; its mtime is when a process last took it
HOLD_FILE = "spate.open"  # shared while a process has the table open


def hold_directory(path: str) -> int:
    """Create the table directory ``path`` if needed and take a shared hold on it; returns the hold's file
    descriptor (closing it lets go). Waits while :func:`remove_if_unused` deletes the directory, then makes it
    anew."""
    hold = os.path.join(path, HOLD_FILE)
    while True:
        os.makedirs(path, exist_ok=True)
        try:
            fd = os.open(hold, os.O_CREAT | os.O_RDWR, 0o644)
        except FileNotFoundError:  # deleted between the two calls
            continue
        fcntl.flock(fd, fcntl.LOCK_SH)
        if is_same_file(fd, hold):
            return fd
        os.close(fd)  # deleted while we waited for the hold


def is_same_file(fd: int, path: str) -> bool:
    """Whether ``fd`` is (still) the file at ``path``."""
    try:
        here = os.stat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (mine.st_dev, mine.st_ino) == (here.st_dev, here.st_ino)


def last_used(path: str) -> float:
    """When a process last took the table in ``path`` to write it (seconds since the epoch)."""
    try:
        return os.stat(os.path.join(path, LOCK_FILE)).st_mtime
    except FileNotFoundError:
        return os.stat(path).st_mtime


def remove_if_unused(path: str, idle_since: float | None = None) -> bool:
    """Delete an lmdb table directory unless a process holds it open or, given ``idle_since``, a process used
    it after that time (:func:`last_used`); True if it is gone."""
    hold = os.path.join(path, HOLD_FILE)
    try:
        fd = os.open(hold, os.O_CREAT | os.O_RDWR, 0o644)
    except FileNotFoundError:  # gone already
        return True
    except NotADirectoryError:  # not a table
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if not is_same_file(fd, hold):  # another process removed it meanwhile (and may have made it anew)
            return not os.path.exists(path)
        if idle_since is not None and last_used(path) > idle_since:
            return False
        shutil.rmtree(path, ignore_errors=True)
        return True
    except BlockingIOError:
        return False
    except FileNotFoundError:  # removed meanwhile by a process making the table anew (it takes no hold to do so)
        return not os.path.exists(path)
    finally:
        os.close(fd)


@contextlib.contextmanager
def held_for_reading(path: str, timeout_s: float = 60.0) -> Iterator[None]:
    """Keep the table in ``path`` from being written (its lock, waiting up to ``timeout_s``) and removed (a
    shared hold) meanwhile. Raises FileNotFoundError if there is no table, SpateError if it stays locked."""
    if os.path.islink(path) or not os.path.isdir(path):
        raise FileNotFoundError(path)
    hold_fd = os.open(os.path.join(path, HOLD_FILE), os.O_RDWR)
    try:
        fcntl.flock(hold_fd, fcntl.LOCK_SH)
        if not is_same_file(hold_fd, os.path.join(path, HOLD_FILE)):
            raise FileNotFoundError(path)  # removed while we waited
        lock_fd = os.open(os.path.join(path, LOCK_FILE), os.O_RDWR)
        try:
            wait_for_lock(lock_fd, path, timeout_s)
            yield
        finally:
            os.close(lock_fd)
    finally:
        os.close(hold_fd)


def try_flock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def wait_for_lock(fd: int, path: str, timeout_s: float, hint: str = "") -> None:
    """Take the exclusive lock on ``fd``, waiting up to ``timeout_s`` for another process to release it."""
    deadline = time.monotonic() + timeout_s
    while not try_flock(fd):
        if time.monotonic() > deadline:
            raise SpateError(f"lmdb state directory {path} stayed locked by another process for {timeout_s} s{hint}")
        time.sleep(0.01)


def move_table(source: str, target: str, timeout_s: float = 60.0) -> int:
    """Move the table in ``source`` to the new table directory ``target`` (a rename on the same file system,
    while no process writes or holds it); returns the bytes of its data file."""
    with held_for_reading(source, timeout_s):
        shutil.rmtree(target, ignore_errors=True)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        os.rename(source, target)
    return os.path.getsize(os.path.join(target, "data.mdb"))
