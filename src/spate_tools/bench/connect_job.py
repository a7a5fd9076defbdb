"""One run of ``spate bench connect``: the same stream (a count per key, lmdb state, the changelog on) over a file
source, on a classic session of ``--master`` or on the Spark Connect server at ``--remote``, every batch of the
source once (``availableNow``). Run as ``python -m spate_tools.bench.connect_job`` (a Connect client session
turns its whole process to Connect mode, so each run has a process of its own); prints one JSON object.

Batch time is Spark's ``addBatch`` of each batch (the whole ``foreachBatch``: spate's job, its checkpoint and the
sink), the same measure for both kinds of session; ``local_reuse`` is spate's (the fraction of subtask-batches
that ran on their local state).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from spate.report import percentile


def _session(args: argparse.Namespace) -> Any:
    from pyspark.sql import SparkSession

    if args.remote:
        return SparkSession.builder.remote(args.remote).getOrCreate()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from spate_tools.connect_server import session_conf

    builder = SparkSession.builder.master(args.master).appName("spate-bench-connect")
    for key, value in session_conf(args.jvm_options).items():
        builder = builder.config(key, value)
    spark = builder.config("spark.ui.showConsoleProgress", "false").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _added_ms(progress: Any) -> float | None:
    """Spark's ``addBatch`` of a batch that read rows (a progress object, or a plain dict in some versions)."""
    durations, rows = (progress.durationMs, progress.numInputRows) if hasattr(progress, "durationMs") else (
        progress["durationMs"], progress["numInputRows"])
    return float(durations["addBatch"]) if rows and "addBatch" in durations else None


def run(args: argparse.Namespace) -> dict[str, Any]:
    from spate.spark.stream import StatefulStream
    from spate_tools.bench.spark import INPUT_SCHEMA, OUTPUT_SCHEMA, SpateCount

    spark = _session(args)
    df = spark.readStream.schema(INPUT_SCHEMA).option("maxFilesPerTrigger", 1).json(args.source)
    stream = StatefulStream(df, "k", SpateCount, OUTPUT_SCHEMA, checkpoint_root=args.root,
                            parallelism=args.parallelism, table="lmdb", changelog=True)
    sink_dir = args.root + "-out"

    def sink(outputs: Any, batch_id: int) -> None:
        outputs.write.mode("overwrite").parquet(f"{sink_dir}/batch={batch_id}")

    query = stream.start(sink, trigger={"availableNow": True})
    query.awaitTermination()
    stream.close()
    added = [ms for ms in map(_added_ms, query.recentProgress) if ms is not None]
    summary = stream.summary()
    spark.stop()
    return {"batches": len(added), "batch_ms_p50": percentile(added, 50), "batch_ms_p90": percentile(added, 90),
            "local_reuse": summary["local_reuse"], "restored": summary["restored"],
            "caught_up": summary["caught_up"], "rows": summary["rows"]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--source", required=True)
    p.add_argument("--root", required=True)
    p.add_argument("--parallelism", type=int, default=4)
    p.add_argument("--master", default="local[2]")
    p.add_argument("--remote", default=None, help="a Spark Connect URL: run on that server instead")
    p.add_argument("--jvm-options", default="", help="added to the driver's and the executors' Java options")
    print(json.dumps(run(p.parse_args(argv))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
