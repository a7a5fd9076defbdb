"""Can the executors' Python run spate? One tiny Spark job imports spate there and reports its version, so a
missing install is a clear error, not a Py4J trace a minute in: before reading state (:func:`check_executor_python`),
or beside a stream's first batch (:class:`ExecutorCheck`), which fails with it before its checkpoint completes."""

from __future__ import annotations

import logging
import re
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

from spate.errors import SpateError

log = logging.getLogger(__name__)
T = TypeVar("T")
PROBE_TIMEOUT_S = 60.0


class ExecutorPythonError(SpateError, RuntimeError):
    """The executors' Python cannot run spate (not installed, or another version than the driver's)."""


def _probe(_: Any) -> tuple[str, str]:
    """Runs on an executor: the Python it runs and the spate it imports."""
    import spate

    return sys.executable, spate.__version__


def executor_python(spark: Any) -> str:
    """The Python PySpark starts Python workers with: ``PYSPARK_PYTHON`` when the SparkContext was created
    (``spark-submit`` sets it from ``spark.pyspark.python``), else ``python3``."""
    return str(spark.sparkContext.pythonExec)


def check_executor_python(spark: Any, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """Raise :class:`ExecutorPythonError` unless an executor imports this version of spate. If the probe
    gets no answer within ``timeout_s`` (no executor free yet), log a warning and go on."""
    ExecutorCheck(spark, timeout_s).confirm()


class ExecutorCheck:
    """The probe of :func:`check_executor_python`, started now and asked later: a stream runs it beside its first
    batch (a job of one task, whose Python worker the batch's tasks would have started anyway) instead of
    before it, and asks for the verdict when the batch's job is done or failed, before its checkpoint completes."""

    def __init__(self, spark: Any, timeout_s: float = PROBE_TIMEOUT_S) -> None:
        from pyspark.util import InheritableThread

        self._spark, self._timeout_s = spark, timeout_s
        self._deadline = time.monotonic() + timeout_s
        self._group = f"spate-executor-check-{uuid.uuid4().hex}"
        self._outcome: list[Any] = []
        self._thread = InheritableThread(target=self._probe, daemon=True)
        self._thread.start()

    def _probe(self) -> None:
        sc = self._spark.sparkContext
        sc.setJobGroup(self._group, "spate: check that executors can import spate", interruptOnCancel=True)
        try:
            self._outcome.append(sc.parallelize([0], 1).map(_probe).collect()[0])
        except Exception as e:  # noqa: BLE001 - every failure of the probe is reported to the user
            self._outcome.append(e)

    def verdict(self) -> ExecutorPythonError | None:
        """What the probe found wrong (waiting for it until its time is up), None if nothing or no answer in
        time (then it is cancelled and a warning logged)."""
        import spate

        self._thread.join(max(0.0, self._deadline - time.monotonic()))
        if self._thread.is_alive():
            self._spark.sparkContext.cancelJobGroup(self._group)
            log.warning("could not check within %.0f s that executors can import spate: going on", self._timeout_s)
            return None
        outcome = self._outcome[0]
        if isinstance(outcome, BaseException):
            error = ExecutorPythonError(_advice(self._spark, f"it cannot import spate ({_cause(outcome)})"))
            error.__cause__ = outcome
            return error
        python, version = outcome
        if version != spate.__version__:
            return ExecutorPythonError(_advice(self._spark, f"its Python {python} has spate {version}, the driver "
                                                            f"has {spate.__version__}"))
        return None

    def confirm(self) -> None:
        """Raise :class:`ExecutorPythonError` if the probe found the executors cannot run this spate."""
        error = self.verdict()
        if error is not None:
            raise error

    def guard(self, work: Callable[[], T], confirm: bool = True) -> T:
        """``work()``, whose failure becomes the probe's :class:`ExecutorPythonError` (Spark's error its cause) when
        the probe found executors that cannot run spate; with ``confirm`` that error is raised after a success
        too (a batch's job: before its checkpoint completes)."""
        try:
            result = work()
        except Exception as e:
            if (cannot := self.verdict()) is not None:
                raise cannot from e
            raise
        if confirm:
            self.confirm()
        return result


def _cause(error: BaseException) -> str:
    """The telling line of a (Py4J / Python worker) error: the last ``...Error: ...`` line, else the first."""
    text = str(error)
    found = re.findall(r"\b(\w*(?:Error|Exception): [^\n]+)", text)
    named = [f for f in found if "spate" in f or "module" in f.lower()]
    return (named or found or [text.strip().splitlines()[0] if text.strip() else type(error).__name__])[-1][:300]


def _advice(spark: Any, problem: str) -> str:
    return (f"Spark executors run Python {executor_python(spark)!r}, and {problem}. Set the PYSPARK_PYTHON "
            f"environment variable before the SparkSession is created (spark.pyspark.python with spark-submit) "
            f"to a Python with spate installed; in local mode, the driver's own: {sys.executable}")
