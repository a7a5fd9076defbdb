"""``spate bench spark``: a keyed running count on Spark Structured Streaming, side by side on the same
generated files (local[2], 4 subtasks / partitions), at high cardinality (every row a new key: 20k and 100k
rows per batch) and low cardinality (1k keys, large batches). Variants:

- ``floor``: the same pipeline with no state: the files read one per trigger through ``foreachBatch``,
  Spark's ``hash()`` into spate's key groups and subtasks, ``groupBy(subtask).applyInArrow`` returning one row
  per subtask, ``collect()``. No stateful variant can be faster than this;
- ``spate`` (a :class:`Processor`), ``spate-empty`` (a processor that does nothing: what is left between
  spate and the floor), ``spate-batch`` (the vectorized :class:`~spate.runtime.batch.BatchProcessor`),
  ``spate-adapter`` / ``spate-adapter-row`` (the Spark processors below, unchanged, through
  :func:`spate.spark.stream.transform_with_state`); ``spate-readback``: ``spate`` with its outputs staged
  framed and read back for the sink by Python tasks (``staged_outputs="arrow"``, the path of object-store
  roots), where ``spate`` stages Parquet files the sink's DataFrame reads in the JVM;
- Spark's own ``transformWithState``, ``transformWithStateInPandas`` and ``applyInPandasWithState`` (RocksDB
  state store, changelog checkpointing on). At ``high-100k`` they run fewer batches, to stay within time;
- table sinks: ``spate-parquet``, ``spate-delta``, ``spate-iceberg`` (``spate`` writing each batch's outputs to
  a table, exactly once: :mod:`spate.sinks`) and ``transformWithState-parquet`` (Spark's, with its Parquet file
  sink); each table's rows are counted after the run against the input (``table_rows_ok``).

Per variant: steady-state rows/s and batch duration p50/p99 (Spark's ``triggerExecution``, first batches
excluded), state commit time, checkpoint files created per batch (over the whole run, and in the steady
state: after the warm-up batches, without the restart), bytes on disk, restart time (a new query
on the same checkpoint processing one more batch) and the peak resident memory of a Python worker; per case,
every variant against the floor and spate's against Spark's. Each variant runs in a fresh Spark context (the
JVM stays), so Python workers and Spark's bookkeeping start empty; Spark listens on 127.0.0.1 only.
``profile=True`` adds, for the floor and spate's variants, a per-batch breakdown of the time
(:mod:`spate_tools.bench.spark_profile`).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from spate.errors import SettingError
from spate.keygroups import default_max_parallelism
from spate.layout import STAGED_DIR
from spate.report import format_table, human_bytes, percentile, progress
from spate.runtime.batch import BatchProcessor, KeyedBatch
from spate.runtime.processor import Context, Processor
from spate.runtime.settings import SpateSettings
from spate.spark import procfs
from spate.spark.stream import StatefulStream, transform_with_state
from spate.state.descriptors import ValueStateDescriptor
from spate_tools.bench.spark_profile import SparkRestApi, bind_spark_to_loopback
from spate_tools.bench.spark_sinks import (
    SPARK_TABLE_VARIANTS,
    SPATE_TABLE_VARIANTS,
    on_every_batch,
    start_spark_parquet,
    table_files,
    table_row_count,
    table_sink,
)
from spate_tools.spark_demo import spark_session, write_batches

APP = "spate-bench"
INPUT_SCHEMA = "k string, v long"
OUTPUT_SCHEMA = "k string, count long"
FLOOR_SCHEMA = "subtask int, rows long"
PARALLELISM = 4
MAX_PARALLELISM = default_max_parallelism(PARALLELISM)  # spate's key groups for 4 subtasks (the coordinator's
# default when max_parallelism is not set), so the floor routes rows exactly as spate does
FLOOR = "floor"
SPATE_VARIANTS = ("spate", "spate-empty", "spate-batch", "spate-adapter", "spate-adapter-row", "spate-readback")
READBACK = "spate-readback"  # spate whose sink's DataFrame is read back by Python tasks (staged_outputs="arrow")
SPARK_VARIANTS = ("transformWithState", "transformWithStateInPandas", "applyInPandasWithState")
TABLE_VARIANTS = (*SPATE_TABLE_VARIANTS, *SPARK_TABLE_VARIANTS)
VARIANTS = (FLOOR, *SPATE_VARIANTS, *SPARK_VARIANTS, *TABLE_VARIANTS)
SPATE_QUERIES = (*SPATE_VARIANTS, *SPATE_TABLE_VARIANTS)  # spate's queries: its checkpoint's files are state
PROFILED = (FLOOR, *SPATE_VARIANTS)
ADAPTER_FLAVOURS = {"spate-adapter": "pandas", "spate-adapter-row": "row"}
SAME_API_ON_SPARK = {"spate-adapter": "transformWithStateInPandas", "spate-adapter-row": "transformWithState"}
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
WARMUP_BATCHES = 2
COUNT: ValueStateDescriptor[int] = ValueStateDescriptor("count", default=0)
Observer = Callable[[], None]


@dataclass(frozen=True)
class Case:
    """One input: ``batches`` files of ``rows`` rows; ``keys=None``: every row a new key, else keys drawn
    from ``keys``. Spark's own variants read only the first ``spark_batches`` files."""

    name: str
    batches: int
    rows: int
    keys: int | None
    spark_batches: int

    def batches_of(self, variant: str) -> int:
        return self.spark_batches if variant in (*SPARK_VARIANTS, *SPARK_TABLE_VARIANTS) else self.batches


def cases(quick: bool) -> tuple[Case, ...]:
    """The bench's inputs. At ``high-100k`` Spark's own variants run 2 batches in the full run (1 warm-up, 1
    measured): each of theirs takes 20-95 s there on 2 cores (spate's about 1 s), and more would take the full
    run past ~25 minutes. ``quick`` (a check that every variant runs and reports, not a measurement) leaves
    ``high-100k`` out: it is ``high`` at a larger size."""
    if quick:
        return (Case("high", 2, 2_000, None, 2), Case("low", 2, 20_000, 1_000, 2))
    return (Case("high", 8, 20_000, None, 8), Case("low", 8, 200_000, 1_000, 8),
            Case("high-100k", 8, 100_000, None, 2))


# -- the processors ------------------------------------------------------------------------------------------
class SpateCount(Processor):
    def open(self, ctx: Context) -> None:
        self.count = ctx.state(COUNT)

    def process(self, key: Any, rows: Sequence[dict], ctx: Context) -> list[dict]:
        n = self.count.value() + len(rows)
        self.count.update(n)
        return [{"k": key, "count": n}]


class SpateEmpty(Processor):
    """Touches no state and returns nothing: spate's own cost around a processor."""

    def process(self, key: Any, rows: Sequence[dict], ctx: Context) -> None:
        return None


class SpateBatchCount(BatchProcessor):
    """The running count on the vectorized API: one bulk state read and write per subtask and batch."""

    def open(self, ctx: Context) -> None:
        self.count = ctx.bulk_state(COUNT)

    def process_batch(self, batch: KeyedBatch, ctx: Context) -> dict[str, Any]:
        new = np.asarray(self.count.get_many(batch), dtype="int64") + batch.counts
        self.count.put_many(batch, new)
        return {"k": batch.keys, "count": new}


def _spark_processors() -> tuple[Any, Any, Any]:
    """Spark's own APIs, written as their documentation shows (defined lazily: they need pyspark)."""
    import pandas as pd
    from pyspark.sql import Row
    from pyspark.sql.streaming import StatefulProcessor

    class PandasCount(StatefulProcessor):
        def init(self, handle: Any) -> None:
            self.count = handle.getValueState("count", "count long")

        def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Iterator[Any]:  # noqa: N802,N803
            n = (self.count.get()[0] if self.count.exists() else 0) + sum(len(df) for df in rows)
            self.count.update((n,))
            yield pd.DataFrame({"k": [key[0]], "count": [n]})

        def close(self) -> None:
            pass

    class RowCount(StatefulProcessor):
        def init(self, handle: Any) -> None:
            self.count = handle.getValueState("count", "count long")

        def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Iterator[Any]:  # noqa: N802,N803
            n = (self.count.get()[0] if self.count.exists() else 0) + sum(1 for _ in rows)
            self.count.update((n,))
            yield Row(k=key[0], count=n)

        def close(self) -> None:
            pass

    def group_state_count(key: Any, pdfs: Any, state: Any) -> Iterator[Any]:
        n = (state.get[0] if state.exists else 0) + sum(len(df) for df in pdfs)
        state.update((n,))
        yield pd.DataFrame({"k": [key[0]], "count": [n]})

    return PandasCount, RowCount, group_state_count


def rows_per_subtask(table: Any) -> Any:
    """The floor's ``applyInArrow`` function: one row per subtask (its rows' count), no state."""
    import pyarrow as pa

    return pa.table({"subtask": table.column("subtask").slice(0, 1), "rows": pa.array([table.num_rows], pa.int64())})


# -- inputs --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Inputs:
    """A case's files: ``all`` of its batches, ``spark`` the first ``spark_batches`` (hard links; the same
    directory when that is all), ``extra`` one more batch for the restart."""

    all: str
    spark: str
    extra: str
    distinct_keys: tuple[int, ...] = ()  # per batch: the output rows of a running count (one per key)

    def source(self, case: Case, variant: str) -> str:
        return self.spark if case.batches_of(variant) < case.batches else self.all


def _batch_rows(case: Case, index: int, rng: random.Random) -> list[dict[str, Any]]:
    if case.keys is None:
        return [{"k": f"key-{index * case.rows + i}", "v": 1} for i in range(case.rows)]
    return [{"k": f"key-{rng.randrange(case.keys)}", "v": 1} for _ in range(case.rows)]


def write_inputs(case: Case, workdir: str) -> Inputs:
    rng = random.Random(1)
    extra_dir = f"{workdir}/extra-{case.name}"
    batches = [_batch_rows(case, b, rng) for b in range(case.batches)]
    inputs = Inputs(f"{workdir}/in-{case.name}", f"{workdir}/in-{case.name}-spark",
                    os.path.join(extra_dir, f"clicks-{case.batches:05d}.json"),  # write_batches' name for the file
                    tuple(len({r["k"] for r in rows}) for rows in batches))
    write_batches(inputs.all, batches)
    write_batches(extra_dir, [_batch_rows(case, case.batches, rng)], start=case.batches)
    if case.spark_batches < case.batches:
        os.makedirs(inputs.spark)
        for name in sorted(os.listdir(inputs.all))[:case.spark_batches]:
            os.link(os.path.join(inputs.all, name), os.path.join(inputs.spark, name))
    return inputs


# -- what a run leaves behind ------------------------------------------------------------------------------------
class FileCounter:
    """Distinct files ever seen under a checkpoint directory (listed after every batch); ``state`` counts
    only the state checkpoint's files: for spate all but Spark's own query log (``_spark/``: offsets, commits,
    source log) and the outputs staged for the sink (``staged/``: the batch's outputs, not state; ``staged``
    counts them), for Spark's operators the ``state/`` directory (the floor has none). The query log is the same
    for every variant."""

    def __init__(self, path: str, state_prefix: str | None, skip_prefixes: tuple[str, ...]) -> None:
        self.path, self.state_prefix, self.skip_prefixes = path, state_prefix, skip_prefixes
        self.seen: set[str] = set()
        self.scans = 0
        self.state_at_warmup: int | None = None  # state files seen once the warm-up batches were done

    @staticmethod
    def of(variant: str, ckpt: str) -> FileCounter:
        if variant in SPATE_QUERIES:
            return FileCounter(ckpt, None, ("_spark/", f"{STAGED_DIR}/"))
        return FileCounter(ckpt, "state/", ())

    def scan(self) -> None:
        """After each batch."""
        for d, _dirs, files in os.walk(self.path):
            self.seen.update(os.path.relpath(os.path.join(d, f), self.path) for f in files)
        self.scans += 1
        if self.scans == WARMUP_BATCHES:
            self.state_at_warmup = self.state

    def steady_per_batch(self) -> float | None:
        """State files created per batch after the warm-up batches (None: too few batches to tell)."""
        if self.state_at_warmup is None or self.scans <= WARMUP_BATCHES:
            return None
        return round((self.state - self.state_at_warmup) / (self.scans - WARMUP_BATCHES), 2)

    @property
    def state(self) -> int:
        return sum(1 for p in self.seen if (self.state_prefix is None or p.startswith(self.state_prefix))
                   and not p.startswith(self.skip_prefixes))

    @property
    def staged(self) -> int:
        """Files of outputs staged for the sink (spate's Parquet staging writes one per subtask and batch)."""
        return sum(1 for p in self.seen if p.startswith(f"{STAGED_DIR}/"))


def _vm_hwm_bytes(pid: int) -> int:
    """A process's peak resident set size (``VmHWM``), 0 if it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            line = next((x for x in f if x.startswith("VmHWM:")), "VmHWM: 0 kB")
    except OSError:
        return 0
    return int(line.split()[1]) * 1024


def python_workers(root: int) -> list[int]:
    """Spark's Python processes (``python -m pyspark.daemon`` and the workers it forks) below process
    ``root``: this driver's, not another application's."""
    parents = {pid: procfs.parent(pid) for pid in procfs.pids()}

    def below_root(pid: int) -> bool:
        for _ in range(64):
            pid = parents.get(pid, 0)
            if pid == root:
                return True
            if pid <= 1:
                return False
        return False

    return [pid for pid in parents if below_root(pid) and any(a.startswith("pyspark.") for a in procfs.cmdline(pid))]


class WorkerPeakRss:
    """The largest peak RSS of one Python worker of this driver's Spark, sampled after every batch (a reused
    worker's peak covers every batch it ran)."""

    def __init__(self) -> None:
        self.peak_bytes = 0

    def sample(self) -> None:
        self.peak_bytes = max([self.peak_bytes, *map(_vm_hwm_bytes, python_workers(os.getpid()))])

    @property
    def mb(self) -> float:
        return round(self.peak_bytes / 2**20, 1)


def _dir_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


# -- the queries ---------------------------------------------------------------------------------------------
def _profile_option(profile: bool) -> dict[str, Any]:
    """``profile=True`` for spate's settings when it has worker-side profiling, else nothing."""
    return {"profile": True} if profile and "profile" in {f.name for f in fields(SpateSettings)} else {}


def _spate_stream(variant: str, df: Any, ckpt: str, profile: bool) -> StatefulStream:
    options = dict(checkpoint_root=ckpt, parallelism=PARALLELISM, local_dir=f"{ckpt}-local", changelog=True,
                   file_merging="across", **_profile_option(profile))
    if variant == READBACK:
        options["staged_outputs"] = "arrow"
    if variant in ADAPTER_FLAVOURS:
        pandas_count, row_count, _ = _spark_processors()
        flavour = ADAPTER_FLAVOURS[variant]
        processor = pandas_count() if flavour == "pandas" else row_count()
        return transform_with_state(df, "k", processor, OUTPUT_SCHEMA, flavour=flavour, **options)
    processors: dict[str, type[Processor] | type[BatchProcessor]] = {"spate-empty": SpateEmpty,
                                                                    "spate-batch": SpateBatchCount}
    processor = processors.get(variant) or SpateCount
    return StatefulStream(df, "k", processor, OUTPUT_SCHEMA, **options)


def _spark_stateful(variant: str, df: Any, output_mode: str = "Update") -> Any:
    """The running count on Spark's own API ``variant`` (RocksDB, changelog checkpointing)."""
    df.sparkSession.conf.set("spark.sql.streaming.stateStore.providerClass", ROCKSDB)
    df.sparkSession.conf.set("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")
    pandas_count, row_count, group_state_count = _spark_processors()
    grouped = df.groupBy("k")
    if variant == "transformWithStateInPandas":
        return grouped.transformWithStateInPandas(pandas_count(), OUTPUT_SCHEMA, "Update", "None")
    if variant == "transformWithState":
        return grouped.transformWithState(row_count(), OUTPUT_SCHEMA, output_mode, "None")
    return grouped.applyInPandasWithState(group_state_count, OUTPUT_SCHEMA, "count long", "Update", "NoTimeout")


def _floor_batch(after_batch: Observer) -> Callable[[Any, int], None]:
    """The floor's ``foreachBatch`` function: spate's routing, then one ``applyInArrow`` call per subtask."""
    from pyspark.sql import functions as F

    def batch(df: Any, _batch_id: int) -> None:
        df.sparkSession.conf.set("spark.sql.adaptive.enabled", "false")  # as in spate's own batch session
        kg = F.pmod(F.hash(F.col("k")), F.lit(MAX_PARALLELISM))
        routed = df.withColumn("subtask", F.floor(kg * F.lit(PARALLELISM) / F.lit(MAX_PARALLELISM)).cast("int"))
        routed.groupBy("subtask").applyInArrow(rows_per_subtask, FLOOR_SCHEMA).collect()
        after_batch()

    return batch


def _noop_sink(after_batch: Observer) -> Callable[[Any, int], None]:
    def sink(out: Any, _batch_id: int) -> None:
        out.write.format("noop").mode("overwrite").save()
        after_batch()

    return sink


def start_query(spark: Any, variant: str, source: str, ckpt: str, after_batch: Observer,
                profile: bool = False) -> tuple[Any, StatefulStream | None]:
    """Start the query of ``variant`` (trigger availableNow); returns (query, spate's stream or None)."""
    df = spark.readStream.schema(INPUT_SCHEMA).option("maxFilesPerTrigger", 1).json(source)
    if variant in SPATE_QUERIES:
        stream = _spate_stream(variant, df, ckpt, profile)
        sink = table_sink(variant, ckpt) if variant in SPATE_TABLE_VARIANTS else _noop_sink(after_batch)
        return stream.start(sink, trigger={"availableNow": True}), stream
    if variant in SPARK_TABLE_VARIANTS:
        return start_spark_parquet(_spark_stateful("transformWithState", df, "Append"), ckpt), None
    if variant == FLOOR:
        writer = df.writeStream.foreachBatch(_floor_batch(after_batch))
    else:
        writer = _spark_stateful(variant, df).writeStream.foreachBatch(_noop_sink(after_batch)).outputMode("update")
    return writer.option("checkpointLocation", ckpt).trigger(availableNow=True).start(), None


def _finish(query: Any, stream: StatefulStream | None) -> list[dict[str, Any]]:
    """Wait for the query to end; its progress entries of batches that read rows."""
    query.awaitTermination()
    if stream is not None:
        stream.close()
    return [p for p in query.recentProgress if p["numInputRows"]]


# -- one variant -----------------------------------------------------------------------------------------------
def _start_jvm() -> None:
    """Start Spark's JVM once, on 127.0.0.1 only, through ``spark_session`` (it checks Java and sets the
    workers' Python)."""
    bind_spark_to_loopback()
    spark_session(APP).stop()


def _session(profile: bool) -> Any:
    """A fresh local[2] session (``spark_session``'s settings, after :func:`_start_jvm`); with ``profile``,
    Spark's UI on 127.0.0.1 for the REST API the profile reads."""
    if not profile:
        return spark_session(APP)
    from pyspark.sql import SparkSession

    from spate_tools.bench.spark_profile import loopback_ui_conf

    builder = (SparkSession.builder.master("local[2]").appName(APP).config("spark.sql.shuffle.partitions", "4")
               .config("spark.ui.showConsoleProgress", "false").config("spark.sql.session.timeZone", "UTC"))
    for key, value in loopback_ui_conf().items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _steady(done: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The batches that count: all but the first (warm-up) ones, and at least the last."""
    return done[min(WARMUP_BATCHES, max(0, len(done) - 1)):]


def _commit_ms(steady: list[dict[str, Any]], stream: StatefulStream | None) -> list[float]:
    if stream is not None:
        return [m.checkpoint_ms for m in stream.metrics if not m.replayed][WARMUP_BATCHES:]
    return [sum(op.get("commitTimeMs", 0) for op in p.get("stateOperators", [])) for p in steady]


def _figures(variant: str, case: Case, done: list[dict[str, Any]], stream: StatefulStream | None,
             files: FileCounter, memory: WorkerPeakRss) -> dict[str, Any]:
    steady = _steady(done)
    rows = sum(p["numInputRows"] for p in steady)
    ms = [p["durationMs"]["triggerExecution"] for p in steady]
    batches_run = max(1, len(done))
    return {"variant": variant, "cardinality": case.name, "batches": len(done),
            "rows_per_batch": done[0]["numInputRows"] if done else 0,
            "rows_per_s": round(rows / (sum(ms) / 1000)) if ms and sum(ms) else 0,
            "batch_ms_p50": percentile(ms, 50), "batch_ms_p99": percentile(ms, 99),
            "checkpoint_commit_ms_p50": percentile(_commit_ms(steady, stream), 50),
            "files_per_batch": round(files.state / batches_run, 2),
            "steady_files_per_batch": files.steady_per_batch(),
            "all_files_per_batch": round(len(files.seen) / batches_run, 2),
            "staged_files_per_batch": round(files.staged / batches_run, 2),
            "bytes_on_disk": _dir_bytes(files.path), "worker_peak_rss_mb": memory.mb}


def _table_figures(variant: str, ckpt: str, batches: int, expected_rows: int) -> dict[str, Any]:
    """The table a table-sink variant wrote: its files created per batch and its row count, checked."""
    rows = table_row_count(variant, ckpt)
    return {"table_files_per_batch": round(len(table_files(ckpt)) / max(1, batches), 2), "table_rows": rows,
            "table_rows_ok": rows == expected_rows}


def _profile(api: SparkRestApi, query: Any, done: list[dict[str, Any]],
             stream: StatefulStream | None) -> dict[str, Any]:
    """The run's per-batch breakdown (steady batches): phases (p50 ms) and Spark's jobs and stages."""
    from spate_tools.bench.spark_profile import breakdown, job_rows

    steady = _steady(done)
    jobs = api.jobs_by_batch(str(query.runId))
    worker: dict[int, dict[str, float]] = {}
    for m in stream.metrics if stream else []:
        phases = getattr(m, "profile", None)  # spate's worker-side timings, where this spate has them
        if phases:
            worker[m.batch_id] = phases
    return {"phases": breakdown(steady, jobs, worker), "jobs": job_rows(jobs, [p["batchId"] for p in steady])}


def _restart_s(spark: Any, variant: str, source: str, extra: str, ckpt: str) -> float:
    """Seconds for a new query on the checkpoint to process one more batch."""
    added = os.path.join(source, os.path.basename(extra))
    shutil.copy(extra, added)
    started = time.perf_counter()
    _finish(*start_query(spark, variant, source, ckpt, lambda: None))
    elapsed = time.perf_counter() - started
    os.remove(added)
    return round(elapsed, 2)


def run_variant(case: Case, variant: str, inputs: Inputs, workdir: str, profile: bool) -> dict[str, Any]:
    """Run ``variant`` on ``case`` in a fresh Spark context: its figures (and breakdown, with ``profile``)."""
    spark = _session(profile)
    try:
        api = SparkRestApi(spark.sparkContext) if profile else None  # checks the UI listens on 127.0.0.1 only
        ckpt, source = f"{workdir}/{variant}-{case.name}", inputs.source(case, variant)
        files, memory = FileCounter.of(variant, ckpt), WorkerPeakRss()

        def after_batch() -> None:
            files.scan()
            memory.sample()

        listener = on_every_batch(spark, after_batch) if variant in TABLE_VARIANTS else None
        query, stream = start_query(spark, variant, source, ckpt, after_batch, profile)
        done = _finish(query, stream)
        if listener is not None:
            spark.streams.removeListener(listener)
        result = _figures(variant, case, done, stream, files, memory)
        if variant in TABLE_VARIANTS:
            result |= _table_figures(variant, ckpt, len(done), sum(inputs.distinct_keys[:case.batches_of(variant)]))
        if api is not None and variant in PROFILED:
            result["profile"] = _profile(api, query, done, stream)
        return result | {"recovery_s": _restart_s(spark, variant, source, inputs.extra, ckpt)}
    finally:
        spark.stop()


# -- the bench -------------------------------------------------------------------------------------------------
def bench_spark(quick: bool, profile: bool = False, out_dir: str | None = None,
                variants: Sequence[str] | None = None) -> tuple[list[dict[str, Any]], str]:
    """Run every variant (or only ``variants``, in the benchmark's order) on every case; (results, the printed
    tables). With ``out_dir``, each variant's figures are also appended to ``<out_dir>/spark-results.jsonl`` as
    it finishes: a run stopped half-way keeps them. A ratio whose base variant did not run is None."""
    unknown = sorted(set(variants or ()) - set(VARIANTS))
    if unknown:
        raise SettingError(f"unknown bench spark variants {unknown}: choose from {', '.join(VARIANTS)}")
    workdir = tempfile.mkdtemp(prefix="spate-bench-spark-")
    results: list[dict[str, Any]] = []
    partial = _partial_results(out_dir)
    _start_jvm()
    try:
        steps = [(case, v) for i, case in enumerate(cases(quick)) for v in VARIANTS
                 if not (quick and i and v in (*TABLE_VARIANTS, READBACK))  # --quick: these in the first case only
                 and (variants is None or v in variants)]
        inputs: dict[str, Inputs] = {}
        for case, variant in progress(steps, len(steps), "bench spark"):
            if case.name not in inputs:
                inputs[case.name] = write_inputs(case, workdir)
            results.append(run_variant(case, variant, inputs[case.name], workdir, profile))
            if partial is not None:
                with open(partial, "a") as f:
                    f.write(json.dumps(results[-1]) + "\n")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    add_ratios(results)
    tables = [results_table(results), cases_table(results), tables_table(results)]
    if profile:
        tables.append(profile_tables(results))
    return results, "\n\n".join(tables)


def _partial_results(out_dir: str | None) -> str | None:
    """The file each variant's figures are appended to (emptied first), or None without ``out_dir``."""
    if out_dir is None:
        return None
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "spark-results.jsonl")
    open(path, "w").close()
    return path


# -- ratios and tables -----------------------------------------------------------------------------------------
def _ratio(a: float | None, b: float | None) -> float | None:
    """a / b, None when either is missing or b is 0."""
    return round(a / b, 2) if a is not None and b else None


def _of(results: list[dict[str, Any]], case: str, variant: str) -> dict[str, Any]:
    return next((r for r in results if r["cardinality"] == case and r["variant"] == variant), {})


def _spark_best(results: list[dict[str, Any]], case: str) -> dict[str, Any]:
    """The Spark variant with the most rows/s in ``case``."""
    return max((r for r in results if r["cardinality"] == case and r["variant"] in SPARK_VARIANTS),
               key=lambda r: r["rows_per_s"], default={})


def _spark_fewest_files(results: list[dict[str, Any]], case: str, key: str = "files_per_batch") -> float | None:
    return min((r[key] for r in results if r["cardinality"] == case and r["variant"] in SPARK_VARIANTS
                and r.get(key) is not None), default=None)


def add_ratios(results: list[dict[str, Any]]) -> None:
    """Add to each result: ``vs_floor`` (batch p50 / the floor's); for spate's variants ``vs_spark_best``
    (rows/s / the fastest Spark variant's, named in ``spark_best``) and ``fewer_files_than_spark`` (the
    fewest state files per batch of Spark's variants / its own; ``fewer_steady_files_than_spark`` the same
    in the steady state); for the adapters ``vs_same_api_on_spark`` (rows/s / that of the Spark API it stands
    in for); for the table-sink variants ``vs_noop_sink`` (batch p50 / the same query's with a noop sink); for
    ``spate-readback`` ``vs_jvm_read`` (batch p50 / spate's, whose sink reads staged Parquet in the JVM)."""
    for r in results:
        case = r["cardinality"]
        r["vs_floor"] = _ratio(r["batch_ms_p50"], _of(results, case, FLOOR).get("batch_ms_p50"))
        if r["variant"] in TABLE_VARIANTS:  # the cost of writing a table over the same query with a noop sink
            noop = "spate" if r["variant"] in SPATE_TABLE_VARIANTS else "transformWithState"
            r["vs_noop_sink"] = _ratio(r["batch_ms_p50"], _of(results, case, noop).get("batch_ms_p50"))
        if r["variant"] == READBACK:
            r["vs_jvm_read"] = _ratio(r["batch_ms_p50"], _of(results, case, "spate").get("batch_ms_p50"))
        if r["variant"] not in SPATE_VARIANTS:
            continue
        best = _spark_best(results, case)
        r["spark_best"] = best.get("variant")
        r["vs_spark_best"] = _ratio(r["rows_per_s"], best.get("rows_per_s"))
        r["fewer_files_than_spark"] = _ratio(_spark_fewest_files(results, case), r["files_per_batch"])
        r["fewer_steady_files_than_spark"] = _ratio(_spark_fewest_files(results, case, "steady_files_per_batch"),
                                                    r["steady_files_per_batch"])
        if r["variant"] in SAME_API_ON_SPARK:
            same = _of(results, case, SAME_API_ON_SPARK[r["variant"]])
            r["vs_same_api_on_spark"] = _ratio(r["rows_per_s"], same.get("rows_per_s"))


def _p50(result: dict[str, Any]) -> float | None:
    return result.get("batch_ms_p50")


def _times(x: float | None) -> str:
    return f"{x:.2f}×" if x is not None else ""


def results_table(results: list[dict[str, Any]]) -> str:
    rows = [{"cardinality": r["cardinality"], "variant": r["variant"], "batches": r["batches"],
             "rows/batch": f"{r['rows_per_batch']:,}", "rows/s": f"{r['rows_per_s']:,}",
             "batch p50 ms": round(r["batch_ms_p50"] or 0), "batch p99 ms": round(r["batch_ms_p99"] or 0),
             "p50 / floor": r.get("vs_floor"),
             "commit p50 ms": round(r["checkpoint_commit_ms_p50"] or 0, 1),
             "state files/batch": r["files_per_batch"], "steady": r.get("steady_files_per_batch"),
             "staged files/batch": r.get("staged_files_per_batch"), "all files/batch": r["all_files_per_batch"],
             "on disk": human_bytes(r["bytes_on_disk"]), "restart s": r["recovery_s"],
             "worker peak RSS MB": r["worker_peak_rss_mb"],
             "vs Spark's best": (f"{_times(r.get('vs_spark_best'))} rows/s, "
                                 f"{_times(r.get('fewer_files_than_spark'))} fewer files"
                                 if r["variant"] in SPATE_VARIANTS else ""),
             "vs same API on Spark": _times(r.get("vs_same_api_on_spark"))}
            for r in results if r["variant"] not in TABLE_VARIANTS]
    return format_table(rows, title="spate bench spark: keyed running count, local[2], 4 partitions/subtasks; "
                                    "Spark with RocksDB + changelog checkpointing. p50 / floor: batch p50 over the "
                                    "floor's (same pipeline, no state). State files: the state checkpoint's files "
                                    "created per batch; staged: spate's outputs staged for the sink (Parquet files "
                                    "the sink reads in the JVM, deleted once subsumed); all files: with Spark's own "
                                    "query log (offsets, commits, "
                                    "source log), the same for every variant. vs Spark's best: rows/s over the "
                                    "fastest Spark API's, its fewest state files over ours. Worker peak RSS: the "
                                    "largest peak resident memory of one Python worker")


def _case_row(results: list[dict[str, Any]], case: str) -> dict[str, Any]:
    floor, spate, empty = (_of(results, case, v) for v in (FLOOR, "spate", "spate-empty"))
    best, batch = _spark_best(results, case), _of(results, case, "spate-batch")
    spate_ms, empty_ms = _p50(spate), _p50(empty)
    left = spate_ms - empty_ms if spate_ms is not None and empty_ms is not None else None
    return {"case": case, "floor p50 ms": _p50(floor), "spate p50 ms": spate_ms,
            "spate / floor": spate.get("vs_floor"),
            "spate-empty p50 ms": empty_ms, "spate − spate-empty ms": left,
            "read back / JVM": _of(results, case, READBACK).get("vs_jvm_read"),
            "Spark's best": f"{best.get('variant')} {_p50(best)} ms" if best else "",
            "spate vs best": _times(spate.get("vs_spark_best")),
            "spate-batch vs best": _times(batch.get("vs_spark_best")),
            "ceiling (best / floor)": _ratio(_p50(best), _p50(floor)),
            "adapter vs tWSInPandas": _times(_of(results, case, "spate-adapter").get("vs_same_api_on_spark")),
            "fewer files": _times(spate.get("fewer_files_than_spark"))}


def tables_table(results: list[dict[str, Any]]) -> str:
    rows = [{"cardinality": r["cardinality"], "variant": r["variant"], "batches": r["batches"],
             "batch p50 ms": round(r["batch_ms_p50"] or 0), "p50 / noop sink": r.get("vs_noop_sink"),
             "p50 / floor": r.get("vs_floor"), "state files/batch": r["files_per_batch"],
             "steady": r.get("steady_files_per_batch"), "table files/batch": r["table_files_per_batch"],
             "table rows": f"{r['table_rows']:,}", "rows ok": r["table_rows_ok"]}
            for r in results if r["variant"] in TABLE_VARIANTS]
    return format_table(rows, title="table sinks: the same running count writing each batch's outputs to a table "
                                    "(spate: exactly once, committed with its checkpoint; Spark: its Parquet file "
                                    "sink). p50 / noop sink: over the same query with a noop sink (spate, "
                                    "transformWithState); table files: every file the table directory holds, per "
                                    "batch; rows ok: the table's own row count equals the input's keys per batch")


def cases_table(results: list[dict[str, Any]]) -> str:
    names = list(dict.fromkeys(r["cardinality"] for r in results))
    return format_table([_case_row(results, c) for c in names],
                        title="per case: batch p50 of spate, its empty processor and the floor; spate's rows/s vs "
                              "the best of Spark's three APIs, and the ceiling (Spark's best p50 / the floor's)")


def profile_tables(results: list[dict[str, Any]]) -> str:
    """Per case: the phase breakdown side by side, then each run's Spark jobs and stages."""
    from spate_tools.bench.spark_profile import jobs_table, phase_table

    out = []
    for case in dict.fromkeys(r["cardinality"] for r in results):
        profiled = {r["variant"]: r["profile"] for r in results if r["cardinality"] == case and "profile" in r}
        out.append(phase_table(f"profile, {case}: ms per batch (p50 over the steady batches); worker: spate's "
                               "per-phase timings (each phase: its slowest subtask)",
                               {v: p["phases"] for v, p in profiled.items()}))
        out.append(jobs_table(f"profile, {case}: the Spark jobs of a batch and their stages (p50)",
                              {v: p["jobs"] for v, p in profiled.items()}))
    return "\n\n".join(out)
