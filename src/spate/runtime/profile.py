"""Profiling a subtask's batch: the milliseconds of each phase, reported in its ack's stats as ``profile``."""

from __future__ import annotations

import time

from spate.runtime.tables import table_under
from spate.state.table import StateTable
from spate.state.timed import TimedTable


class PhaseClock:
    """Milliseconds of each phase of a subtask's batch."""

    def __init__(self) -> None:
        self.phases: dict[str, float] = {}
        self._at = time.perf_counter()

    def lap(self, phase: str) -> None:
        """The phase ``phase`` ends now (and the next one starts)."""
        now = time.perf_counter()
        self.phases[phase] = self.phases.get(phase, 0.0) + (now - self._at) * 1000
        self._at = now

    def rounded(self) -> dict[str, float]:
        return {k: round(v, 3) for k, v in self.phases.items()}


def table_seconds(table: StateTable | None) -> float:
    """Seconds spent in the state table's reads and writes so far (profiling only, else 0)."""
    timed = table_under(table, TimedTable)
    return timed.seconds if timed is not None else 0.0
