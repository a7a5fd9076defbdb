"""OS pipes that carry bulk data between threads or processes (a materialization's reader process, lmdb's copy of
a table): widened where the OS allows it."""

from __future__ import annotations

import contextlib
import fcntl


def widen_pipe(fd: int, size: int) -> None:
    """Let the pipe ``fd`` hold up to ``size`` bytes (Linux; the system's limit for an unprivileged process is
    usually 1 MB, and is respected): each read of a pipe releases and retakes the GIL, which beside a thread running
    Python waits up to a switch interval (5 ms), so the fewer reads per megabyte the better (64 KB pipes: 16)."""
    setter = getattr(fcntl, "F_SETPIPE_SZ", None)
    if setter is None:
        return
    try:
        with open("/proc/sys/fs/pipe-max-size") as limit:
            size = min(size, int(limit.read()))
    except (OSError, ValueError):
        size = min(size, 1 << 20)
    with contextlib.suppress(OSError):
        fcntl.fcntl(fd, setter, size)
