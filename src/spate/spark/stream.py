"""``StatefulStream``: a spate processor over a streaming DataFrame, started as a real ``StreamingQuery``.

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
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, cast

from spate.checkpoint.coordinator import Coordinator
from spate.checkpoint.metadata import CheckpointMetadata
from spate.checkpoint.protocol import SubtaskAck, SubtaskPlan
from spate.errors import SettingError
from spate.fs import storage_for
from spate.keygroups import MAX_MAX_PARALLELISM, check_parallelism
from spate.runtime.autoscale import AutoscalePolicy, Autoscaler, ScalingDecision, progress_observation
from spate.runtime.idle import IdleBatches
from spate.runtime.processor import Processor
from spate.runtime.query import QueryDriver
from spate.runtime.subtask import AnyProcessor, ProcessorFactory, processor_factory
from spate.sinks.table_sink import TableSink
from spate.spark.adapter import StatefulProcessorAdapter, time_mode_of
from spate.spark.executors import ExecutorCheck
from spate.spark.placement import Placement
from spate.spark.progress import BatchFigures, ProgressListener, SpateProgress
from spate.spark.python_worker import PythonWorkerConf, arrow_schema
from spate.spark.query import BatchFailure, SpateQuery
from spate.spark.settings import SpateSettings
from spate.spark.spark_checkpoint import (
    SPARK_CHECKPOINT_DIR,  # noqa: F401  (re-exported)
    QueryFolder,
    SparkCheckpoint,
    check_locations,
    open_spark_checkpoint,
)
from spate.spark.staged import staged_format, staged_outputs_frame
from spate.spark.stream_inputs import key_columns_of, output_schema_of, settings_of
from spate.spark.stream_metrics import BatchMetrics, summarize
from spate.spark.subtask_job import JobCounter, SubtaskJob, initial_state_of
from spate.spark.ticks import TICK_COLUMN, WakeFile, logs_ticks, ticks_by_default, with_ticks
from spate.spark.tws_handle import declared_states
from spate.spark.worker_errors import BatchFailedError

log = logging.getLogger(__name__)
Sink = Callable[[Any, int], None]
METRICS_KEPT = 1000  # the latest batches' metrics a stream keeps (its summary is over these)


class StatefulStream:
    """Run ``processor`` keyed by ``key`` over the streaming DataFrame ``df``.

    Args:
        df: a streaming DataFrame.
        key: the key column(s).
        processor: a spate :class:`Processor` or :class:`BatchProcessor` (instance, class or factory), shipped
            to executors.
        output_schema: schema of the rows the processor yields (``StructType`` or DDL string).
        settings: a :class:`SpateSettings`; defaults come from the Spark conf (``spark.spate.*``) and keyword
            arguments override both (``checkpoint_root=...``, ``parallelism=...``, ...).
        autoscale: an :class:`AutoscalePolicy`: after each batch the stream rescales itself online when the
            policy decides so, from the batch's duration and the input backlog Spark's query progress reports
            (Kafka's offsets behind latest); :meth:`summary` and each rescaling checkpoint say what it decided.
        idle_batches: run a batch without input when a timer is due or the watermark moves (Spark does this
            for its own stateful operators), by adding a source of ticks to the query (:mod:`spate.spark.ticks`).
            On by default for processors with timers (per-key ones that do not declare ``may_have_timers =
            False``, as a ``StatefulProcessor`` in time mode ``None`` does, and a :class:`BatchProcessor` that
            defines ``on_timers``) from pyspark 4.2 on, unless the session turns Spark's own off
            (``spark.sql.streaming.noDataMicroBatches.enabled=false``); before 4.2, opt in (there
            ``Trigger.AvailableNow`` then runs as one batch). It changes the sources of Spark's checkpoint, so
            a root whose Spark checkpoint logged the ticks keeps them, whatever this says.
        progress: a line on the driver's standard error before and after a batch that restores or rescales
            state (which can take long); None (the default): only when standard error is a terminal. Always
            logged at INFO (``spate.runtime.recovery_progress``).

    :meth:`rescale` changes the parallelism of the running query from its next batch on (no restart).

    Raises:
        SettingError: ``df`` is not streaming, a key column is not one of its columns, ``output_schema`` is
            neither a ``StructType`` nor a DDL string, or a setting cannot work (a parallelism beyond the max
            parallelism is an :class:`~spate.errors.InvalidParallelismError`).
        ProcessorError: ``processor`` is neither a processor nor a class or factory of one.
    """

    def __init__(self, df: Any, key: str | Sequence[str],
                 processor: AnyProcessor | type[AnyProcessor] | ProcessorFactory, output_schema: Any,
                 settings: SpateSettings | None = None, initial_state: Any = None,
                 autoscale: AutoscalePolicy | None = None, idle_batches: bool | None = None,
                 progress: bool | None = None, **overrides: Any) -> None:
        self.key_columns = key_columns_of(df, key)
        self.df = df
        self.spark = df.sparkSession
        self.factory = processor_factory(processor)
        if idle_batches is None:
            idle_batches = ticks_by_default(processor, self.spark)
        self.idle_batches = idle_batches
        self.progress = progress
        self._idle = IdleBatches.of(processor) if isinstance(processor, (Processor, type)) else IdleBatches()
        self._wake: WakeFile | None = None
        self.initial_state = initial_state_of(initial_state, self.key_columns)
        self.output_schema = output_schema_of(output_schema)
        self.arrow_output_schema = arrow_schema(self.output_schema)  # what the outputs are checked against
        settings = settings_of(self.spark, settings, overrides)
        self._settings = settings  # until start(); then the query driver's
        self._driver: QueryDriver | None = None
        self.sink: Sink | None = None
        self.table_sink: TableSink | None = None
        self.run_id = ""  # one per start(): executors never reuse subtasks (processors) of another run
        self.metrics: deque[BatchMetrics] = deque(maxlen=METRICS_KEPT)
        self.figures = BatchFigures()  # spate's figures of the latest batches, for the query's progress
        self._progress = ProgressListener(self.figures)
        self.redelivered: list[int] = []
        self.placement = Placement()  # where each subtask's state lives, learned from the acks
        self._job = SubtaskJob(self.spark, self.key_columns, self.factory, self.arrow_output_schema,
                               self.initial_state, self.placement)
        self._deliver_ms = 0.0  # the last sink call's
        self.staged_format = "arrow"  # how subtasks stage outputs for the sink: "parquet" where Spark reads them
        self.query: SpateQuery | None = None  # the StreamingQuery, once started
        self._failure: BatchFailure | None = None  # what this run's foreachBatch raised
        self._executor_check: ExecutorCheck | None = None  # until the first batch of a run asks it
        self._folder: QueryFolder | None = None  # this run's driver-local folder
        self._batches_done = 0  # batches of this run that returned to Spark
        self._autoscale_policy = autoscale

    @property
    def settings(self) -> SpateSettings:
        """The query's settings (once started, the parallelism follows every rescale)."""
        return self._driver.settings if self._driver is not None else self._settings

    @property
    def coordinator(self) -> Coordinator | None:
        """The query's coordinator, once started."""
        return self._driver.coordinator if self._driver is not None else None

    @property
    def autoscaler(self) -> Autoscaler | None:
        return self._driver.autoscaler if self._driver is not None else None

    @property
    def rescales(self) -> list[dict[str, Any]]:
        """The latest online rescales: batch, from, to, reason."""
        return [r.to_dict() for r in self._driver.rescales] if self._driver is not None else []

    # -- starting --------------------------------------------------------------------------------------
    def start(self, sink: Sink | TableSink | None = None, *, trigger: dict[str, Any] | None = None,
              spark_checkpoint: str | None = None, query_name: str | None = None,
              spark_checkpoint_cache: str | None = None) -> Any:
        """Start the query. ``sink(outputs_df, batch_id)`` runs after each batch's checkpoint completed (at
        least once per batch id, so an idempotent sink gets exactly once); ``outputs_df`` reads the batch's
        staged outputs and is valid during the call only, like ``foreachBatch``'s own. ``trigger`` is passed to
        ``DataStreamWriter.trigger`` (e.g. ``{"availableNow": True}``). Returns the ``StreamingQuery``, a
        :class:`~spate.spark.query.SpateQuery`: if a batch fails, its ``awaitTermination()`` and
        ``processAllAvailable()`` raise (and ``exception()`` returns) a
        :class:`~spate.spark.worker_errors.BatchFailedError` whose message is spate's (the processor, key, batch
        and what to fix), with Spark's ``StreamingQueryException`` in its ``spark_error``.

        ``sink`` may instead be a table sink (:class:`~spate.sinks.ParquetSink`, :class:`~spate.sinks.DeltaSink`,
        :class:`~spate.sinks.IcebergSink`): each subtask writes its outputs as a data file of the table in the
        batch's own Spark job, and the driver commits them to the table once the checkpoint completed, exactly
        once, with no second job reading the outputs back (:mod:`spate.sinks.table_sink`).

        Spark's own checkpoint is ``spark_checkpoint`` if given (a location Hadoop opens), else
        ``<checkpoint_root>/_spark`` for a local, ``file://`` or ``hdfs://`` root, else (``s3://`` and other
        ``pyarrow.fs`` URIs) a driver-local directory under ``spark_checkpoint_cache`` (default
        ``~/.spate/spark-checkpoints``) that spate copies to ``<checkpoint_root>/_spark`` every batch and restores
        from it on start (:mod:`spate.spark.spark_checkpoint`). A run that fails before any batch completed
        removes the driver-local folder it created there.

        First checks the locations, before touching the checkpoint root; whether executors can import spate is
        checked beside the first batch, which fails with an :class:`~spate.spark.executors.ExecutorPythonError`
        if they cannot (:class:`~spate.spark.executors.ExecutorCheck`).

        Raises:
            SettingError: a location Spark or spate cannot use (the root, ``spark_checkpoint``, the cache).
            CheckpointError: the root cannot be taken over (:class:`~spate.errors.NotARootError`: a folder that
                was never a spate root; another query's root; a Spark checkpoint behind spate's).
            FencedError: another driver took the root over meanwhile."""
        s = self.settings
        check_locations(self.spark, s.checkpoint_root, spark_checkpoint, spark_checkpoint_cache)
        self._executor_check = ExecutorCheck(self.spark)
        self.table_sink = sink if isinstance(sink, TableSink) else None
        self.sink = None if self.table_sink is not None else cast("Sink | None", sink)  # not a TableSink
        self.staged_format = (staged_format(s.staged_outputs, storage_for(s.checkpoint_root),
                                            self.arrow_output_schema) if self.sink else "arrow")
        self.run_id = uuid.uuid4().hex
        previous = self._driver  # a start after close(): its parallelism (in s) and a rescale not applied yet go on
        self._driver = driver = QueryDriver(s, idle=self._idle, autoscale=self._autoscale_policy,
                                            deliver_staged=self._deliver_staged if self.sink is not None else None,
                                            table_sink=self.table_sink, output_schema=self.arrow_output_schema,
                                            progress=self.progress)
        if previous is not None and previous.requested_rescale is not None:
            driver.request_rescale(*previous.requested_rescale)
        self.figures.start_from(driver.latest)
        assert driver.coordinator.query is not None  # the driver started its coordinator
        self._failure, self._batches_done, self._wake = None, 0, None
        self._folder = QueryFolder(spark_checkpoint_cache, driver.coordinator.query.query_id)
        try:  # the tick source's Python may fail already: then the check's error
            self.query = SpateQuery(self._executor_check.guard(lambda: self._start_query(
                sink, trigger, spark_checkpoint, query_name, spark_checkpoint_cache), confirm=False)._jsq, self._failed)
        except BaseException:
            self._remove_local_leftovers()
            raise
        self._progress.attach(self.query.id)
        return self.query

    def _start_query(self, sink: Any, trigger: dict[str, Any] | None, spark_checkpoint: str | None,
                     query_name: str | None, spark_checkpoint_cache: str | None) -> Any:
        driver, folder = self._driver, self._folder
        assert driver is not None and folder is not None
        self.spark_checkpoint: SparkCheckpoint = open_spark_checkpoint(self.spark, driver.coordinator,
                                                                       spark_checkpoint, spark_checkpoint_cache)
        self.redelivered.extend(driver.redeliver())  # outputs of complete checkpoints the sink did not confirm
        source = self.df
        if self.idle_batches or logs_ticks(self.spark_checkpoint.newest_offsets()):
            self._wake = WakeFile(os.path.join(folder.path, "wake.json"))
            self._write_wake()
            source = with_ticks(source, self._wake, trigger)
        writer = source.writeStream.foreachBatch(self._process_batch).option(
            "checkpointLocation", self.spark_checkpoint.location)
        if trigger:
            writer = writer.trigger(**trigger)
        if query_name:
            writer = writer.queryName(query_name)
        self._progress.register(self.spark)
        try:
            return writer.start()
        except BaseException:
            self._progress.attach(None)
            self._progress.unregister()
            raise

    def run_one_batch(self, batch_df: Any, savepoint_to: str) -> None:
        """Run the batch DataFrame ``batch_df`` as the one batch of a new query (spate's job, without a streaming
        query) and copy its checkpoint to ``savepoint_to``: how state is bootstrapped from a table
        (:mod:`spate.spark.state_frame`)."""
        self.run_id = uuid.uuid4().hex
        self._driver = driver = QueryDriver(self._settings)
        try:
            batch_id = driver.next_batch_id
            driver.run_batch(batch_id, lambda plans: self._run_job(
                batch_df, batch_id, [json.dumps(plan.to_dict()).encode() for plan in plans]))
            driver.savepoint(savepoint_to)
        finally:
            driver.close()

    # -- progress ----------------------------------------------------------------------------------------
    def add_listener(self, listener: Any) -> None:
        """Give ``listener`` (a ``pyspark.sql.streaming.StreamingQueryListener``) this stream's query events,
        its progress events with spate's figures in them: a ``stateOperators`` entry named ``spate`` and
        ``observedMetrics["spate"]`` (:class:`~spate.spark.progress.SpateProgress`). Add it before ``start``
        to get the first events."""
        self._progress.listeners.append(listener)

    def remove_listener(self, listener: Any) -> None:
        self._progress.listeners.remove(listener)

    @property
    def last_progress(self) -> Any:
        """The query's latest ``StreamingQueryProgress`` with spate's figures (as :meth:`add_listener`'s
        listeners get it), None before the first. Spark's listener bus delivers it shortly after the batch; it is
        set here once the stream's listeners have seen it."""
        return self._progress.recent[-1] if self._progress.recent else None

    @property
    def recent_progress(self) -> list[Any]:
        """The latest progress updates (up to 100), oldest first, with spate's figures."""
        return list(self._progress.recent)

    def rescale(self, parallelism: int, reason: str = "requested") -> None:
        """Run the query at ``parallelism`` subtasks from its next batch on, without stopping it. Keyed state
        is redistributed by key group and operator state by the FLIP-8 rules, as on a restart; each new subtask
        builds its lmdb state from the old subtasks' local copies on its executor (the batch prefers the
        executor holding the largest part of its key groups) and reads from checkpoint storage only what no
        copy there holds. Refused beyond the max parallelism. Callable from any thread."""
        if self._driver is None:  # not started: it starts at that parallelism
            check_parallelism(parallelism, MAX_MAX_PARALLELISM)
            self._settings = self._settings.replace(parallelism=parallelism)
            return
        self._driver.request_rescale(parallelism, reason)

    def _autoscale(self, metrics: BatchMetrics) -> None:
        """Feed the batch to the autoscaler: its duration and rows as spate measured them, the backlog as
        Spark's last query progress reports it; a decision applies from the next batch."""
        if self._driver is None or self._driver.autoscaler is None:
            return
        progress = progress_observation(self.query.lastProgress, self.settings.parallelism, time.time()) \
            if self.query is not None else None
        self._driver.autoscale(metrics.batch_id, metrics.batch_ms, metrics.rows,
                               progress.backlog_rows if progress is not None else None)

    @property
    def decisions(self) -> list[ScalingDecision]:
        """What the autoscaling policy decided so far (empty without one)."""
        return self._driver.decisions if self._driver is not None else []

    def close(self) -> None:
        """Let background deletions finish and stop passing on the query's events (call after the query
        stopped)."""
        self._progress.close()
        if self._wake is not None and not self._query_active():
            self._wake.remove()
        if self._driver is not None:
            self._driver.close()

    def _query_active(self) -> bool:
        try:
            return self.query is not None and bool(self.query.isActive)
        except Exception:  # the session stopped: so did its queries
            return False

    def __getattr__(self, name: str) -> Any:
        if name in _DATAFRAME_ONLY:
            raise AttributeError(
                f"StatefulStream has no {name!r}: its outputs are not a streaming DataFrame, so a streaming "
                f"operator (an aggregation, a join, withWatermark, writeStream) cannot follow it. Each batch's "
                f"outputs reach start(sink) as a DataFrame once the batch's checkpoint completed: apply {name} "
                "there for per-batch work, or have the sink append them to a table (Delta, Iceberg, Kafka) and "
                "read that as a stream for a further stateful operator")
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    # -- one micro-batch (driver) -----------------------------------------------------------------------
    def _write_wake(self) -> None:
        """Tell the tick source when the batch after the latest checkpoint is due without input."""
        assert self._driver is not None
        if self._wake is not None:
            latest = self._driver.latest
            self._wake.write(latest.checkpoint_id if latest is not None else -1, self._driver.idle_batch_due_at)

    def _process_batch(self, batch_df: Any, batch_id: int) -> None:
        if self._wake is not None:
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
        if self._wake is not None:
            self._wake.remove()
        if self._folder is not None and self._batches_done == 0:
            self._folder.remove_created()

    def _run_batch(self, batch_df: Any, batch_id: int) -> None:
        driver = self._driver
        assert driver is not None
        started = time.perf_counter()
        self._deliver_ms = 0.0
        self.spark_checkpoint.sync()  # Spark's offsets of batch n reach the root before checkpoint n can complete
        self.redelivered.extend(driver.redeliver())
        if driver.covered(batch_id):
            log.info("batch %d is covered by a complete checkpoint: not processed again", batch_id)
            self.metrics.append(BatchMetrics(batch_id, 0, (time.perf_counter() - started) * 1000, 0.0,
                                             replayed=True))
            self.figures.add(SpateProgress(batch_id, batch_ms=round(self.metrics[-1].batch_ms, 3), replayed=True))
            return
        driver.apply_rescale(batch_id)
        jobs = JobCounter(self.spark.sparkContext)  # the query's own job group: stop() cancels these jobs
        sent: list[bytes] = []
        spark: dict[str, int] = {}

        def run_subtasks(plans: list[SubtaskPlan]) -> list[SubtaskAck]:  # the batch's one Spark job
            job_started = time.perf_counter()
            # a long log since the materialization is named, not listed: the plans stay the same size
            sent.extend(json.dumps(plan.compacted().to_dict()).encode() for plan in plans)
            fresh = plans[0].base_checkpoint_id is None  # a new query: the initial state goes in
            check, self._executor_check = self._executor_check, None  # the first batch asks the check
            job = functools.partial(self._run_job, batch_df, batch_id, sent, with_initial=fresh)
            acks = job() if check is None else check.guard(job)
            spark.update(jobs=jobs.since(), tasks=jobs.last_stage_tasks(),
                         job_us=int((time.perf_counter() - job_started) * 1e6))
            return acks

        done = driver.run_batch(batch_id, run_subtasks,
                                on_complete=lambda d: self.placement.record(self.settings.parallelism, d.acks))
        meta = done.checkpoint
        log.info("checkpoint %d: %s", batch_id, "; ".join(
            f"subtask {i} {st.recovery} on {st.executor or '?'} ({st.restore_bytes} B, {st.restore_ms:.0f} ms)"
            for i, st in enumerate(meta.subtasks)))
        if driver.committer is not None:
            self._deliver_ms = driver.committer.last_commit_ms
        m = BatchMetrics.of(meta, (time.perf_counter() - started) * 1000, done.commit_ms, spark, sent,
                            self._deliver_ms)
        self.metrics.append(m)
        self.figures.record(meta, batch_ms=m.batch_ms, checkpoint_ms=m.checkpoint_ms, job_ms=m.job_ms,
                            deliver_ms=m.deliver_ms)
        self._autoscale(self.metrics[-1])

    def _run_job(self, batch_df: Any, batch_id: int, plans: list[bytes], with_initial: bool = False
                 ) -> list[SubtaskAck]:
        """The batch's one Spark job (:class:`~spate.spark.subtask_job.SubtaskJob`) at the driver's parallelism."""
        driver = self._driver
        assert driver is not None
        return self._job.run(batch_df, batch_id, plans, driver.settings, driver.max_parallelism, self.run_id,
                             self.sink is not None or self.table_sink is not None, with_initial, self.table_sink,
                             self.staged_format)

    def _deliver_staged(self, meta: CheckpointMetadata) -> None:
        """The sink gets a complete checkpoint's outputs, read from where its subtasks staged them."""
        assert self.sink is not None
        started = time.perf_counter()
        self.sink(self._staged_outputs(meta), meta.checkpoint_id)
        self._deliver_ms = (time.perf_counter() - started) * 1000

    def _staged_outputs(self, meta: CheckpointMetadata) -> Any:
        """The sink's DataFrame of checkpoint ``meta``: its outputs, read from checkpoint storage."""
        assert self.coordinator is not None
        return staged_outputs_frame(self.spark, self.coordinator.storage, meta, self.output_schema,
                                    self.arrow_output_schema, self.settings.allow_pickle)

    # -- figures ----------------------------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        """:func:`~spate.spark.stream_metrics.summarize` over the latest ``METRICS_KEPT`` batches, with the current
        parallelism, the online rescales and the autoscaler's decisions."""
        return summarize(self.metrics) | {"parallelism": self.settings.parallelism, "rescales": self.rescales,
                                          "decisions": [d.to_dict() for d in self.decisions]}


_DATAFRAME_ONLY = frozenset({
    "groupBy", "groupby", "agg", "select", "selectExpr", "filter", "where", "withColumn", "withColumns", "join",
    "union", "unionByName", "withWatermark", "writeStream", "dropDuplicates", "dropDuplicatesWithinWatermark",
    "transformWithState", "transformWithStateInPandas", "applyInPandasWithState", "count", "collect", "show",
})


OUTPUT_MODES = ("Update", "Append")


def transform_with_state(df: Any, key: str | Sequence[str], processor: Any, output_schema: Any, *,
                         time_mode: str = "None", flavour: str = "pandas", output_mode: str = "Update",
                         event_time_column: str | None = None, watermark_delay_ms: int = 0,
                         initial_state: Any = None, settings: SpateSettings | None = None,
                         **overrides: Any) -> StatefulStream:
    """The spate equivalent of ``df.groupBy(key).transformWithStateInPandas(processor, output_schema, output_mode,
    time_mode)`` (``flavour="row"``: ``transformWithState``): the same, unchanged ``StatefulProcessor``, with
    state, checkpoints and parallelism owned by spate and Spark's semantics (:mod:`spate.spark.adapter`). With
    ``time_mode="EventTime"`` give the event-time column and the allowed delay (Spark's ``withWatermark``). Call
    ``.start(sink)`` on the result: each batch's outputs reach the sink as a DataFrame. ``initial_state``
    (``batch_df.groupBy(k)``, as Spark takes it) goes to ``handleInitialState`` in the first batch of a new
    query only, before that batch's input.

    The processor's ``init`` runs once here, on a copy, as Spark's driver does: a state schema Spark refuses
    (a NOT NULL field) fails now. The session's settings for Spark's Python worker are read here
    (:class:`~spate.spark.python_worker.PythonWorkerConf`: its time zone, ``maxRecordsPerBatch`` and
    ``maxBytesPerBatch``, the output conversion's), so input and outputs are converted as this session's
    ``transformWithStateInPandas`` converts them.

    Raises :class:`~spate.errors.SettingError` for an ``output_mode`` other than ``"Update"`` or ``"Append"`` and
    for ``"EventTime"`` without ``event_time_column``; and, with Spark's error class in the message and
    ``getCondition()``:
    :class:`~spate.spark.adapter.UnknownTimeModeError` (``time_mode`` is read in any case, as on Spark),
    :class:`~spate.spark.tws_handle.TtlError` (a ``ValueError``: a TTL in time mode ``None``, or one that is not
    positive), :class:`~spate.spark.state_schema.StateSchemaError` (a schema Spark refuses)."""
    if output_mode not in OUTPUT_MODES:
        raise SettingError(f"output_mode {output_mode!r} is not supported: transformWithState emits what the "
                           "processor yields, once (\"Update\" or \"Append\"); for \"Complete\" keep the full result "
                           "in an external table the sink upserts into")
    time_mode = time_mode_of(time_mode)
    if time_mode == "EventTime" and not event_time_column:
        raise SettingError("timeMode 'EventTime' needs event_time_column (and watermark_delay_ms): the column the "
                           "watermark follows, as Spark's withWatermark")
    if event_time_column:
        overrides = {**overrides, "event_time_column": event_time_column, "watermark_delay_ms": watermark_delay_ms}
    declared_states(processor, time_mode)
    adapter = StatefulProcessorAdapter(processor, flavour, time_mode, PythonWorkerConf.of_session(df.sparkSession))
    return StatefulStream(df, key, adapter, output_schema, settings, initial_state=initial_state, **overrides)
