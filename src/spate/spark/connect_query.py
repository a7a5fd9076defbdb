"""The ``StreamingQuery`` a stream on a Spark Connect session starts: Spark's own, but a query that stopped
because a batch failed raises spate's error first.

On Connect the batch runs on the server, so the client knows the failure only from the text of Spark's
``StreamingQueryException``: the ``foreachBatch`` process's Python traceback, which ends with the exception spate
raised there (a :class:`~spate.spark.worker_errors.BatchFailedError` holding the processor's error, or the
driver side's own). :class:`ConnectQuery` gives a ``BatchFailedError`` whose message is that exception's,
Spark's exception in ``spark_error``.
"""

from __future__ import annotations

from typing import Any

from pyspark.errors import StreamingQueryException

from spate.spark.worker_errors import BatchFailedError, worker_error

_TOLD = "spate.spark.worker_errors.BatchFailedError: "
_WHERE_SPARK_IS = "Spark's own error, with its trace: this exception's spark_error attribute, and the server's log"


class ConnectQuery:
    """Spark Connect's ``StreamingQuery`` (every other method and property is Spark's), whose failure is told by
    spate: ``awaitTermination()`` and ``processAllAvailable()`` raise, and ``exception()`` returns, a
    :class:`~spate.spark.worker_errors.BatchFailedError` when a batch failed in spate's ``foreachBatch``."""

    def __init__(self, query: Any) -> None:
        self._query = query

    def __getattr__(self, name: str) -> Any:
        return getattr(self._query, name)

    def awaitTermination(self, timeout: int | None = None) -> bool | None:  # noqa: N802 - Spark's API
        """As Spark's; raises :class:`~spate.spark.worker_errors.BatchFailedError` if a batch failed."""
        try:
            return self._query.awaitTermination(timeout)
        except StreamingQueryException as e:
            raise told_remote(e) from None

    def processAllAvailable(self) -> None:  # noqa: N802 - Spark's API
        """As Spark's; raises :class:`~spate.spark.worker_errors.BatchFailedError` if a batch failed."""
        try:
            self._query.processAllAvailable()
        except StreamingQueryException as e:
            raise told_remote(e) from None

    def exception(self) -> StreamingQueryException | None:
        """As Spark's: None while the query runs or if it stopped cleanly, else spate's error of the batch that
        failed (Spark's exception if the query failed outside spate's batches)."""
        spark_error = self._query.exception()
        return None if spark_error is None else told_remote(spark_error)


def told_remote(spark_error: StreamingQueryException) -> StreamingQueryException:
    """Spark's error of a query whose ``foreachBatch`` ran on the server, told with the exception spate's function
    raised there; Spark's own error unchanged if it holds none (a source failed, say)."""
    summary = worker_error(str(spark_error))
    if summary is None or "spate." not in summary:
        return spark_error
    message = summary[len(_TOLD):] if summary.startswith(_TOLD) else f"a batch failed on the server: {summary}"
    kind = summary.partition(":")[0]
    out = BatchFailedError(message, batch_id=_batch_id(message), spark_error=spark_error,
                           worker_type=None if kind.endswith("BatchFailedError") else kind)
    out.add_note(_WHERE_SPARK_IS)
    return out


def _batch_id(message: str) -> int:
    """The batch a message of :func:`~spate.spark.worker_errors.batch_failed` names (``batch 3 failed ...``), -1
    if it names none."""
    words = message.split()
    if len(words) > 1 and words[0] == "batch" and words[1].isdigit():
        return int(words[1])
    return -1
