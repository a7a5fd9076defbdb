"""The ``StreamingQuery`` a :class:`~spate.spark.stream.StatefulStream` starts: Spark's own, but a query that
stopped because a batch failed raises spate's error first.

Spark wraps whatever ``foreachBatch`` raised in a ``StreamingQueryException`` whose text starts with Py4J's
boilerplate and the driver's frames; spate's message (the processor, key, batch and field, and the fix) comes
dozens of lines later. The stream remembers the exception its ``foreachBatch`` raised, and
:meth:`SpateQuery.awaitTermination`, :meth:`SpateQuery.processAllAvailable` and :meth:`SpateQuery.exception`
give a :class:`~spate.spark.worker_errors.BatchFailedError` instead: its message is spate's, Spark's exception is
its ``spark_error`` (and ``__context__``), and Spark's trace is in Spark's log. A query that failed for another
reason (a source's error) raises Spark's exception unchanged.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pyspark.errors import StreamingQueryException
from pyspark.sql.streaming.query import StreamingQuery

from spate.spark.worker_errors import BatchFailedError, mentions, told


@dataclass
class BatchFailure:
    """What a batch's ``foreachBatch`` raised on the driver, with its frames there."""

    batch_id: int
    error: BaseException
    traceback: types.TracebackType | None


class SpateQuery(StreamingQuery):
    """Spark's ``StreamingQuery`` (every method and property as Spark's), whose failure is told by spate.

    ``awaitTermination()`` and ``processAllAvailable()`` raise, and ``exception()`` returns, a
    :class:`~spate.spark.worker_errors.BatchFailedError` when a batch failed: ``str()`` starts with spate's
    message; it is a ``pyspark.errors.StreamingQueryException`` too; ``spark_error`` is Spark's exception."""

    def __init__(self, jsq: Any, failure: Callable[[], BatchFailure | None]) -> None:
        super().__init__(jsq)
        self._failure = failure

    def awaitTermination(self, timeout: int | None = None) -> bool | None:  # noqa: N802 - Spark's API
        """As Spark's; raises :class:`~spate.spark.worker_errors.BatchFailedError` if a batch failed."""
        try:
            return super().awaitTermination(timeout)
        except StreamingQueryException as e:
            raise self._told(e) from None

    def processAllAvailable(self) -> None:  # noqa: N802 - Spark's API
        """As Spark's; raises :class:`~spate.spark.worker_errors.BatchFailedError` if a batch failed."""
        try:
            super().processAllAvailable()
        except StreamingQueryException as e:
            raise self._told(e) from None

    def exception(self) -> StreamingQueryException | None:
        """As Spark's: None while the query runs or if it stopped cleanly, else the
        :class:`~spate.spark.worker_errors.BatchFailedError` of the batch that failed (Spark's exception if the
        query failed outside spate's batches)."""
        spark_error = super().exception()
        return None if spark_error is None else self._told(spark_error)

    def _told(self, spark_error: StreamingQueryException) -> StreamingQueryException:
        failure = self._failure()
        if failure is None or isinstance(spark_error, BatchFailedError) or not mentions(spark_error, failure.error):
            return spark_error
        return told(failure.error, failure.batch_id, failure.traceback, spark_error)
