"""``spate bench cluster``: spate on a real Spark standalone cluster (a master and 2 workers on 127.0.0.1,
:class:`~spate_tools.standalone.StandaloneCluster`), changelog on, lmdb state of ~100 MB (``--quick``: ~10 MB).

One application runs, on the same generated files (one file per micro-batch):

1. the **floor**: the same source, the same ``hash()`` key groups and subtask routing, ``groupBy(subtask)
   .applyInArrow`` with no state (Spark's own distributed overhead for this shape of batch);
2. **spate**: a keyed processor keeping a ~200-byte record per key; warm-up batches load the state, then
   steady batches update random keys; in the middle of the steady batches one executor is killed (SIGKILL)
   and the stream goes on.

Reported: ``local_reuse`` (steady subtask-batches that ran where their state was: reused or caught up),
``tasks_per_batch`` vs ``parallelism``, restore bytes per batch, ``recovery_batches`` (batches after the kill
until every subtask again runs on its local state), ``batch_ms_p50_cluster`` vs ``batch_ms_p50_floor`` (Spark's
``triggerExecution`` of the same steady batches) and plan bytes per task.

A second row (``plans``, in-process, no Spark) measures growth: the plan bytes per task and the checkpoint
metadata bytes at parallelism 50 over 200 batches (``--quick``: 60), changelog and file merging on.

``spate bench cluster --large`` runs the large-state case instead (:mod:`spate_tools.bench.cluster_large`):
4 GB of state over the 2 workers, an executor killed, its subtask's restore against the OS copying its bytes.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from spate.layout import metadata_path
from spate.report import format_table, human_bytes, percentile, progress
from spate.runtime.local import LocalRunner
from spate.runtime.processor import Context, Processor
from spate.spark.stream import StatefulStream
from spate.spark.stream_metrics import BatchMetrics
from spate.state.descriptors import ValueStateDescriptor
from spate_tools.spark_demo import write_batches
from spate_tools.standalone import ExecutorProcess, StandaloneCluster

INPUT_SCHEMA = "k string, v string"
PARALLELISM = 4
LOCAL = ("reused", "caught_up")
RECORD: ValueStateDescriptor[list] = ValueStateDescriptor("record")


class KeepLatest(Processor):
    """Keeps each key's latest value and how often it was seen; emits nothing (the sink costs nothing)."""

    def open(self, ctx: Context) -> None:
        self.record = ctx.state(RECORD)

    def process(self, key: Any, rows: Sequence[dict[str, Any]], ctx: Context) -> None:
        seen = (self.record.value() or [0, ""])[0]
        self.record.update([seen + len(rows), rows[-1]["v"]])


def _sizes(quick: bool) -> dict[str, int]:
    if quick:
        return {"keys": 40_000, "warmup": 2, "steady": 8, "after_kill": 10, "updates": 4_000, "payload": 200}
    return {"keys": 400_000, "warmup": 4, "steady": 16, "after_kill": 10, "updates": 20_000, "payload": 200}


def _generate(directory: str, sizes: dict[str, int], seed: int = 7) -> int:
    """Warm-up batches insert every key once, steady batches update random keys. Returns the batch count."""
    rng = random.Random(seed)
    keys, warmup, payload = sizes["keys"], sizes["warmup"], sizes["payload"]
    value = "x" * payload
    batches = [[{"k": f"key-{k}", "v": value} for k in range(w, keys, warmup)] for w in range(warmup)]
    for _ in range(sizes["steady"] + sizes["after_kill"]):
        batches.append([{"k": f"key-{rng.randrange(keys)}", "v": value} for _ in range(sizes["updates"])])
    write_batches(directory, batches)
    return len(batches)


def _floor(spark: Any, source: str, ckpt: str) -> list[float]:
    """The floor: same source, key groups and routing, ``applyInArrow`` per subtask, no state. Returns each
    batch's ``triggerExecution`` ms."""
    import pyarrow as pa
    from pyspark.sql import functions as F

    def count(table: pa.Table) -> pa.Table:
        return pa.table({"rows": [table.num_rows]})

    def batch(df: Any, _batch_id: int) -> None:
        df.sparkSession.conf.set("spark.sql.adaptive.enabled", "false")
        kg = F.pmod(F.hash(F.col("k")), F.lit(128))
        routed = df.select("k", "v", F.floor(kg * F.lit(PARALLELISM) / F.lit(128)).cast("int").alias("subtask"))
        routed.repartition(PARALLELISM, "subtask").groupBy("subtask").applyInArrow(count, "rows long").collect()

    query = (spark.readStream.schema(INPUT_SCHEMA).option("maxFilesPerTrigger", 1).json(source)
             .writeStream.foreachBatch(batch).option("checkpointLocation", ckpt).trigger(availableNow=True).start())
    query.awaitTermination()
    return [p["durationMs"]["triggerExecution"] for p in query.recentProgress if p["numInputRows"]]


class _KillOnce:
    """The sink of the spate run: kills one executor right after batch ``at`` completed (fault injection)."""

    def __init__(self, cluster: StandaloneCluster, spark: Any, at: int) -> None:
        self.cluster, self.app_id, self.at = cluster, spark.sparkContext.applicationId, at
        self.killed: str | None = None
        self.victim: ExecutorProcess | None = None

    def __call__(self, _outputs: Any, batch_id: int) -> None:
        if batch_id == self.at and self.killed is None:
            victim = self.cluster.executors(self.app_id)[0]
            self.cluster.kill_executor(victim)
            self.killed, self.victim = victim.executor_id, victim


def _spate(spark: Any, cluster: StandaloneCluster, source: str, root: str, kill_at: int) -> tuple[Any, Any, Any]:
    df = spark.readStream.schema(INPUT_SCHEMA).option("maxFilesPerTrigger", 1).json(source)
    stream = StatefulStream(df, "k", KeepLatest, "k string", checkpoint_root=root, parallelism=PARALLELISM,
                            max_parallelism=128, table="lmdb", changelog=True, file_merging="across")
    sink = _KillOnce(cluster, spark, kill_at)
    query = stream.start(sink, trigger={"availableNow": True}, spark_checkpoint=f"{root}-spark")
    query.awaitTermination()
    stream.close()
    return stream, query, sink


def _local_fraction(metrics: list[BatchMetrics]) -> float:
    runs = [r for m in metrics for r in m.subtasks]
    return round(sum(r.recovery in LOCAL for r in runs) / len(runs), 3) if runs else 0.0


def _recovery_batches(after_kill: list[BatchMetrics]) -> int:
    """Batches after the kill until (not counting) the first on which every subtask ran on local state."""
    for n, m in enumerate(after_kill):
        if all(r.recovery in LOCAL for r in m.subtasks):
            return n
    return len(after_kill)


def bench_cluster(quick: bool) -> tuple[list[dict[str, Any]], str]:
    sizes = _sizes(quick)
    workdir = tempfile.mkdtemp(prefix="spate-bench-cluster-")
    try:
        source = os.path.join(workdir, "in")
        batches = _generate(source, sizes)
        steps = progress(range(3), 3, "bench cluster (start cluster, floor, spate)")
        next(steps)
        with StandaloneCluster(workers=2, cores=1, memory_mb=1536) as cluster:
            spark = cluster.session("spate-bench-cluster", extra={"spark.sql.shuffle.partitions": "2"})
            try:
                next(steps)
                floor_ms = _floor(spark, source, os.path.join(workdir, "floor-spark"))
                next(steps)
                kill_at = sizes["warmup"] + sizes["steady"] - 1
                stream, query, sink = _spate(spark, cluster, source, os.path.join(workdir, "spate"), kill_at)
                progress_ms = [p["durationMs"]["triggerExecution"] for p in query.recentProgress
                               if p["numInputRows"]]
            finally:
                spark.stop()
        result = _result(sizes, batches, _Observed(floor_ms, progress_ms, stream.metrics, kill_at, sink.killed))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    plans = plan_growth(parallelism=50, batches=60 if quick else 200)
    return [result, plans], _table(result) + "\n\n" + _table(plans)


class _PlanSizes:
    """Instrumentation: the coordinator's ``begin``, recording the largest plan (JSON bytes) of each batch."""

    def __init__(self, coordinator: Any) -> None:
        self.begin_plans = coordinator.begin
        self.sizes: list[int] = []
        coordinator.begin = self

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        plans = self.begin_plans(*args, **kwargs)
        self.sizes.append(max(len(json.dumps(p.to_dict())) for p in plans))
        return plans


def plan_growth(parallelism: int, batches: int, keys: int = 20_000, rows: int = 2_000) -> dict[str, Any]:
    """Plan bytes per task and metadata bytes per checkpoint over ``batches`` at ``parallelism`` (in-process:
    the plans and metadata are the coordinator's, whatever the transport)."""
    rng = random.Random(3)
    root = tempfile.mkdtemp(prefix="spate-bench-plans-")
    try:
        with LocalRunner(KeepLatest, key="k", checkpoint_root=root, parallelism=parallelism, max_parallelism=128,
                         changelog=True, file_merging="across") as runner:
            sizes = _PlanSizes(runner.coordinator)
            metadata = []
            for n in progress(range(batches), batches, f"plans at parallelism {parallelism}"):
                runner.run_batch(n, [{"k": f"key-{rng.randrange(keys)}", "v": "x"} for _ in range(rows)])
                metadata.append(os.path.getsize(os.path.join(root, metadata_path(n))))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    early = min(20, batches) - 1
    return {"variant": "plans", "parallelism": parallelism, "batches": batches,
            "plan_bytes_per_task_b20": sizes.sizes[early], "plan_bytes_per_task_last": sizes.sizes[-1],
            "plan_bytes_per_task_max": max(sizes.sizes),
            "metadata_bytes_b20": metadata[early], "metadata_bytes_last": metadata[-1],
            "metadata_bytes_max": max(metadata)}


@dataclass(frozen=True)
class _Observed:
    """What one run saw: the floor's and spate's batch times, spate's batch metrics, the last batch before the
    kill and the executor killed."""

    floor_ms: list[float]
    spate_ms: list[float]
    metrics: list[BatchMetrics]
    kill_at: int
    killed: str | None


def _result(sizes: dict[str, int], batches: int, seen: _Observed) -> dict[str, Any]:
    kill_at = seen.kill_at
    done = [m for m in seen.metrics if not m.replayed]
    warmup = sizes["warmup"]
    steady = [m for m in done if warmup < m.batch_id <= kill_at]  # the first steady batch settles placement
    after = [m for m in done if m.batch_id > kill_at]
    window = slice(warmup + 1, kill_at + 1)
    p50, floor_p50 = percentile(seen.spate_ms[window], 50), percentile(seen.floor_ms[window], 50)
    return {"variant": "spate", "workers": 2, "parallelism": PARALLELISM, "batches": batches,
            "state_keys": sizes["keys"], "payload_bytes": sizes["payload"],
            "tasks_per_batch": percentile([m.spark_tasks for m in steady], 50),
            "spark_jobs_per_batch": percentile([m.spark_jobs for m in steady], 50),
            "local_reuse": _local_fraction(steady),
            "restore_bytes_per_batch": round(sum(r.restore_bytes for m in steady for r in m.subtasks)
                                             / max(1, len(steady))),
            "killed_executor": seen.killed, "recovery_batches": _recovery_batches(after),
            "restore_bytes_after_kill": sum(r.restore_bytes for m in after for r in m.subtasks),
            "executors_used_last_batch": len({r.executor for r in after[-1].subtasks}) if after else None,
            "batch_ms_p50_cluster": p50, "batch_ms_p50_floor": floor_p50,
            "cluster_vs_floor": round(p50 / floor_p50, 2) if p50 and floor_p50 else None,
            "plan_bytes_per_task": percentile([m.plan_bytes_max for m in steady], 50)}


_TITLES = {"spate": "spate bench cluster: standalone master + 2 workers (1 core each) on 127.0.0.1, changelog on, "
                    "lmdb; goals: local_reuse >= 0.95, tasks_per_batch = parallelism, recovery_batches <= 2, "
                    "cluster_vs_floor <= 1.3",
           "plans": "plan and metadata growth (in-process, changelog + file merging across): bounded if the last "
                    "and max stay near the early figures"}


def _table(r: dict[str, Any]) -> str:
    rows = [{"metric": k, "value": human_bytes(v) if "bytes" in k and isinstance(v, int) and v > 4096 else v}
            for k, v in r.items() if k != "variant"]
    return format_table(rows, title=_TITLES[r["variant"]])
