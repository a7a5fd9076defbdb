"""Before a stream starts: can the executors' Python run spate? One tiny Spark job imports spate there and
reports its version, so a missing install is a clear error at ``start()``, not a Py4J trace a minute in."""

from __future__ import annotations

import logging
import re
import sys
import uuid
from typing import Any

log = logging.getLogger(__name__)
PROBE_TIMEOUT_S = 60.0


class ExecutorPythonError(RuntimeError):
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
    import spate

    outcome = _run_probe(spark, timeout_s)
    if outcome is None:
        log.warning("could not check within %.0f s that executors can import spate: going on", timeout_s)
        return
    if isinstance(outcome, BaseException):
        raise ExecutorPythonError(_advice(spark, f"it cannot import spate ({_cause(outcome)})")) from outcome
    python, version = outcome
    if version != spate.__version__:
        raise ExecutorPythonError(_advice(spark, f"its Python {python} has spate {version}, the driver has "
                                                 f"{spate.__version__}"))


def _run_probe(spark: Any, timeout_s: float) -> tuple[str, str] | BaseException | None:
    """The probe's answer, its error, or None if it did not finish in time (then it is cancelled)."""
    from pyspark.util import InheritableThread

    sc = spark.sparkContext
    group = f"spate-executor-check-{uuid.uuid4().hex}"
    outcome: list[Any] = []

    def probe() -> None:
        sc.setJobGroup(group, "spate: check that executors can import spate", interruptOnCancel=True)
        try:
            outcome.append(sc.parallelize([0], 1).map(_probe).collect()[0])
        except Exception as e:  # noqa: BLE001 - every failure of the probe is reported to the user
            outcome.append(e)

    thread = InheritableThread(target=probe, daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        sc.cancelJobGroup(group)
        return None
    return outcome[0]


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
