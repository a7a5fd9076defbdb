"""A spate job on Spark run as its own driver process, so tests can kill the driver at chosen points.

    python spark_job.py SOURCE ROOT OUT PARALLELISM [FAULT]

Reads JSON files from SOURCE (one file per micro-batch), counts clicks per user with spate, and writes each
batch's outputs to OUT/batch-<id>.json (overwriting: an idempotent sink). FAULT is one of:

- ``task-fails-once:<batch>``: the processor raises in batch <batch>'s first task attempt; Spark retries it.
- ``driver-dies-mid-batch:<batch>``: the driver process dies after the acks, before the checkpoint completes.
- ``driver-dies-after-checkpoint:<batch>``: the driver dies after checkpoint <batch> completed, inside the
  sink, before Spark wrote its commit log.
- ``driver-dies-in-commit:<batch>``: with ``--table``, the driver dies inside batch <batch>'s table commit,
  after its data files were moved into place, before the table records them.
- ``stall:<batch>``: every task of batch <batch> waits (bounded) in its first key until OUT/go exists, after
  writing OUT/stalled-<pid of its Python worker>, so a test can kill an executor while the batch runs.

Options: ``--master spark://...`` runs the driver against a standalone cluster
(:func:`spate_tools.standalone.standalone_session`) instead of ``local[2,3]``; ``--settings JSON`` overrides the
stream's settings (default ``{"local_dir": "OUT/local"}``; ``"local_dir": null`` keeps lmdb state on each
executor's own local disk); ``--spark-checkpoint DIR`` is Spark's own checkpoint location,
``--spark-checkpoint-cache DIR`` the driver-local base directory of it for roots Hadoop cannot open;
``--max-files N`` is the file source's ``maxFilesPerTrigger`` (default 1, 0: no limit); ``--rescale B:P,...``
rescales the running query online to P subtasks from batch B+1 on (called in batch B's sink, as a user would
between two batches); ``--table KIND:LOCATION`` writes the outputs to a table sink (``parquet``, ``delta`` or
``iceberg``: LOCATION is the warehouse of table ``db.out``) instead of the JSON files.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

from spate import Processor, ValueStateDescriptor
from spate.spark.java import ensure_java_home

SCHEMA = "user string, page string, n long"
OUTPUT_SCHEMA = "user string, clicks long, batch long"
CLICKS = ValueStateDescriptor("clicks", default=0)


class CountClicks(Processor):
    """Running click count per user; ``fail_marker`` makes the first attempt of ``fail_batch`` raise;
    ``stall_dir`` makes the tasks of ``stall_batch`` wait for ``<stall_dir>/go``."""

    def __init__(self, fail_batch: int | None = None, fail_marker: str | None = None,
                 stall_batch: int | None = None, stall_dir: str | None = None) -> None:
        self.fail_batch, self.fail_marker = fail_batch, fail_marker
        self.stall_batch, self.stall_dir = stall_batch, stall_dir

    def open(self, ctx):
        self.clicks = ctx.state(CLICKS)
        self.seen = ctx.get_list_state("batches")

    def process(self, key, rows, ctx):
        if ctx.batch_id == self.fail_batch and self.fail_marker and not os.path.exists(self.fail_marker):
            open(self.fail_marker, "w").close()
            raise RuntimeError(f"injected task failure in batch {ctx.batch_id}")
        if ctx.batch_id == self.stall_batch and self.stall_dir:
            self._stall()
        total = self.clicks.value() + len(rows)
        self.clicks.update(total)
        yield {"user": key, "clicks": total, "batch": ctx.batch_id}

    def end_batch(self, ctx):
        self.seen.add(ctx.batch_id)

    def _stall(self, timeout_s: float = 120.0) -> None:
        go = os.path.join(self.stall_dir, "go")
        if os.path.exists(go):
            return
        open(os.path.join(self.stall_dir, f"stalled-{os.getpid()}"), "w").close()
        deadline = time.monotonic() + timeout_s
        while not os.path.exists(go):
            if time.monotonic() > deadline:
                raise RuntimeError(f"stalled task: {go} did not appear within {timeout_s} s")
            time.sleep(0.05)


def table_sink(spec: str, fault: str, fault_batch: int | None):
    """The table sink of ``--table KIND:LOCATION``; with ``driver-dies-in-commit`` one that kills the driver."""
    from spate import DeltaSink, IcebergSink, ParquetSink

    kind, _, where = spec.partition(":")
    base = {"parquet": ParquetSink, "delta": DeltaSink, "iceberg": IcebergSink}[kind]

    class Sink(base):  # type: ignore[valid-type,misc]
        def _commit_files(self, batch_id, files):
            if fault == "driver-dies-in-commit" and batch_id == fault_batch:
                os._exit(17)  # fault injection: the files are in place, the table does not have them yet
            super()._commit_files(batch_id, files)

    return Sink("db.out", warehouse=where) if kind == "iceberg" else Sink(where)


def session(master: str | None):
    if master:
        from spate_tools.standalone import QUICK_JVM_OPTIONS, standalone_session

        aws = {k: os.environ[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")
               if k in os.environ}  # an S3 checkpoint root: executors need the credentials too
        return standalone_session(master, "spate-job", executor_env=aws, jvm_options=QUICK_JVM_OPTIONS)
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2,3]").appName("spate-job")  # 3 attempts per task
             .config("spark.sql.shuffle.partitions", "2").config("spark.ui.enabled", "false")
             .config("spark.sql.session.timeZone", "UTC").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def main(source: str, root: str, out: str, parallelism: int, fault: str = "", master: str | None = None,
         settings: dict | None = None, spark_checkpoint: str | None = None, max_files: int = 1,
         spark_checkpoint_cache: str | None = None, rescale: dict[int, int] | None = None,
         table: str | None = None) -> None:
    ensure_java_home()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from spate.checkpoint.coordinator import Coordinator
    from spate.spark.stream import StatefulStream

    kind, _, at = fault.partition(":")
    fault_batch = int(at) if at else None
    spark = session(master)
    if kind == "driver-dies-mid-batch":
        real_complete = Coordinator.complete

        def complete(self, checkpoint_id):
            if checkpoint_id == fault_batch:
                os._exit(17)
            return real_complete(self, checkpoint_id)

        Coordinator.complete = complete  # type: ignore[method-assign]
    processor = (CountClicks(fault_batch, os.path.join(out, "failed-once")) if kind == "task-fails-once" else
                 CountClicks(stall_batch=fault_batch, stall_dir=out) if kind == "stall" else CountClicks())
    reader = spark.readStream.schema(SCHEMA)
    df = (reader.option("maxFilesPerTrigger", max_files) if max_files else reader).json(source)
    overrides = {"local_dir": os.path.join(out, "local"), **(settings or {})}
    stream = StatefulStream(df, "user", processor, OUTPUT_SCHEMA, checkpoint_root=root, parallelism=parallelism,
                            **overrides)
    os.makedirs(out, exist_ok=True)

    def sink(outputs, batch_id):
        rows = sorted([r.user, r.clicks, r.batch] for r in outputs.collect())
        with open(os.path.join(out, f"batch-{batch_id}.json"), "w") as f:
            json.dump(rows, f)
        if kind == "driver-dies-after-checkpoint" and batch_id == fault_batch:
            os._exit(17)
        if rescale and batch_id in rescale:
            stream.rescale(rescale[batch_id])

    query = stream.start(table_sink(table, kind, fault_batch) if table else sink, trigger={"availableNow": True},
                         spark_checkpoint=spark_checkpoint,
                         spark_checkpoint_cache=spark_checkpoint_cache)
    query.awaitTermination()
    stream.close()
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump({**stream.summary(), "redelivered": stream.redelivered,
                   "replayed": [m.batch_id for m in stream.metrics if m.replayed],
                   "app_id": spark.sparkContext.applicationId,
                   "metrics": [dataclasses.asdict(m) for m in stream.metrics]}, f, default=str)
    spark.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for name in ("source", "root", "out"):
        parser.add_argument(name)
    parser.add_argument("parallelism", type=int)
    parser.add_argument("fault", nargs="?", default="")
    parser.add_argument("--master")
    parser.add_argument("--settings", type=json.loads, default={})
    parser.add_argument("--spark-checkpoint")
    parser.add_argument("--spark-checkpoint-cache")
    parser.add_argument("--max-files", type=int, default=1)
    parser.add_argument("--table")
    parser.add_argument("--rescale", default="", type=lambda spec: {int(b): int(p) for b, p in
                                                                    (x.split(":") for x in spec.split(",") if x)})
    a = parser.parse_args()
    main(a.source, a.root, a.out, a.parallelism, a.fault, a.master, a.settings, a.spark_checkpoint, a.max_files,
         a.spark_checkpoint_cache, a.rescale, a.table)
