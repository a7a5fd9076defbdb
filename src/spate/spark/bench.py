"""``spate bench spark``: a keyed running count on Spark Structured Streaming, side by side on the same
generated files: spate vs ``transformWithStateInPandas``, ``transformWithState`` and
``applyInPandasWithState`` (RocksDB state store, changelog checkpointing on), at high cardinality (every row
a new key) and low cardinality (1k keys, large batches).

Per variant: steady-state rows/s and batch duration p50/p99 (Spark's ``triggerExecution``, first batches
excluded), state commit time, checkpoint files created per batch, bytes on disk, and restart time (a new
query on the same checkpoint processing one more batch).
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
import time
from collections.abc import Iterator
from typing import Any

from spate.report import format_table, human_bytes, percentile, progress
from spate.runtime.processor import Context, Processor
from spate.spark.demo import spark_session, write_batches
from spate.spark.stream import StatefulStream
from spate.state.descriptors import ValueStateDescriptor

INPUT_SCHEMA = "k string, v long"
OUTPUT_SCHEMA = "k string, count long"
VARIANTS = ("spate", "transformWithState", "transformWithStateInPandas", "applyInPandasWithState")
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
WARMUP_BATCHES = 2
COUNT: ValueStateDescriptor[int] = ValueStateDescriptor("count", default=0)


class SpateCount(Processor):
    def open(self, ctx: Context) -> None:
        self.count = ctx.state(COUNT)

    def process(self, key: Any, rows: list[dict], ctx: Context) -> list[dict]:
        n = self.count.value() + len(rows)
        self.count.update(n)
        return [{"k": key, "count": n}]


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


def _generate(directory: str, batches: int, rows: int, keys: int | None, seed: int) -> None:
    """``keys=None``: every row a new key (high cardinality); else keys drawn from ``keys``."""
    rng = random.Random(seed)
    out = []
    for b in range(batches):
        if keys is None:
            out.append([{"k": f"key-{b * rows + i}", "v": 1} for i in range(rows)])
        else:
            out.append([{"k": f"key-{rng.randrange(keys)}", "v": 1} for _ in range(rows)])
    write_batches(directory, out)


class _FileCounter:
    """Distinct files ever seen under a checkpoint directory (listed after every batch); ``state`` counts
    only the state checkpoint's files: for spate all but Spark's own query log (``_spark/``: offsets, commits,
    source log), for Spark's operators the ``state/`` directory. The query log is the same for every variant."""

    def __init__(self, path: str, state_prefix: str | None, skip_prefix: str | None) -> None:
        self.path, self.state_prefix, self.skip_prefix = path, state_prefix, skip_prefix
        self.seen: set[str] = set()

    def scan(self) -> None:
        for d, _dirs, files in os.walk(self.path):
            self.seen.update(os.path.relpath(os.path.join(d, f), self.path) for f in files)

    @property
    def state(self) -> int:
        return sum(1 for p in self.seen if (self.state_prefix is None or p.startswith(self.state_prefix))
                   and not (self.skip_prefix and p.startswith(self.skip_prefix)))


def _counter(variant: str, ckpt: str) -> _FileCounter:
    return _FileCounter(ckpt, None, "_spark/") if variant == "spate" else _FileCounter(ckpt, "state/", None)


def _dir_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def _start(spark: Any, variant: str, source: str, ckpt: str, parallelism: int, counter: _FileCounter) -> Any:
    """Start the query of ``variant`` (trigger availableNow); returns (query, stream or None)."""
    df = spark.readStream.schema(INPUT_SCHEMA).option("maxFilesPerTrigger", 1).json(source)

    def sink(out: Any, batch_id: int) -> None:
        out.write.format("noop").mode("overwrite").save()
        counter.scan()

    if variant == "spate":
        stream = StatefulStream(df, "k", SpateCount, OUTPUT_SCHEMA, checkpoint_root=ckpt, parallelism=parallelism,
                                local_dir=f"{ckpt}-local", changelog=True, file_merging="across")
        return stream.start(sink, trigger={"availableNow": True}), stream
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", ROCKSDB)
    spark.conf.set("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")
    pandas_count, row_count, group_state_count = _spark_processors()
    grouped = df.groupBy("k")
    if variant == "transformWithStateInPandas":
        out = grouped.transformWithStateInPandas(pandas_count(), OUTPUT_SCHEMA, "Update", "None")
    elif variant == "transformWithState":
        out = grouped.transformWithState(row_count(), OUTPUT_SCHEMA, "Update", "None")
    else:
        out = grouped.applyInPandasWithState(group_state_count, OUTPUT_SCHEMA, "count long", "Update",
                                             "NoTimeout")
    query = out.writeStream.foreachBatch(sink).option("checkpointLocation", ckpt).outputMode("update") \
        .trigger(availableNow=True).start()
    return query, None


def _run_variant(spark: Any, variant: str, cardinality: str, source: str, extra: str, workdir: str,
                 batches: int, parallelism: int) -> dict[str, Any]:
    ckpt = f"{workdir}/{variant}-{cardinality}"
    counter = _counter(variant, ckpt)
    query, stream = _start(spark, variant, source, ckpt, parallelism, counter)
    query.awaitTermination()
    progress_ = [p for p in query.recentProgress if p["numInputRows"]]
    if stream is not None:
        stream.close()
    steady = progress_[WARMUP_BATCHES:] or progress_
    rows = sum(p["numInputRows"] for p in steady)
    ms = [p["durationMs"]["triggerExecution"] for p in steady]
    if stream is not None:
        commit = [m.checkpoint_ms for m in stream.metrics if not m.replayed][WARMUP_BATCHES:]
    else:
        commit = [sum(op.get("commitTimeMs", 0) for op in p.get("stateOperators", [])) for p in steady]
    batches_run = max(1, len(progress_))
    shutil.copy(extra, os.path.join(source, os.path.basename(extra)))  # one more batch, then restart
    started = time.perf_counter()
    query, stream = _start(spark, variant, source, ckpt, parallelism, _counter(variant, ckpt))
    query.awaitTermination()
    recovery_s = time.perf_counter() - started
    if stream is not None:
        stream.close()
    os.remove(os.path.join(source, os.path.basename(extra)))
    return {"variant": variant, "cardinality": cardinality, "batches": len(progress_),
            "rows_per_batch": progress_[0]["numInputRows"] if progress_ else 0,
            "rows_per_s": round(rows / (sum(ms) / 1000)) if ms and sum(ms) else 0,
            "batch_ms_p50": percentile(ms, 50), "batch_ms_p99": percentile(ms, 99),
            "checkpoint_commit_ms_p50": percentile(commit, 50),
            "files_per_batch": round(counter.state / batches_run, 2),
            "all_files_per_batch": round(len(counter.seen) / batches_run, 2),
            "bytes_on_disk": _dir_bytes(ckpt), "recovery_s": round(recovery_s, 2)}


def bench_spark(quick: bool) -> tuple[list[dict[str, Any]], str]:
    cases = ({"high": (3, 2_000, None), "low": (3, 20_000, 1_000)} if quick else
             {"high": (8, 20_000, None), "low": (8, 200_000, 1_000)})
    workdir = tempfile.mkdtemp(prefix="spate-bench-spark-")
    spark = spark_session("spate-bench")
    results = []
    try:
        steps = [(c, v) for c in cases for v in VARIANTS]
        for cardinality, variant in progress(steps, len(steps), "bench spark"):
            n, rows, keys = cases[cardinality]
            source, extra_dir = f"{workdir}/in-{cardinality}", f"{workdir}/extra-{cardinality}"
            if not os.path.isdir(source):
                _generate(source, n, rows, keys, seed=1)
                _generate(extra_dir, n + 1, rows, keys, seed=2)
            extra = os.path.join(extra_dir, f"clicks-{n:05d}.json")
            results.append(_run_variant(spark, variant, cardinality, source, extra, workdir, n, 4))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return results, _table(results)


def _table(results: list[dict[str, Any]]) -> str:
    rows = []
    for r in results:
        best = max((x["rows_per_s"] for x in results if x["cardinality"] == r["cardinality"]
                    and x["variant"] != "spate"), default=0)
        spark_files = min((x["files_per_batch"] for x in results if x["cardinality"] == r["cardinality"]
                           and x["variant"] != "spate"), default=0)
        rows.append({"cardinality": r["cardinality"], "variant": r["variant"],
                     "rows/batch": f"{r['rows_per_batch']:,}", "rows/s": f"{r['rows_per_s']:,}",
                     "batch p50 ms": round(r["batch_ms_p50"] or 0), "batch p99 ms": round(r["batch_ms_p99"] or 0),
                     "commit p50 ms": round(r["checkpoint_commit_ms_p50"] or 0, 1),
                     "state files/batch": r["files_per_batch"], "all files/batch": r["all_files_per_batch"],
                     "on disk": human_bytes(r["bytes_on_disk"]),
                     "restart s": r["recovery_s"],
                     "vs Spark's best": (f"{r['rows_per_s'] / best:.1f}× rows/s, "
                                         f"{spark_files / r['files_per_batch']:.1f}× fewer files"
                                         if r["variant"] == "spate" and best and r["files_per_batch"] else "")})
    return format_table(rows, title="spate bench spark: keyed running count, local[2], 4 partitions/subtasks; "
                                    "Spark with RocksDB + changelog checkpointing. State files: the state "
                                    "checkpoint's files created per batch; all files: with Spark's own query "
                                    "log (offsets, commits, source log), the same for every variant")
