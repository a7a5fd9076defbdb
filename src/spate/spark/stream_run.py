"""One run of a :class:`~spate.spark.stream.StatefulStream`: what a ``start()`` owns, from the take-over of the
checkpoint root to the end of its ``StreamingQuery``, and the driver side of each of its micro-batches.

Per micro-batch (``foreachBatch(df, n)`` on the driver) the :class:`~spate.runtime.query.QueryDriver` plans
checkpoint n, the batch's one Spark job runs every subtask where its state lives and collects the acks
(:mod:`spate.spark.subtask_job`), the coordinator completes checkpoint n, and only then does the sink get the
batch's outputs (already staged in the checkpoint: a crash before the sink finished re-delivers them with the
same batch id). A batch Spark replays after checkpoint n completed is not processed again.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import pyarrow as pa

from spate.checkpoint.metadata import CheckpointMetadata
from spate.checkpoint.protocol import SubtaskAck, SubtaskPlan
from spate.fs import storage_for
from spate.runtime.autoscale import AutoscalePolicy, progress_observation
from spate.runtime.idle import IdleBatches
from spate.runtime.query import QueryDriver
from spate.runtime.subtask import ProcessorFactory
from spate.sinks.table_sink import TableSink
from spate.spark.executors import ExecutorCheck
from spate.spark.placement import Placement
from spate.spark.query import BatchFailure, SpateQuery
from spate.spark.settings import SpateSettings
from spate.spark.spark_checkpoint import QueryFolder, SparkCheckpoint, check_locations, open_spark_checkpoint
from spate.spark.staged import StagedOutputs, staged_format
from spate.spark.stream_metrics import BatchMetrics, JobFigures, StreamFigures
from spate.spark.subtask_job import InitialState, JobCounter, SubtaskJob
from spate.spark.task import TaskSpec
from spate.spark.ticks import TICK_COLUMN, WakeFile, logs_ticks, with_ticks
from spate.spark.worker_errors import BatchFailedError

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

log = logging.getLogger(__name__)
Sink = Callable[[Any, int], None]  # the sink's function: (a batch's outputs as a DataFrame, its batch id)


@dataclass(frozen=True)
class StreamDefinition:
    """What a stream is, fixed when it is built (:class:`~spate.spark.stream.StatefulStream`'s arguments, checked):
    its streaming DataFrame, key columns, the factory of its processor, the schema of its outputs (a
    ``StructType``, and as Arrow: what the outputs are checked against), the initial state of a new query,
    when a batch without input is due (``idle``) and whether the query runs such batches (``idle_batches``),
    whether batches that recover state say so on standard error (``progress``; None: on a terminal) and its
    autoscaling policy."""

    df: Any
    key_columns: tuple[str, ...]
    factory: ProcessorFactory
    output_schema: StructType
    arrow_output_schema: pa.Schema
    initial_state: InitialState | None
    idle: IdleBatches
    idle_batches: bool
    progress: bool | None
    autoscale: AutoscalePolicy | None

    @property
    def spark(self) -> Any:
        return self.df.sparkSession


@dataclass(frozen=True)
class StartOptions:
    """How a run's ``StreamingQuery`` starts (:meth:`StatefulStream.start`'s keyword arguments): Spark's trigger,
    the query's name, and where Spark's own checkpoint is (a location given, or a driver-local cache directory
    spate mirrors into the root)."""

    trigger: dict[str, Any] | None = None
    query_name: str | None = None
    spark_checkpoint: str | None = None
    spark_checkpoint_cache: str | None = None


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
        self.table_sink = sink if isinstance(sink, TableSink) else None
        self.sink = None if self.table_sink is not None else cast("Sink | None", sink)  # not a TableSink
        staged = (staged_format(settings.staged_outputs, storage_for(settings.checkpoint_root),
                                stream.arrow_output_schema) if self.sink else "arrow")
        self.driver = driver = QueryDriver(
            settings, idle=stream.idle, autoscale=stream.autoscale,
            deliver_staged=self._deliver_staged if self.sink is not None else None, table_sink=self.table_sink,
            output_schema=stream.arrow_output_schema, progress=stream.progress)
        self._staged = StagedOutputs(driver.coordinator.storage, stream.output_schema, stream.arrow_output_schema,
                                     settings.allow_pickle)
        # one run id per start(): executors never reuse subtasks (processors) of another run
        self.spec = TaskSpec(uuid.uuid4().hex, stream.factory, settings, stream.key_columns,
                             stream.arrow_output_schema, driver.max_parallelism, stage_outputs=sink is not None,
                             table_sink=self.table_sink, staged_format=staged)
        self.job = SubtaskJob(spark, self.spec, stream.initial_state, placement)
        assert driver.coordinator.query is not None  # the driver started its coordinator
        self._folder = QueryFolder(options.spark_checkpoint_cache, driver.coordinator.query.query_id)
        self.query: SpateQuery | None = None  # the StreamingQuery, once started
        self.spark_checkpoint: SparkCheckpoint | None = None
        self.wake: WakeFile | None = None  # where the tick source learns when a batch without input is due
        self._failure: BatchFailure | None = None  # what this run's foreachBatch raised
        self._batches_done = 0  # batches of this run that returned to Spark
        self._deliver_ms = 0.0  # the last sink call's

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
            from pyspark.sql import functions as F

            batch_df = batch_df.where(F.col(TICK_COLUMN).isNull()).drop(TICK_COLUMN)
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
        self.driver.close()

    def _query_active(self) -> bool:
        try:
            return self.query is not None and bool(self.query.isActive)
        except Exception:  # the session stopped: so did its queries
            return False

    # -- one micro-batch (driver) -----------------------------------------------------------------------
    def _run_batch(self, batch_df: Any, batch_id: int) -> None:
        driver = self.driver
        started = time.perf_counter()
        self._deliver_ms = 0.0
        assert self.spark_checkpoint is not None
        self.spark_checkpoint.sync()  # Spark's offsets of batch n reach the root before checkpoint n can complete
        self.figures.redelivered.extend(driver.redeliver())
        if driver.covered(batch_id):
            log.info("batch %d is covered by a complete checkpoint: not processed again", batch_id)
            self.figures.replayed(batch_id, (time.perf_counter() - started) * 1000)
            return
        driver.apply_rescale(batch_id)
        jobs = JobCounter(self.stream.spark.sparkContext)  # the query's own job group: stop() cancels these jobs
        job: list[JobFigures] = []

        def run_subtasks(plans: list[SubtaskPlan]) -> list[SubtaskAck]:  # the batch's one Spark job
            job_started = time.perf_counter()
            # a long log since the materialization is named, not listed: the plans stay the same size
            sent = [json.dumps(plan.compacted().to_dict()).encode() for plan in plans]
            fresh = plans[0].base_checkpoint_id is None  # a new query: the initial state goes in
            check, self._executor_check = self._executor_check, None  # the first batch asks the check
            run = functools.partial(self.job.run, batch_df, batch_id, sent, with_initial=fresh)
            acks = run() if check is None else check.guard(run)
            job.append(JobFigures(jobs.since(), jobs.last_stage_tasks(),
                                  int((time.perf_counter() - job_started) * 1e6) / 1000, max(map(len, sent))))
            return acks

        done = driver.run_batch(batch_id, run_subtasks,
                                on_complete=lambda d: self.job.placement.record(driver.parallelism, d.acks))
        meta = done.checkpoint
        log.info("checkpoint %d: %s", batch_id, "; ".join(
            f"subtask {i} {st.recovery} on {st.executor or '?'} ({st.restore_bytes} B, {st.restore_ms:.0f} ms)"
            for i, st in enumerate(meta.subtasks)))
        if driver.committer is not None:
            self._deliver_ms = driver.committer.last_commit_ms
        metrics = BatchMetrics.of(meta, job[0], batch_ms=(time.perf_counter() - started) * 1000,
                                  commit_ms=done.commit_ms, deliver_ms=self._deliver_ms)
        self.figures.completed(meta, metrics)
        self._autoscale(metrics)

    def _deliver_staged(self, meta: CheckpointMetadata) -> None:
        """The sink gets a complete checkpoint's outputs, read from where its subtasks staged them."""
        assert self.sink is not None
        started = time.perf_counter()
        self.sink(self._staged.frame(self.stream.spark, meta), meta.checkpoint_id)
        self._deliver_ms = (time.perf_counter() - started) * 1000

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


def run_one_batch(stream: StreamDefinition, settings: SpateSettings, batch_df: Any, *, savepoint_to: str) -> None:
    """Run the batch DataFrame ``batch_df`` as the one batch of a new query of ``stream`` (spate's job, without a
    streaming query) and copy its checkpoint to ``savepoint_to`` (:meth:`StatefulStream.run_one_batch`)."""
    driver = QueryDriver(settings)
    try:
        spec = TaskSpec(uuid.uuid4().hex, stream.factory, settings, stream.key_columns, stream.arrow_output_schema,
                        driver.max_parallelism)
        job = SubtaskJob(stream.spark, spec, stream.initial_state, Placement())
        batch_id = driver.next_batch_id
        driver.run_batch(batch_id, lambda plans: job.run(
            batch_df, batch_id, [json.dumps(plan.to_dict()).encode() for plan in plans]))
        driver.savepoint(savepoint_to)
    finally:
        driver.close()
