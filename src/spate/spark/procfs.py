"""Reading Linux ``/proc``: which processes run, their command lines, parents and working directories (for
finding the executor a Python worker belongs to, and the processes a test cluster started)."""

from __future__ import annotations

import os
from pathlib import Path


def pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def cmdline(pid: int) -> list[str]:
    """The process's arguments ([] if it is gone or unreadable)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


def cwd(pid: int) -> Path | None:
    try:
        return Path(os.readlink(f"/proc/{pid}/cwd"))
    except OSError:
        return None


def _stat(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return []
    return text[text.rfind(")") + 2:].split()  # fields after "pid (comm) ": state, ppid, ... (comm may hold ")")


def parent(pid: int) -> int:
    """The parent's pid, 0 if the process is gone."""
    fields = _stat(pid)
    return int(fields[1]) if len(fields) > 1 else 0


def is_running(pid: int) -> bool:
    """``pid`` is a live process (not a zombie)."""
    fields = _stat(pid)
    return bool(fields) and fields[0] not in ("Z", "X")  # a zombie has exited; its parent has not reaped it
