"""A materialization's reader processes held stopped and let run in turns, switched between batches, so that a
benchmark measures what a running materialization costs the batches beside it inside one run
(:class:`ReaderTurns`).

Why inside one run: on a small machine two runs minutes apart differ by more than that cost, and with the
changelog's default triggers a materialization runs beside nearly every batch, so no batch of a run is free of
one to compare with. Turns a few seconds long compare batches of the same table at the same point of its life.
A reader held stopped (``SIGSTOP``) does nothing; the subtask goes on (it only offers the reader new boundaries
through a pipe). Linux only: the readers are found in ``/proc``; elsewhere none are found and every batch counts
as one with no reader."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from spate.changelog.process_view import READER_MODULE

Beside = Literal["stopped", "running", "none"]


def reader_pids(parent: int | None = None, proc: str = "/proc") -> frozenset[int]:
    """The materialization readers (``python -m spate.changelog.materializer_process``) that are children of
    process ``parent`` (default: this one)."""
    parent = os.getpid() if parent is None else parent
    try:
        entries = os.listdir(proc)
    except OSError:
        return frozenset()
    found = set()
    for entry in entries:
        if entry.isdigit() and _parent_of(f"{proc}/{entry}") == parent and _is_reader(f"{proc}/{entry}"):
            found.add(int(entry))
    return frozenset(found)


def _parent_of(process: str) -> int | None:
    try:
        with open(f"{process}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None  # gone meanwhile
    # the command's name is in parentheses and may hold anything: the fields after it are space-separated
    return int(stat[stat.rindex(b")") + 2:].split()[1])


def _is_reader(process: str) -> bool:
    try:
        with open(f"{process}/cmdline", "rb") as f:
            return READER_MODULE.encode() in f.read().split(b"\0")
    except OSError:
        return False


@dataclass(frozen=True)
class Turn:
    """What a batch started beside: whether the readers were held stopped, and which were there."""

    holding: bool
    readers: frozenset[int]


class ReaderTurns:
    """Holds this process's materialization readers stopped for ``turn_s`` seconds, then lets them run for as
    long, and so on, switching only between batches. :meth:`before_batch` and :meth:`after_batch` around each
    batch say what it ran beside; a batch during which a reader started or ended counts as neither. Leaving the
    context lets every held reader run again (before the runner that owns them closes)."""

    def __init__(self, turn_s: float, *, clock: Callable[[], float] = time.monotonic,
                 find: Callable[[], frozenset[int]] = reader_pids) -> None:
        self.turn_s = turn_s
        self._clock, self._find = clock, find
        self._holding = False
        self._switched_at = clock()
        self._stopped: set[int] = set()

    def __enter__(self) -> ReaderTurns:
        return self

    def __exit__(self, *exc: object) -> None:
        self._release()

    def before_batch(self) -> Turn:
        now = self._clock()
        if now - self._switched_at >= self.turn_s:
            self._holding, self._switched_at = not self._holding, now
        readers = self._find()
        if self._holding:
            for pid in readers - self._stopped:
                _signal(pid, signal.SIGSTOP)
                self._stopped.add(pid)
        else:
            self._release()
        return Turn(self._holding, readers)

    def after_batch(self, turn: Turn) -> Beside | None:
        """What the batch begun at ``turn`` ran beside, all along; None if a reader started or ended during it."""
        if self._find() != turn.readers:
            return None
        if not turn.readers:
            return "none"
        return "stopped" if turn.holding else "running"

    def _release(self) -> None:
        for pid in self._stopped:
            _signal(pid, signal.SIGCONT)
        self._stopped.clear()


def _signal(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):  # it ended as it was found (a stopped reader cannot end)
        os.kill(pid, sig)
