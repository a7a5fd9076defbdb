"""``spate demo`` / ``make demo``: the main job on Spark (local mode).

It generates a clickstream into a directory (one JSON file per micro-batch), runs a spate stateful stream
over it with Spark Structured Streaming (parallelism 2, lmdb, changelog and file merging on), stops
mid-stream, restarts at parallelism 4, finishes, checks every output and the checkpointed state against an
independent computation, and prints a summary plus a PNG chart of checkpoint durations.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Sequence
from typing import Any

from spate.checkpoint.inspect import load_checkpoint
from spate.fs import CheckpointStorage
from spate.report import format_table, human_bytes, percentile
from spate.spark.java import ensure_java_home
from spate.spark.stream import StatefulStream
from spate.spark.stream_metrics import BatchMetrics
from spate_tools.demo import ClickCounter, generate, next_steps, print_checks, progress_line, verify_clicks

INPUT_SCHEMA = "user string, page string, ts long"
OUTPUT_SCHEMA = "user string, clicks long"


def write_batches(directory: str, batches: list[list[dict]], start: int = 0) -> None:
    """One JSON-lines file per batch, modification times in batch order (the file source reads oldest first)."""
    os.makedirs(directory, exist_ok=True)
    for i, rows in enumerate(batches, start):
        path = os.path.join(directory, f"clicks-{i:05d}.json")
        with open(path, "w") as f:
            f.write("\n".join(json.dumps(r) for r in rows))
        os.utime(path, (1_700_000_000 + i, 1_700_000_000 + i))


def spark_session(app: str = "spate-demo") -> Any:
    """A local[2] session (Java from the system, or the one ``make`` installed)."""
    if ensure_java_home() is None:
        raise RuntimeError("no Java runtime (>= 17) found: run `make demo`, which installs one, or set JAVA_HOME")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2]").appName(app)
             .config("spark.sql.shuffle.partitions", "4").config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false").config("spark.sql.session.timeZone", "UTC")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def run_spark_demo(workdir: str = "demo-out", quick: bool = False, as_json: bool = False) -> int:
    n_batches, per_batch, users = (8, 500, 500) if quick else (24, 5_000, 20_000)
    shutil.rmtree(workdir, ignore_errors=True)
    source_dir, root = f"{workdir}/input", f"{workdir}/checkpoints"
    source = generate(n_batches, per_batch, users)
    stop_at = n_batches // 2
    write_batches(source_dir, source[:stop_at])
    say = (lambda _text: None) if as_json else progress_line
    say(f"spate demo: {n_batches} batches of {per_batch:,} clicks on Spark (local[2]), parallelism 2, then a "
        f"restart at 4; checkpoint root {os.path.abspath(root)}")
    say("  starting Spark (a JVM: about 10 s)")
    spark = spark_session()
    last_output: dict[str, int] = {}

    def sink(outputs: Any, batch_id: int) -> None:
        rows = outputs.collect()
        for row in rows:
            last_output[row.user] = row.clicks
        say(f"  batch {batch_id + 1}/{n_batches}: checkpoint {batch_id} complete, {len(rows):,} users updated")

    started = time.perf_counter()
    phases: list[tuple[int, Sequence[BatchMetrics]]] = []
    for parallelism in (2, 4):
        if parallelism == 4:
            write_batches(source_dir, source[stop_at:], start=stop_at)
            say("  stopped; restarting at parallelism 4 (state restored from local copies and the checkpoint)")
        else:
            say("  first batch: Spark plans the query and starts its Python workers")
        df = spark.readStream.schema(INPUT_SCHEMA).option("maxFilesPerTrigger", 1).json(source_dir)
        stream = StatefulStream(df, "user", ClickCounter, OUTPUT_SCHEMA, checkpoint_root=root,
                                parallelism=parallelism, table="lmdb", local_dir=f"{workdir}/local-state",
                                changelog=True, file_merging="across")
        stream.start(sink, trigger={"availableNow": True}, query_name=f"spate-demo-p{parallelism}").awaitTermination()
        stream.close()
        phases.append((parallelism, stream.metrics))
    elapsed = time.perf_counter() - started
    say("  verifying the state against an independent computation")
    summary = _summarize(source, root, last_output, phases, elapsed, stop_at) | {"root": os.path.abspath(root)}
    summary["chart"] = _chart(phases, f"{workdir}/checkpoint-durations.png")
    if as_json:
        print(json.dumps(summary, indent=2))
    else:
        _print(summary)
    return 0 if summary["verified"] else 1


def _summarize(source: list[list[dict]], root: str, last_output: dict[str, int],
               phases: list[tuple[int, Sequence[BatchMetrics]]], elapsed: float, stop_at: int) -> dict[str, Any]:
    checks, problems = verify_clicks(source, root, last_output)
    storage = CheckpointStorage(root)
    meta = load_checkpoint(storage)
    metrics = [m for _, ms in phases for m in ms if not m.replayed]
    rows = sum(m.rows for m in metrics)
    state_files = [p for p, _ in storage.list_files() if not p.startswith("_spark/")]
    first_after = phases[1][1][0] if len(phases) > 1 and phases[1][1] else None
    return {
        "batches": len(metrics), "rows": rows, "users": len({r["user"] for b in source for r in b}),
        "rows_per_s": round(rows / elapsed), "seconds": round(elapsed, 1),
        "batch_ms_p50": percentile([m.batch_ms for m in metrics], 50),
        "batch_ms_p99": percentile([m.batch_ms for m in metrics], 99),
        "checkpoint_ms_p50": percentile([m.checkpoint_ms for m in metrics], 50),
        "checkpoint_ms_p99": percentile([m.checkpoint_ms for m in metrics], 99),
        "latest_checkpoint": meta.checkpoint_id, "state_bytes": meta.state_bytes,
        "state_files_alive": len(state_files), "segments": len(meta.segments()),
        "rescale": {"stopped_after_batch": stop_at - 1, "from_parallelism": phases[0][0],
                    "to_parallelism": phases[-1][0],
                    "subtasks_restored": _recovered(first_after, "restored"),
                    "subtasks_from_local_copies": _recovered(first_after, "rescaled")},
        "checks": checks, "verified": all(checks.values()), "problems": problems,
    }


def _recovered(metrics: BatchMetrics | None, kind: str) -> list[int]:
    """The subtasks of a batch whose state got to its base that way (``restored``: from checkpoint storage;
    ``rescaled``: from the old subtasks' local copies, which a restart on the same machines finds too)."""
    return [i for i, st in enumerate(metrics.subtasks) if st.recovery == kind] if metrics is not None else []


def _chart(phases: list[tuple[int, Sequence[BatchMetrics]]], path: str) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(8, 4))
    for parallelism, metrics in phases:
        done = [m for m in metrics if not m.replayed]
        ax.plot([m.batch_id for m in done], [m.checkpoint_ms for m in done], marker="o",
                label=f"parallelism {parallelism}")
    ax.set_xlabel("micro-batch (= checkpoint)")
    ax.set_ylabel("checkpoint commit (ms)")
    ax.set_title("spate demo on Spark: checkpoint durations, rescale 2 → 4")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _print(s: dict[str, Any]) -> None:
    r = s["rescale"]
    print("spate demo: clickstream click counts on Spark Structured Streaming (local[2])\n")
    print(format_table([
        {"what": "input", "value": f"{s['rows']:,} clicks of {s['users']:,} users in {s['batches']} batches"},
        {"what": "throughput", "value": f"{s['rows_per_s']:,} rows/s end to end ({s['seconds']} s incl. Spark)"},
        {"what": "batch duration", "value": f"p50 {s['batch_ms_p50']:.0f} ms, p99 {s['batch_ms_p99']:.0f} ms"},
        {"what": "checkpoint commit", "value": f"p50 {s['checkpoint_ms_p50']:.1f} ms, p99 "
                                             f"{s['checkpoint_ms_p99']:.1f} ms"},
        {"what": "state", "value": f"{human_bytes(s['state_bytes'])} in checkpoint {s['latest_checkpoint']}: "
                                   f"{s['segments']} segments, {s['state_files_alive']} files under the root"},
        {"what": "rescale", "value": f"stopped after batch {r['stopped_after_batch']}, restarted at parallelism "
                                     f"{r['to_parallelism']} (was {r['from_parallelism']}); subtasks "
                                     f"{r['subtasks_restored']} restored from checkpoint storage, "
                                     f"{r['subtasks_from_local_copies']} from local copies"},
        {"what": "chart", "value": s["chart"] or "skipped (matplotlib is not installed)"},
    ], title="summary"))
    print_checks(s)
    print(next_steps(s["root"]))
