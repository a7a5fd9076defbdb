"""One run of a :class:`~spate.spark.stream.StatefulStream` on a classic session: what a ``start()`` owns, from the
take-over of the checkpoint root to the end of its ``StreamingQuery``. Its micro-batches are
:class:`~spate.spark.micro_batches.MicroBatches`' whose job runs every subtask where its state lives
(:mod:`spate.spark.subtask_job`); Spark's own checkpoint is synced into the root first thing in each batch.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

from spate.checkpoint.protocol import SubtaskAck
from spate.runtime.autoscale import progress_observation
from spate.runtime.query import QueryDriver
from spate.sinks.table_sink import TableSink
from spate.spark.executors import ExecutorCheck
from spate.spark.micro_batches import MicroBatches
from spate.spark.placement import Placement
from spate.spark.query import BatchFailure, SpateQuery
from spate.spark.settings import SpateSettings
from spate.spark.spark_checkpoint import QueryFolder, SparkCheckpoint, check_locations, open_spark_checkpoint
from spate.spark.stream_definition import Sink, StartOptions, StreamDefinition
from spate.spark.stream_metrics import BatchMetrics, StreamFigures
from spate.spark.subtask_job import JobCounter, SubtaskJob
from spate.spark.task import TaskSpec
from spate.spark.ticks import WakeFile, logs_ticks, with_ticks, without_ticks
from spate.spark.worker_errors import BatchFailedError

log = logging.getLogger(__name__)


class StreamRun:
    """One ``start()`` of ``stream`` at ``settings``: on construction, the take-over of the root by its
    :class:`QueryDriver`, the spec of its tasks (:class:`TaskSpec`) and their Spark job, and its sink (a function
    of the outputs' DataFrame and the batch id, or a :class:`TableSink`); :meth:`start` starts its
    ``StreamingQuery``, with Spark's checkpoint, the tick source's wake file and the query's driver-local folder.
    Each batch's figures go to the stream's ``figures``, and where each subtask's state lives to its
    ``placement``.

    Raises:
        SettingError: a location Spark or spate cannot use (the root, ``spark_checkpoint``, the cache), or staged
            outputs the root cannot hold.
        CheckpointError: the root cannot be taken over. FencedError: another driver took it over meanwhile.
    """

    def __init__(self, stream: StreamDefinition, settings: SpateSettings, sink: Sink | TableSink | None,
                 options: StartOptions, *, figures: StreamFigures, placement: Placement) -> None:
        spark = stream.spark
        check_locations(spark, settings.checkpoint_root, options.spark_checkpoint, options.spark_checkpoint_cache)
        self.stream, self.options, self.figures = stream, options, figures
        self._executor_check: ExecutorCheck | None = ExecutorCheck(spark)  # until the first batch asks it
        self.batches = MicroBatches(stream, settings, sink, figures,
                                    lambda spec: SubtaskJob(spark, spec, stream.initial_state, placement))
        self.batches.session = spark  # the sink reads the outputs with the user's session
        self.batches.on_complete = lambda done: placement.record(self.driver.parallelism, done.acks)
        assert self.driver.coordinator.query is not None  # the driver started its coordinator
        self._folder = QueryFolder(options.spark_checkpoint_cache, self.driver.coordinator.query.query_id)
        self.query: SpateQuery | None = None  # the StreamingQuery, once started
        self.spark_checkpoint: SparkCheckpoint | None = None
        self.wake: WakeFile | None = None  # where the tick source learns when a batch without input is due
        self._failure: BatchFailure | None = None  # what this run's foreachBatch raised
        self._batches_done = 0  # batches of this run that returned to Spark

    @property
    def driver(self) -> QueryDriver:
        return self.batches.driver

    @property
    def spec(self) -> TaskSpec:
        return self.batches.spec

    # -- the query ---------------------------------------------------------------------------------------
    def start(self) -> SpateQuery:
        """Start the run's ``StreamingQuery``; whether executors can import spate is checked beside the first
        batch. A failure to start removes what the run created on the driver's disk."""
        check = self._executor_check
        assert check is not None
        try:  # the tick source's Python may fail already: then the check's error
            self.query = SpateQuery(check.guard(self._start_query, confirm=False)._jsq, self._failed)
        except BaseException:
            self._remove_local_leftovers()
            raise
        self.figures.listener.attach(self.query.id)
        return self.query

    def _start_query(self) -> Any:
        stream, options, driver = self.stream, self.options, self.driver
        self.spark_checkpoint = open_spark_checkpoint(stream.spark, driver.coordinator, options.spark_checkpoint,
                                                      options.spark_checkpoint_cache)
        self.figures.redelivered.extend(driver.redeliver())  # outputs of complete checkpoints the sink missed
        source = stream.df
        if stream.idle_batches or logs_ticks(self.spark_checkpoint.newest_offsets()):
            self.wake = WakeFile(os.path.join(self._folder.path, "wake.json"))
            self._write_wake()
            source = with_ticks(source, self.wake, options.trigger)
        writer = source.writeStream.foreachBatch(self._process_batch).option(
            "checkpointLocation", self.spark_checkpoint.location)
        if options.trigger:
            writer = writer.trigger(**options.trigger)
        if options.query_name:
            writer = writer.queryName(options.query_name)
        listener = self.figures.listener
        listener.register(stream.spark)
        try:
            return writer.start()
        except BaseException:
            listener.attach(None)
            listener.unregister()
            raise

    def _write_wake(self) -> None:
        """Tell the tick source when the batch after the latest checkpoint is due without input."""
        if self.wake is not None:
            latest = self.driver.latest
            self.wake.write(latest.checkpoint_id if latest is not None else -1, self.driver.idle_batch_due_at)

    def _process_batch(self, batch_df: Any, batch_id: int) -> None:
        """``foreachBatch``: the batch without the tick source's rows, run; a failure stops the query."""
        if self.wake is not None:
            batch_df = without_ticks(batch_df)
        try:
            self._run_batch(batch_df, batch_id)
        except BaseException as e:  # the query stops: remember the failure for awaitTermination, clean up
            self._failure = BatchFailure(batch_id, e, e.__traceback__)
            self._remove_local_leftovers()
            if isinstance(e, BatchFailedError):  # Spark's log gets spate's message, not the driver's frames
                raise e.with_traceback(None) from None
            raise
        self._batches_done += 1
        self._write_wake()

    def _failed(self) -> BatchFailure | None:
        """What failed this run's query (for :class:`SpateQuery`); its local leftovers are removed."""
        self._remove_local_leftovers()
        return self._failure

    def _remove_local_leftovers(self) -> None:
        """The query stopped (or never started): the wake file goes, and the driver-local folder this run
        created, if no batch of the run completed."""
        if self.wake is not None:
            self.wake.remove()
        if self._batches_done == 0:
            self._folder.remove_created()

    def close(self) -> None:
        """Remove the wake file unless the query still runs; let background deletions finish."""
        if self.wake is not None and not self._query_active():
            self.wake.remove()
        self.batches.close()

    def _query_active(self) -> bool:
        try:
            return self.query is not None and bool(self.query.isActive)
        except Exception:  # the session stopped: so did its queries
            return False

    # -- one micro-batch (driver) -----------------------------------------------------------------------
    def _run_batch(self, batch_df: Any, batch_id: int) -> None:
        assert self.spark_checkpoint is not None
        self.spark_checkpoint.sync()  # Spark's offsets of batch n reach the root before checkpoint n can complete
        jobs = JobCounter(self.stream.spark.sparkContext)  # the query's own job group: stop() cancels these jobs
        metrics = self.batches.run(batch_df, batch_id, jobs, self._guarded)
        if metrics is not None:
            self._autoscale(metrics)

    def _guarded(self, run: Callable[[], list[SubtaskAck]]) -> list[SubtaskAck]:
        """The first batch's job runs beside the check that executors can import spate."""
        check, self._executor_check = self._executor_check, None
        return run() if check is None else check.guard(run)

    def _autoscale(self, metrics: BatchMetrics) -> None:
        """Feed the batch to the autoscaler: its duration and rows as spate measured them, the backlog as
        Spark's last query progress reports it; a decision applies from the next batch."""
        driver = self.driver
        if driver.autoscaler is None:
            return
        progress = progress_observation(self.query.lastProgress, driver.parallelism, time.time()) \
            if self.query is not None else None
        driver.autoscale(metrics.batch_id, metrics.batch_ms, metrics.rows,
                         progress.backlog_rows if progress is not None else None)
