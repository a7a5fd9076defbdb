"""``spate bench first``: how long after ``start()`` the sink gets the first batch's outputs, spate against Spark's
own ``transformWithStateInPandas``, the same ``StatefulProcessor`` on the same input.

A new user's first minute: the session is up, the query starts, and the first output arrives. Each round starts a
fresh ``local[2]`` session (new Python workers; the JVM's classes stay loaded), writes one file of input, and
takes the time from building the query (``StatefulStream(...)``, ``transform_with_state(...)``,
``groupBy(k).transformWithStateInPandas(...)``) and starting it with ``availableNow`` to the sink's first call
(the sink collects the batch, as a user's would). Rounds alternate the variants (after one warm-up round of
each, not counted) so that the machine's drift hits both alike. ``start_s`` is the part until ``start()``
returned; the rest is the first batch up to the sink.

Variants: ``spark`` (``df.groupBy(k).transformWithStateInPandas``, RocksDB), ``spate-adapter``
(``transform_with_state``, the same processor), ``spate`` (``StatefulStream`` with a spate ``Processor``).
JSON keys: ``variant``, ``rounds``, ``first_output_s`` (median), ``first_output_s_min``, ``first_output_s_max``,
``start_s`` (median), ``vs_spark`` (median over Spark's median).
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from typing import Any

from spate.report import format_table
from spate.spark.stream import StatefulStream, transform_with_state
from spate_tools.bench.spark import (
    INPUT_SCHEMA,
    OUTPUT_SCHEMA,
    SpateCount,
    _spark_processors,
    _spark_stateful,
    _start_jvm,
)
from spate_tools.spark_demo import spark_session, write_batches

APP = "spate-bench-first"
VARIANTS = ("spark", "spate-adapter", "spate")
ROWS = 2_000
KEYS = 500
PARALLELISM = 2


def _rows() -> list[dict[str, Any]]:
    return [{"k": f"k{i % KEYS}", "v": i} for i in range(ROWS)]


def one_round(variant: str, workdir: str) -> dict[str, float]:
    """A fresh session, one file, the query started: seconds until the sink's first call (and spate's breakdown)."""
    source, ckpt = f"{workdir}/in", f"{workdir}/ckpt"
    write_batches(source, [_rows()])
    spark = spark_session(APP)
    first: list[float] = []

    def sink(out: Any, _batch_id: int) -> None:
        out.collect()
        if not first:
            first.append(time.perf_counter())

    try:
        df = spark.readStream.schema(INPUT_SCHEMA).json(source)
        started = time.perf_counter()  # the query built and started, as a user's code does
        stream = None if variant == "spark" else _stream(variant, df, ckpt)
        if stream is None:
            query = (_spark_stateful("transformWithStateInPandas", df).writeStream.foreachBatch(sink)
                     .outputMode("update").option("checkpointLocation", ckpt).trigger(availableNow=True).start())
        else:
            query = stream.start(sink, trigger={"availableNow": True})
        start_done = time.perf_counter()
        query.awaitTermination(600)
        if stream is not None:
            stream.close()
        if not first:
            raise RuntimeError(f"{variant}: the sink got no output")
        return {"first_output_s": first[0] - started, "start_s": start_done - started}
    finally:
        spark.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def _stream(variant: str, df: Any, ckpt: str) -> StatefulStream:
    options: dict[str, Any] = {"checkpoint_root": ckpt, "parallelism": PARALLELISM, "local_dir": f"{ckpt}-local"}
    if variant == "spate":
        return StatefulStream(df, "k", SpateCount, OUTPUT_SCHEMA, **options)
    pandas_count, _row_count, _ = _spark_processors()
    return transform_with_state(df, "k", pandas_count(), OUTPUT_SCHEMA, **options)


def bench_first(quick: bool) -> tuple[list[dict[str, Any]], str]:
    rounds = 2 if quick else 5
    _start_jvm()
    measured: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
    for r in range(rounds + 1):  # round 0 warms up (not counted)
        for variant in VARIANTS:
            figures = one_round(variant, tempfile.mkdtemp(prefix="spate-bench-first-"))
            if r:
                measured[variant].append(figures)
    results = [_summary(v, measured[v]) for v in VARIANTS]
    spark_median = results[0]["first_output_s"]
    for row in results:
        row["vs_spark"] = round(row["first_output_s"] / spark_median, 3)
    return results, format_table(results, title=f"first output after start(), {rounds} rounds each "
                                                "(a fresh local[2] session per round)")


def _summary(variant: str, runs: list[dict[str, float]]) -> dict[str, Any]:
    firsts = [r["first_output_s"] for r in runs]
    row: dict[str, Any] = {"variant": variant, "rounds": len(runs),
                           "first_output_s": round(statistics.median(firsts), 3),
                           "first_output_s_min": round(min(firsts), 3), "first_output_s_max": round(max(firsts), 3)}
    row["start_s"] = round(statistics.median(r["start_s"] for r in runs), 3)
    return row
