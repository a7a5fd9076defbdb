"""``StatefulStream``: a spate processor over a streaming DataFrame, started as a real ``StreamingQuery``.

The stream is what the user built (its DataFrame, key, processor and settings, checked here) and what it keeps
across its runs (the figures of its batches, where each subtask's state lives); each ``start()`` is a
:class:`~spate.spark.stream_run.StreamRun`, which owns the query driver, the Spark job of each micro-batch and
the ``StreamingQuery``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from spate.checkpoint.coordinator import Coordinator
from spate.errors import SettingError
from spate.keygroups import MAX_MAX_PARALLELISM, check_parallelism
from spate.runtime.autoscale import AutoscalePolicy, Autoscaler, ScalingDecision
from spate.runtime.idle import IdleBatches
from spate.runtime.processor import Processor
from spate.runtime.subtask import AnyProcessor, ProcessorFactory, processor_factory
from spate.sinks.table_sink import TableSink
from spate.spark.adapter import StatefulProcessorAdapter, time_mode_of
from spate.spark.connect_query import ConnectQuery
from spate.spark.connect_run import ConnectRun
from spate.spark.micro_batches import run_one_batch
from spate.spark.placement import Placement
from spate.spark.python_worker import PythonWorkerConf, arrow_schema
from spate.spark.query import SpateQuery
from spate.spark.rescale_requests import RescaleRequest
from spate.spark.sessions import is_connect
from spate.spark.settings import SpateSettings
from spate.spark.spark_checkpoint import SPARK_CHECKPOINT_DIR, SparkCheckpoint  # noqa: F401  (re-exported)
from spate.spark.stream_definition import Sink, StreamDefinition
from spate.spark.stream_inputs import key_columns_of, output_schema_of, settings_of
from spate.spark.stream_metrics import BatchMetrics, StreamFigures, summarize
from spate.spark.stream_run import StartOptions, StreamRun
from spate.spark.subtask_job import initial_state_of
from spate.spark.ticks import root_wake_path, ticks_by_default
from spate.spark.tws_handle import declared_states


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
            On by default for processors with timers (per-key ones that define ``on_timer`` or set
            ``idle_batch_on_watermark_move`` and do not declare ``may_have_timers = False``, as a
            ``StatefulProcessor`` in time mode ``None`` does, or that declare ``may_have_timers = True``, and a
            :class:`BatchProcessor` that defines ``on_timers``; see :func:`~spate.runtime.batch.uses_timers`)
            from pyspark 4.2 on, unless the session turns Spark's own off
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
                 processor: AnyProcessor | type[AnyProcessor] | ProcessorFactory, output_schema: Any, *,
                 settings: SpateSettings | None = None, initial_state: Any = None,
                 autoscale: AutoscalePolicy | None = None, idle_batches: bool | None = None,
                 progress: bool | None = None, **overrides: Any) -> None:
        key_columns = key_columns_of(df, key)
        spark = df.sparkSession
        factory = processor_factory(processor)
        connect = is_connect(spark)
        self._settings = settings_of(spark, settings, overrides)  # until start(); then the run's query driver's
        if idle_batches is None:  # on Connect the tick source's wake file lives in the root: a local one
            idle_batches = ticks_by_default(processor, spark) and (
                not connect or root_wake_path(self._settings.checkpoint_root) is not None)
        idle = IdleBatches.of(processor) if isinstance(processor, (Processor, type)) else IdleBatches()
        initial = initial_state_of(initial_state, key_columns)
        schema = output_schema_of(output_schema)
        self.definition = StreamDefinition(df, key_columns, factory, schema, arrow_schema(schema), initial, idle,
                                           idle_batches, progress, autoscale)
        self._figures = StreamFigures()  # of every run's batches
        self.placement = Placement()  # where each subtask's state lives, learned from the acks
        self._run: StreamRun | None = None  # the latest start() on a classic session
        self._remote: ConnectRun | None = None  # the latest start() on a Spark Connect session

    @property
    def settings(self) -> SpateSettings:
        """The query's settings (once started, the parallelism follows every rescale)."""
        return self._run.driver.settings if self._run is not None else self._settings

    @property
    def coordinator(self) -> Coordinator | None:
        """The query's coordinator, once started."""
        return self._run.driver.coordinator if self._run is not None else None

    @property
    def autoscaler(self) -> Autoscaler | None:
        return self._run.driver.autoscaler if self._run is not None else None

    @property
    def rescales(self) -> list[dict[str, Any]]:
        """The latest online rescales: batch, from, to, reason (on Spark Connect, as the latest checkpoint the
        client saw records them)."""
        if self._remote is not None:
            return self._remote.rescales
        return [r.to_dict() for r in self._run.driver.rescales] if self._run is not None else []

    @property
    def decisions(self) -> list[ScalingDecision]:
        """What the autoscaling policy decided so far (empty without one, and on Spark Connect, where the
        autoscaler runs on the server: there ``rescales`` carry each applied decision's reason)."""
        return self._run.driver.decisions if self._run is not None else []

    @property
    def query(self) -> SpateQuery | ConnectQuery | None:
        """The ``StreamingQuery`` of the latest start, once it started."""
        if self._remote is not None:
            return self._remote.query
        return self._run.query if self._run is not None else None

    @property
    def spark_checkpoint(self) -> SparkCheckpoint | None:
        """Spark's own checkpoint of the latest start, once its query started."""
        return self._run.spark_checkpoint if self._run is not None else None

    @property
    def staged_format(self) -> str:
        """How the latest start's subtasks stage outputs for its function sink: ``"parquet"`` (files Spark reads in
        the JVM) or ``"arrow"`` (read back by Python tasks; also without a function sink)."""
        return self._run.spec.staged_format if self._run is not None else "arrow"

    @property
    def metrics(self) -> Sequence[BatchMetrics]:
        """What each of the latest batches cost (:class:`~spate.spark.stream_metrics.BatchMetrics`), oldest first."""
        return self._figures.metrics

    @property
    def redelivered(self) -> list[int]:
        """The batches whose outputs the sink got again at a start or before a batch (it had not confirmed them)."""
        return self._figures.redelivered

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
            FencedError: another driver took the root over meanwhile.

        On a Spark Connect session (``SparkSession.builder.remote(...)``) the run's driver side (the take-over of
        the root, each batch's checkpoint, the sink) runs in the server's ``foreachBatch`` process, so the checks
        of the root and its take-over happen at the first batch, and their errors stop the query
        (:mod:`spate.spark.connect_run`, which also says what Connect cannot do yet)."""
        options = StartOptions(trigger, query_name, spark_checkpoint, spark_checkpoint_cache)
        if is_connect(self.definition.spark):
            self._remote = ConnectRun(self.definition, self.settings, sink, options, figures=self._figures)
            return self._remote.start()
        previous = self._run  # a start after close(): its parallelism (in settings) and a rescale not applied go on
        run = StreamRun(self.definition, self.settings, sink, options, figures=self._figures,
                        placement=self.placement)
        self._run = run
        if previous is not None and previous.driver.requested_rescale is not None:
            run.driver.request_rescale(*previous.driver.requested_rescale)
        self._figures.batches.start_from(run.driver.latest)
        return run.start()

    def run_one_batch(self, batch_df: Any, savepoint_to: str) -> None:
        """Run the batch DataFrame ``batch_df`` as the one batch of a new query (spate's job, without a streaming
        query) and copy its checkpoint to ``savepoint_to``: how state is bootstrapped from a table
        (:mod:`spate.spark.state_frame`)."""
        run_one_batch(self.definition, self._settings, batch_df, savepoint_to=savepoint_to)

    # -- progress ----------------------------------------------------------------------------------------
    def add_listener(self, listener: Any) -> None:
        """Give ``listener`` (a ``pyspark.sql.streaming.StreamingQueryListener``) this stream's query events,
        its progress events with spate's figures in them: a ``stateOperators`` entry named ``spate`` and
        ``observedMetrics["spate"]`` (:class:`~spate.spark.progress.SpateProgress`). Add it before ``start``
        to get the first events."""
        self._figures.listener.listeners.append(listener)

    def remove_listener(self, listener: Any) -> None:
        self._figures.listener.listeners.remove(listener)

    @property
    def last_progress(self) -> Any:
        """The query's latest ``StreamingQueryProgress`` with spate's figures (as :meth:`add_listener`'s
        listeners get it), None before the first. Spark's listener bus delivers it shortly after the batch; it is
        set here once the stream's listeners have seen it."""
        recent = self._figures.listener.recent
        return recent[-1] if recent else None

    @property
    def recent_progress(self) -> list[Any]:
        """The latest progress updates (up to 100), oldest first, with spate's figures."""
        return list(self._figures.listener.recent)

    def rescale(self, parallelism: int, reason: str = "requested") -> None:
        """Run the query at ``parallelism`` subtasks from its next batch on, without stopping it. Keyed state
        is redistributed by key group and operator state by the FLIP-8 rules, as on a restart; each new subtask
        builds its lmdb state from the old subtasks' local copies on its executor (the batch prefers the
        executor holding the largest part of its key groups) and reads from checkpoint storage only what no
        copy there holds. Refused beyond the max parallelism. Callable from any thread."""
        if self._remote is not None:  # on Spark Connect: a request through the root to the server's driver
            self._remote.rescale(RescaleRequest(parallelism, reason))
            self._settings = self._settings.replace(parallelism=parallelism)
            return
        if self._run is None:  # not started: it starts at that parallelism
            check_parallelism(parallelism, MAX_MAX_PARALLELISM)
            self._settings = self._settings.replace(parallelism=parallelism)
            return
        self._run.driver.request_rescale(parallelism, reason)

    def close(self) -> None:
        """Let background deletions finish and stop passing on the query's events (call after the query
        stopped)."""
        self._figures.listener.close()
        if self._run is not None:
            self._run.close()
        if self._remote is not None:
            self._remote.close()

    def __getattr__(self, name: str) -> Any:
        if name in _DATAFRAME_ONLY:
            raise AttributeError(
                f"StatefulStream has no {name!r}: its outputs are not a streaming DataFrame, so a streaming "
                f"operator (an aggregation, a join, withWatermark, writeStream) cannot follow it. Each batch's "
                f"outputs reach start(sink) as a DataFrame once the batch's checkpoint completed: apply {name} "
                "there for per-batch work, or have the sink append them to a table (Delta, Iceberg, Kafka) and "
                "read that as a stream for a further stateful operator")
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

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
    return StatefulStream(df, key, adapter, output_schema, settings=settings, initial_state=initial_state,
                          **overrides)
