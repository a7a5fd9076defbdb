"""A batch that failed, told first: Spark's error carries the Python worker's traceback at the end of kilobytes of
JVM stack and Py4J text. :func:`worker_error` finds the worker's own exception (its type, message and notes:
spate's processor errors name the key, batch and subtask), and :class:`BatchFailedError` says it first.

Inside ``foreachBatch`` the driver raises a :class:`BatchFailedError` holding only spate's message (so Spark's log
of the failed query holds it once, after a few driver frames); Spark's own error stays in ``spark_error``.
:func:`told` builds what the query's ``awaitTermination()`` and ``exception()`` give the user
(:class:`~spate.spark.query.SpateQuery`): spate's message first, Spark's ``StreamingQueryException`` in
``spark_error`` (and ``__context__``), its trace in Spark's log.
"""

from __future__ import annotations

import types
from typing import Any

from pyspark.errors import StreamingQueryException

from spate.errors import SparkErrorClass, SpateError

_TRACEBACK = "Traceback (most recent call last):"
_WHERE_SPARK_IS = "Spark's own error, with its trace: this exception's spark_error attribute, and Spark's log"


class BatchFailedError(SparkErrorClass, SpateError, StreamingQueryException):
    """A micro-batch failed, told by spate: ``str()`` is spate's message (the exception the processor or spate
    raised, with the processor, key, batch and subtask), then nothing of Spark's. A ``StreamingQueryException``
    (pyspark's base class), so code that catches Spark's still catches it; ``getCondition()`` is the Spark error
    class spate's message names (e.g. ``STATEFUL_PROCESSOR_INCORRECT_TIME_MODE_TO_ASSIGN_TTL``), None if none.

    Attributes:
        batch_id: the batch that failed.
        worker_type: the type of the exception on the executor (``"spate.errors.OutputError"``), None when the
            batch failed on the driver.
        spark_error: Spark's own error (inside ``foreachBatch``, the failed job's; from the query, its
            ``StreamingQueryException``), with Spark's whole trace.
        error: the exception the driver raised, when the batch failed on the driver (it has the driver's frames:
            a sink's, for instance).
    """

    def __init__(self, message: str, *, batch_id: int, worker_type: str | None = None,
                 spark_error: BaseException | None = None, error: BaseException | None = None) -> None:
        StreamingQueryException.__init__(self, message=message)
        self.batch_id, self.worker_type, self.spark_error, self.error = batch_id, worker_type, spark_error, error


def worker_error(text: str) -> str | None:
    """The last Python exception in ``text`` (``Type: message`` and the lines that follow it, such as its
    notes) without its stack, or None if ``text`` holds no Python traceback."""
    start = text.rfind(_TRACEBACK)
    if start < 0:
        return None
    found: list[str] = []
    for line in text[start + len(_TRACEBACK):].splitlines():
        if not found:
            if line.strip() and not line.startswith((" ", "\t")):  # past the frames: the exception line
                found.append(line)
        elif not line.strip() or line.lstrip().startswith(("at ", "SQLSTATE: ")):  # the end, the JVM's stack
            break
        else:
            found.append(line)
    return "\n".join(found) or None


def batch_failed(batch_id: int, error: Exception) -> BatchFailedError | None:
    """The error to raise for batch ``batch_id``'s job failing with ``error``, None if it holds no worker
    exception (e.g. the driver's own). Its message is the worker's exception only; ``error`` is its
    ``spark_error``."""
    summary = worker_error(str(error))
    if summary is None:
        return None
    worker_type = summary.partition(":")[0] if ":" in summary.splitlines()[0] else None
    return BatchFailedError(f"batch {batch_id} failed on an executor: {summary}", batch_id=batch_id,
                            worker_type=worker_type, spark_error=error)


def failed_on_driver(failure: BaseException, batch_id: int) -> str:
    """spate's message of batch ``batch_id`` failing with ``failure`` on the driver (in the sink, say)."""
    kind = type(failure)
    name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    notes = "".join(f"\n{n}" for n in getattr(failure, "__notes__", ()))
    return f"batch {batch_id} failed on the driver: {name}: {failure}{notes}"


def told(failure: BaseException, batch_id: int, failure_traceback: types.TracebackType | None,
         spark_error: BaseException) -> BatchFailedError:
    """What the query raises for Spark's ``spark_error`` when batch ``batch_id``'s ``foreachBatch`` raised
    ``failure`` (with ``failure_traceback``, its frames on the driver): spate's message first."""
    if isinstance(failure, BatchFailedError):
        out = BatchFailedError(str(failure), batch_id=failure.batch_id, worker_type=failure.worker_type,
                               spark_error=spark_error)
    else:
        out = BatchFailedError(failed_on_driver(failure, batch_id), batch_id=batch_id, spark_error=spark_error,
                               error=failure.with_traceback(failure_traceback))
    out.add_note(_WHERE_SPARK_IS)
    return out


def mentions(spark_error: Any, failure: BaseException) -> bool:
    """Whether Spark's error is the one ``failure`` caused: its text holds the failure's first line."""
    first = str(failure).partition("\n")[0][:120]
    try:
        return bool(first) and first in str(spark_error)
    except Exception:  # noqa: BLE001 - the session is gone: Spark's error cannot be read
        return False
