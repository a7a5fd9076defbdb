"""The one Spark job of a micro-batch: every row goes to its subtask's partition, each subtask runs once where its
state lives, and the small acks come back to the driver.

Every row's key group is computed in the JVM with Spark's ``hash()``, and its subtask from it; one heartbeat row
per subtask is added so that every subtask runs (also without rows); ``repartition(P)`` on a routing value sends
subtask i's rows to partition i (:mod:`spate.spark.routing`: exactly P tasks, whatever AQE and
``spark.sql.shuffle.partitions`` say); each partition is zipped with its subtask's plan, preferring the executor
that holds the subtask's state (:mod:`spate.spark.placement`), and a Python task runs the subtask
(:mod:`spate.spark.task`).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

from spate.checkpoint.protocol import SubtaskAck
from spate.errors import SettingError
from spate.spark.jvm_class import jvm_class
from spate.spark.placement import Placement, alive_executors, placed_batch
from spate.spark.python_worker import arrow_schema
from spate.spark.routed_frame import RoutedFrames, key_group_expr, subtask_expr
from spate.spark.task import (
    HEARTBEAT_COLUMN,
    INITIAL_COLUMN,
    KG_COLUMN,
    SUBTASK_COLUMN,
    TaskSpec,
    run_partition,
)
from spate.spark.worker_errors import batch_failed

InitialState = tuple[Any, list[str]]  # (batch DataFrame, its key columns): see initial_state_of


class RoutedInput:
    """A run's batches as Spark partitions, one per subtask: every row in its subtask's partition with its key
    group, and one heartbeat row per subtask (so every subtask runs, also without rows); in the first batch of a
    new query also the initial state's rows (``initial_state``: ``(DataFrame, its key columns)``, or None).
    Built with DataFrame operations only, so every transport uses it."""

    def __init__(self, spec: TaskSpec, initial_state: InitialState | None) -> None:
        self.spec, self.initial_state = spec, initial_state
        self.frames = RoutedFrames(spec.key_columns)

    def routed(self, batch_df: Any, p: int, *, with_initial: bool = False) -> Any:
        """``batch_df``'s rows and the heartbeat rows, subtask i's in partition i of ``p``."""
        rows = self.frames.rows(batch_df, p, self.spec.max_parallelism)
        # The batch's own session (the stream's clone): adaptive execution would run the shuffle stage as a job
        # of its own, and has nothing to adapt in this plan (an explicit partition count, no joins).
        session = batch_df.sparkSession
        session.conf.set("spark.sql.adaptive.enabled", "false")
        heartbeat = self.frames.heartbeat(session, batch_df.schema, p)
        if with_initial and self.initial_state is not None:
            rows, heartbeat = self._with_initial_state(batch_df, rows, heartbeat, p)
        return self.frames.routed(rows, heartbeat, p)

    def _with_initial_state(self, batch_df: Any, rows: Any, heartbeat: Any, p: int) -> tuple[Any, Any]:
        """``rows`` with the initial state's rows added, routed by their key like input rows at parallelism ``p``:
        the stream's key columns hold their key, :data:`INITIAL_COLUMN` the whole row (null on input and heartbeat
        rows)."""
        from pyspark.sql import functions as F

        assert self.initial_state is not None
        initial, initial_keys = self.initial_state
        key_columns, max_p = self.spec.key_columns, self.spec.max_parallelism
        kg = key_group_expr(key_columns, max_p)
        whole = F.struct(*[F.col(c) for c in initial.columns])
        whole_type = initial.select(whole.alias("x")).schema["x"].dataType
        types = {f.name: f.dataType for f in batch_df.schema.fields}
        keyed = initial.select(*[F.col(ic).cast(types[kc]).alias(kc) for kc, ic in
                                 zip(key_columns, initial_keys, strict=True)], whole.alias(INITIAL_COLUMN))
        initial_rows = keyed.select(
            *[F.col(n) if n in key_columns else F.lit(None).cast(t).alias(n) for n, t in types.items()],
            F.expr(f"CAST({kg} AS INT)").alias(KG_COLUMN), F.expr(subtask_expr(kg, p, max_p)).alias(SUBTASK_COLUMN),
            F.lit(False).alias(HEARTBEAT_COLUMN), F.col(INITIAL_COLUMN))
        none = F.lit(None).cast(whole_type).alias(INITIAL_COLUMN)
        return (rows.select("*", none).unionByName(initial_rows), heartbeat.select("*", none))


class SubtaskJob(RoutedInput):
    """Runs the subtasks of one run of a stream as one Spark job per batch, on a classic session: each subtask's
    partition is zipped with its plan and placed where the subtask's state lives.

    Args:
        spark: the session.
        spec: what the run's tasks need (built once per ``start()``): the stream's key columns, the factory that
            makes the processor on executors, the output schema, the run id, the sink choice, the max parallelism.
        initial_state: ``(DataFrame, its key columns)`` routed into a new query's first batch, or None.
        placement: where each subtask's state lives (learned from the acks by the caller).
    """

    def __init__(self, spark: Any, spec: TaskSpec, initial_state: InitialState | None, placement: Placement) -> None:
        super().__init__(spec, initial_state)
        self.spark, self.placement = spark, placement

    def run(self, batch_df: Any, batch_id: int, plans: list[bytes], *, with_initial: bool = False
            ) -> list[SubtaskAck]:
        """Batch ``batch_id``'s job for ``plans`` (one per subtask, encoded; as many as the query driver's
        parallelism): route every row to its subtask's partition, run each subtask where its state lives,
        collect the acks. ``with_initial``: the first batch of a new query, which also routes the initial
        state's rows."""
        from pyspark.rdd import RDD
        from pyspark.serializers import NoOpSerializer

        spec, p = self.spec, len(plans)
        routed = self.routed(batch_df, p, with_initial=with_initial)
        input_schema = arrow_schema(routed.schema)

        def task(items: Any) -> Any:
            return run_partition(spec, input_schema, items)

        locations = self.placement.locations(p, alive_executors(self.spark.sparkContext), spec.max_parallelism)
        placed = placed_batch(routed, plans, locations)
        sc = self.spark.sparkContext
        note = (f"spate checkpoint {batch_id}: {p} subtasks, {sum(map(bool, locations))} placed where "
                "their state is")
        with job_description(sc, note):
            try:
                acks = RDD(placed, sc, NoOpSerializer()).mapPartitions(task).collect()
            except Exception as e:
                told = batch_failed(batch_id, e)
                if told is None:
                    raise
                raise told from None  # Spark's whole error is in its message, after the worker's exception
        return [SubtaskAck.from_dict(json.loads(a)) for a in acks]


def initial_state_of(initial_state: Any, key_columns: tuple[str, ...]) -> InitialState | None:
    """``(DataFrame, its key columns)`` of an initial state given as Spark's ``GroupedData`` (``df.groupBy(k)``)
    or a batch DataFrame grouped by the stream's key column names."""
    if initial_state is None:
        return None
    if hasattr(initial_state, "_jgd"):  # GroupedData: its DataFrame and grouping columns
        exprs = initial_state._jgd.groupingExprs()  # noqa: SLF001
        df, keys = initial_state._df, [exprs.apply(i).name() for i in range(exprs.size())]  # noqa: SLF001
    elif hasattr(initial_state, "_grouping_cols"):  # Spark Connect's GroupedData: the names its columns select
        df = initial_state._df  # noqa: SLF001
        keys = df.select(*initial_state._grouping_cols).columns  # noqa: SLF001
    elif hasattr(initial_state, "isStreaming"):
        df, keys = initial_state, list(key_columns)
    else:
        raise SettingError("initial_state must be df.groupBy(key) of a batch DataFrame (as Spark's transformWithState "
                           f"takes it) or a batch DataFrame with the key columns, got {type(initial_state).__name__}")
    if df.isStreaming:
        raise SettingError("initial_state must be a batch DataFrame (spark.read...), not a streaming one, as on Spark")
    missing = [k for k in keys if k not in df.columns]
    if len(keys) != len(key_columns) or missing:
        raise SettingError(f"initial_state is grouped by {keys}, the stream by {list(key_columns)}: group it by as "
                           "many columns, in the same order" + (f" ({missing} are not its columns)" if missing else ""))
    return df, keys


@contextlib.contextmanager
def job_description(sc: Any, note: str) -> Iterator[None]:
    """Spark's job description of the batch (shown in the Spark UI) with ``note`` added, for spate's job."""
    before = sc.getLocalProperty("spark.job.description")
    sc.setJobDescription(f"{before} | {note}" if before else note)
    try:
        yield
    finally:
        sc.setLocalProperty("spark.job.description", before)


class JobCounter:
    """Spark jobs started in this thread's job group (Spark's streaming query sets it per batch) since now."""

    def __init__(self, sc: Any) -> None:
        self.sc, self.group = sc, sc.getLocalProperty("spark.jobGroup.id")
        self.before = self._jobs()

    def _jobs(self) -> set[int]:
        """The group's job ids. Read as one string: the group is the query's, so it holds every batch's jobs
        (up to ``spark.ui.retainedJobs``), and reading the Java array element by element costs a py4j call
        each."""
        if not self.group:
            return set()
        ids = self.sc._jsc.statusTracker().getJobIdsForGroup(self.group)  # noqa: SLF001
        text = jvm_class(self.sc._jvm, "java.util.Arrays").toString(ids)  # noqa: SLF001 - "[3, 4, 5]"
        return {int(i) for i in text.strip("[]").split(",") if i.strip()}

    def since(self) -> int:
        return len(self._new_jobs())

    def _new_jobs(self) -> set[int]:
        return self._jobs() - self.before

    def last_stage_tasks(self) -> int:
        """Tasks of the last stage of the newest job started since (spate's subtask stage), 0 if unknown."""
        tracker = self.sc.statusTracker()
        jobs = sorted(self._new_jobs())
        info = tracker.getJobInfo(jobs[-1]) if jobs else None
        stage = tracker.getStageInfo(max(info.stageIds)) if info is not None and info.stageIds else None
        return stage.numTasks if stage is not None else 0
