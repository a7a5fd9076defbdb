"""``StatefulStream``: a spate processor over a streaming DataFrame, started as a real ``StreamingQuery``.

Per micro-batch (``foreachBatch(df, n)`` on the driver): the coordinator plans checkpoint n; the JVM computes
every row's key group with Spark's ``hash()`` and its subtask; one heartbeat row per subtask, carrying the
subtask's plan, is added so every subtask runs; ``repartition(P)`` on a routing value sends subtask i's rows to
partition i (:mod:`spate.spark.routing`: exactly P tasks, whatever AQE and ``spark.sql.shuffle.partitions``
say) and ``mapInArrow`` runs each subtask once (``spate.spark.task``); the small acks
come back to the driver, the coordinator completes checkpoint n, and only then does the sink get the batch's
outputs (already staged in the checkpoint: a crash before the sink finished re-delivers them with the same
batch id). A batch Spark replays after checkpoint n completed is not processed again.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from spate.checkpoint.coordinator import Coordinator
from spate.checkpoint.metadata import CheckpointMetadata
from spate.checkpoint.protocol import SubtaskAck
from spate.fs import join_uri
from spate.report import percentile
from spate.runtime.processor import Processor
from spate.runtime.subtask import ProcessorFactory, processor_factory
from spate.spark.adapter import StatefulProcessorAdapter
from spate.spark.executors import check_executor_python
from spate.spark.routing import routing_values
from spate.spark.settings import SpateSettings
from spate.spark.staged import staged_outputs_frame
from spate.spark.task import (
    ACK_COLUMN,
    HEARTBEAT_COLUMN,
    KG_COLUMN,
    PLAN_COLUMN,
    ROUTE_COLUMN,
    SUBTASK_COLUMN,
    TaskSpec,
    run_partition,
)

log = logging.getLogger(__name__)
SPARK_CHECKPOINT_DIR = "_spark"  # Spark's own checkpoint (offsets, commits) under spate's root
Sink = Callable[[Any, int], None]


@dataclass
class BatchMetrics:
    """What one micro-batch cost on the driver."""

    batch_id: int
    rows: int
    batch_ms: float
    checkpoint_ms: float  # from the acks being collected to the metadata written
    restored_subtasks: list[int] = field(default_factory=list)
    replayed: bool = False  # a batch Spark ran again after spate's checkpoint completed: only re-delivered
    spark_jobs: int = 0  # Spark jobs spate ran for the batch (the sink's own jobs not counted)


class StatefulStream:
    """Run ``processor`` keyed by ``key`` over the streaming DataFrame ``df``.

    Args:
        df: a streaming DataFrame.
        key: the key column(s).
        processor: a spate :class:`Processor` (instance, class or factory), shipped to executors.
        output_schema: schema of the rows the processor yields (``StructType`` or DDL string).
        settings: a :class:`SpateSettings`; defaults come from the Spark conf (``spark.spate.*``) and keyword
            arguments override both (``checkpoint_root=...``, ``parallelism=...``, ...).
    """

    def __init__(self, df: Any, key: str | Sequence[str], processor: Processor | type[Processor] | ProcessorFactory,
                 output_schema: Any, settings: SpateSettings | None = None, **overrides: Any) -> None:
        from pyspark.sql.pandas.types import to_arrow_schema
        from pyspark.sql.types import StructType, _parse_datatype_string

        if not df.isStreaming:
            raise ValueError("StatefulStream needs a streaming DataFrame (spark.readStream...); for a batch "
                             "DataFrame use LocalRunner")
        self.df = df
        self.spark = df.sparkSession
        self.key_columns = (key,) if isinstance(key, str) else tuple(key)
        missing = [c for c in self.key_columns if c not in df.columns]
        if not self.key_columns or missing:
            raise ValueError(f"key columns {missing or '(none)'} are not columns of the stream {df.columns}")
        self.factory = processor_factory(processor)
        schema = _parse_datatype_string(output_schema) if isinstance(output_schema, str) else output_schema
        if not isinstance(schema, StructType):
            raise TypeError(f"output_schema must be a StructType or a DDL string, got {output_schema!r}")
        self.output_schema = schema
        self.arrow_output_schema = to_arrow_schema(schema, timezone="UTC")  # what the outputs are checked against
        if settings is None:
            conf = dict(self.spark.sparkContext.getConf().getAll()) | {
                k: v for k, v in self.spark.conf.getAll.items() if k.startswith("spark.spate.")}
            settings = SpateSettings.from_conf(conf, **overrides)
        elif overrides:
            settings = settings.replace(**overrides)
        self.settings = settings
        self.coordinator: Coordinator | None = None
        self.sink: Sink | None = None
        self.run_id = ""  # one per start(): executors never reuse subtasks (processors) of another run
        self.metrics: list[BatchMetrics] = []
        self.redelivered: list[int] = []

    # -- starting --------------------------------------------------------------------------------------
    def start(self, sink: Sink | None = None, *, trigger: dict[str, Any] | None = None,
              spark_checkpoint: str | None = None, query_name: str | None = None) -> Any:
        """Start the query. ``sink(outputs_df, batch_id)`` runs after each batch's checkpoint completed (at
        least once per batch id, so an idempotent sink gets exactly once); ``outputs_df`` reads the batch's
        staged outputs and is valid during the call only, like ``foreachBatch``'s own. ``trigger`` is passed to
        ``DataStreamWriter.trigger`` (e.g. ``{"availableNow": True}``). Returns the ``StreamingQuery``.

        First checks that executors can import spate (:func:`check_executor_python`), before touching the
        checkpoint root."""
        check_executor_python(self.spark)
        s = self.settings
        self.sink = sink
        self.run_id = uuid.uuid4().hex
        self.coordinator = Coordinator(s.checkpoint_root, s.parallelism, max_parallelism=s.max_parallelism,
                                       retained=s.retained,
                                       watermark_delay_ms=s.watermark_delay_ms if s.event_time_column else None,
                                       max_space_amplification=(s.file_merging_config.max_space_amplification
                                                                if s.file_merging_config else 0))
        self.coordinator.start()
        self._deliver_staged()
        writer = self.df.writeStream.foreachBatch(self._process_batch).option(
            "checkpointLocation", spark_checkpoint or join_uri(s.checkpoint_root, SPARK_CHECKPOINT_DIR))
        if trigger:
            writer = writer.trigger(**trigger)
        if query_name:
            writer = writer.queryName(query_name)
        return writer.start()

    def close(self) -> None:
        """Let background deletions finish (call after the query stopped)."""
        if self.coordinator is not None:
            self.coordinator.close()

    # -- one micro-batch (driver) -----------------------------------------------------------------------
    def _process_batch(self, batch_df: Any, batch_id: int) -> None:
        coord = self.coordinator
        assert coord is not None
        started = time.perf_counter()
        self._deliver_staged()
        latest = coord.latest
        if latest is not None and batch_id <= latest.checkpoint_id:
            log.info("batch %d is covered by complete checkpoint %d: not processed again", batch_id,
                     latest.checkpoint_id)
            self.metrics.append(BatchMetrics(batch_id, 0, (time.perf_counter() - started) * 1000, 0.0,
                                             replayed=True))
            return
        plans = coord.begin(batch_id)
        jobs = _JobCounter(self.spark.sparkContext)  # the query's own job group: stop() cancels these jobs
        try:  # the batch's one Spark job: run every subtask, collect the acks
            acks = [SubtaskAck.from_dict(json.loads(r[0])) for r in self._run_subtasks(batch_df, plans).collect()]
            spark_jobs = jobs.since()
            cp_started = time.perf_counter()
            for ack in acks:
                coord.acknowledge(ack)
            meta = coord.complete(batch_id)
        except BaseException as e:
            coord.fail(batch_id, e)
            raise
        checkpoint_ms = (time.perf_counter() - cp_started) * 1000
        rows = sum(st.stats.get("rows", 0) for st in meta.subtasks)
        if self.sink is not None:
            self.sink(self._staged_outputs(meta), batch_id)
            coord.mark_delivered(batch_id)
        restored = [i for i, st in enumerate(meta.subtasks) if st.stats.get("restored_from") is not None]
        self.metrics.append(BatchMetrics(batch_id, rows, (time.perf_counter() - started) * 1000, checkpoint_ms,
                                         restored, spark_jobs=spark_jobs))

    def _run_subtasks(self, batch_df: Any, plans: list[Any]) -> Any:
        from pyspark.sql import functions as F
        from pyspark.sql.types import BooleanType, IntegerType, StringType, StructField, StructType

        s, coord = self.settings, self.coordinator
        assert coord is not None
        max_p, p = coord.max_parallelism, s.parallelism
        kg = F.pmod(F.hash(*[F.col(c) for c in self.key_columns]), F.lit(max_p))
        rows = batch_df.select(*[F.col(c) for c in batch_df.columns], kg.cast("int").alias(KG_COLUMN),
                               F.floor(kg * F.lit(p) / F.lit(max_p)).cast("int").alias(SUBTASK_COLUMN),
                               F.lit(False).alias(HEARTBEAT_COLUMN), F.lit(None).cast(StringType()).alias(PLAN_COLUMN))
        # The batch's own session (the stream's clone): adaptive execution would run the shuffle stage as a job
        # of its own, and has nothing to adapt in this plan (an explicit partition count, no joins).
        session = batch_df.sparkSession
        session.conf.set("spark.sql.adaptive.enabled", "false")
        plan_rows = session.createDataFrame([(plan.index, json.dumps(plan.to_dict())) for plan in plans],
                                            f"{SUBTASK_COLUMN} int, {PLAN_COLUMN} string")
        heartbeat = plan_rows.select(
            *[F.lit(None).cast(f.dataType).alias(f.name) for f in batch_df.schema.fields],
            F.lit(None).cast(IntegerType()).alias(KG_COLUMN), F.col(SUBTASK_COLUMN),
            F.lit(True).cast(BooleanType()).alias(HEARTBEAT_COLUMN), F.col(PLAN_COLUMN))
        route = F.element_at(F.array(*[F.lit(v) for v in routing_values(p)]), F.col(SUBTASK_COLUMN) + 1)
        spec = TaskSpec(self.run_id, self.factory, s, self.sink is not None, self.key_columns,
                        self.arrow_output_schema)

        def task(batches: Any) -> Any:
            return run_partition(spec, batches)

        routed = rows.unionByName(heartbeat).withColumn(ROUTE_COLUMN, route.cast("int"))
        return routed.repartition(p, ROUTE_COLUMN).mapInArrow(task, StructType([StructField(ACK_COLUMN,
                                                                                            StringType())]))

    def _deliver_staged(self) -> None:
        """Outputs of complete checkpoints the sink did not confirm (the driver died between checkpoint and
        sink): give them to the sink again, with their batch ids."""
        coord = self.coordinator
        if self.sink is None or coord is None:
            return
        for meta in coord.undelivered():
            self.sink(self._staged_outputs(meta), meta.checkpoint_id)
            coord.mark_delivered(meta.checkpoint_id)
            self.redelivered.append(meta.checkpoint_id)

    def _staged_outputs(self, meta: CheckpointMetadata) -> Any:
        """The sink's DataFrame of checkpoint ``meta``: its outputs, read from checkpoint storage."""
        assert self.coordinator is not None
        return staged_outputs_frame(self.spark, self.coordinator.storage.uri, meta, self.output_schema,
                                    self.arrow_output_schema, self.settings.allow_pickle)

    # -- figures ----------------------------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        """Rows/s and batch/checkpoint durations over the processed batches."""
        done = [m for m in self.metrics if not m.replayed]
        total_ms = sum(m.batch_ms for m in done)
        return {"batches": len(done), "rows": sum(m.rows for m in done),
                "rows_per_s": round(sum(m.rows for m in done) / (total_ms / 1000)) if total_ms else 0,
                "batch_ms_p50": percentile([m.batch_ms for m in done], 50),
                "batch_ms_p99": percentile([m.batch_ms for m in done], 99),
                "checkpoint_ms_p50": percentile([m.checkpoint_ms for m in done], 50),
                "checkpoint_ms_p99": percentile([m.checkpoint_ms for m in done], 99)}


class _JobCounter:
    """Spark jobs started in this thread's job group (Spark's streaming query sets it per batch) since now."""

    def __init__(self, sc: Any) -> None:
        self.sc, self.group = sc, sc.getLocalProperty("spark.jobGroup.id")
        self.before = self._jobs()

    def _jobs(self) -> set[int]:
        return set(self.sc.statusTracker().getJobIdsForGroup(self.group)) if self.group else set()

    def since(self) -> int:
        return len(self._jobs() - self.before)


def transform_with_state(df: Any, key: str | Sequence[str], processor: Any, output_schema: Any, *,
                         time_mode: str = "None", flavour: str = "pandas", event_time_column: str | None = None,
                         watermark_delay_ms: int = 0, settings: SpateSettings | None = None,
                         **overrides: Any) -> StatefulStream:
    """The spate equivalent of ``df.groupBy(key).transformWithStateInPandas(processor, output_schema, "Update",
    time_mode)`` (``flavour="row"``: ``transformWithState``): the same, unchanged ``StatefulProcessor``, with
    state, checkpoints and parallelism owned by spate. With ``time_mode="EventTime"`` give the event-time
    column and the allowed delay (Spark's ``withWatermark``). Call ``.start(sink)`` on the result."""
    if time_mode == "EventTime" and not event_time_column:
        raise ValueError("timeMode 'EventTime' needs event_time_column (and watermark_delay_ms): the column the "
                         "watermark follows, as Spark's withWatermark")
    if event_time_column:
        overrides = {**overrides, "event_time_column": event_time_column, "watermark_delay_ms": watermark_delay_ms}
    return StatefulStream(df, key, StatefulProcessorAdapter(processor, flavour, time_mode), output_schema, settings,
                          **overrides)
