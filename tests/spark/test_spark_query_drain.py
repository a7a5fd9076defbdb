"""``helpers.spark_query.drain``, the side-by-side tests' runner of Spark's own query: it starts a run again only
when Spark's driver-side Python worker failed to connect back in time, never for another failure. The queries here
are fakes that fail as Spark's do (fault injection)."""

from __future__ import annotations

import pytest
from pyspark.errors import StreamingQueryException

from helpers.spark_query import CONNECT_BACK, drain

LATE = f"[STREAM_FAILED] Query terminated with exception: {CONNECT_BACK}. SQLSTATE: XXKST"


class FailingQuery:
    """A started query whose ``processAllAvailable`` raises ``failure`` (if any); it records that it was stopped."""

    def __init__(self, failure: str | None) -> None:
        self.failure, self.stopped = failure, False

    def processAllAvailable(self) -> None:  # noqa: N802 (Spark's name)
        if self.failure is not None:
            raise StreamingQueryException(message=self.failure)

    def stop(self) -> None:
        self.stopped = True


def _starts(*failures):
    started: list[FailingQuery] = []

    def start():
        started.append(FailingQuery(failures[len(started)]))
        return started[-1]
    return start, started


def test_a_run_whose_worker_connected_back_late_is_started_again_until_one_finishes():
    start, started = _starts(LATE, LATE, None)
    assert drain(start, pause_s=0) is started[-1]
    assert len(started) == 3 and all(q.stopped for q in started)


def test_another_failure_is_raised_at_once():
    start, started = _starts("[STREAM_FAILED] division by zero", None)
    with pytest.raises(StreamingQueryException, match="division by zero"):
        drain(start, pause_s=0)
    assert len(started) == 1 and started[0].stopped


def test_the_last_attempts_failure_is_raised():
    start, started = _starts(LATE, LATE)
    with pytest.raises(StreamingQueryException, match=CONNECT_BACK):
        drain(start, attempts=2, pause_s=0)
    assert len(started) == 2 and all(q.stopped for q in started)
