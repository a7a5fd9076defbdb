"""A spate job on Spark run as its own driver process, so tests can kill the driver at chosen points.

    python spark_job.py SOURCE ROOT OUT PARALLELISM [FAULT]

Reads JSON files from SOURCE (one file per micro-batch), counts clicks per user with spate, and writes each
batch's outputs to OUT/batch-<id>.json (overwriting: an idempotent sink). FAULT is one of:

- ``task-fails-once:<batch>``: the processor raises in batch <batch>'s first task attempt; Spark retries it.
- ``driver-dies-mid-batch:<batch>``: the driver process dies after the acks, before the checkpoint completes.
- ``driver-dies-after-checkpoint:<batch>``: the driver dies after checkpoint <batch> completed, inside the
  sink, before Spark wrote its commit log.
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from spate import Processor, ValueStateDescriptor  # noqa: E402
from spate.spark.java import ensure_java_home  # noqa: E402

SCHEMA = "user string, page string, n long"
OUTPUT_SCHEMA = "user string, clicks long, batch long"
CLICKS = ValueStateDescriptor("clicks", default=0)


class CountClicks(Processor):
    """Running click count per user; ``fail_marker`` makes the first attempt of ``fail_batch`` raise."""

    def __init__(self, fail_batch: int | None = None, fail_marker: str | None = None) -> None:
        self.fail_batch, self.fail_marker = fail_batch, fail_marker

    def open(self, ctx):
        self.clicks = ctx.state(CLICKS)
        self.seen = ctx.get_list_state("batches")

    def process(self, key, rows, ctx):
        if ctx.batch_id == self.fail_batch and self.fail_marker and not os.path.exists(self.fail_marker):
            open(self.fail_marker, "w").close()
            raise RuntimeError(f"injected task failure in batch {ctx.batch_id}")
        total = self.clicks.value() + len(rows)
        self.clicks.update(total)
        yield {"user": key, "clicks": total, "batch": ctx.batch_id}

    def end_batch(self, ctx):
        self.seen.add(ctx.batch_id)


def main(source: str, root: str, out: str, parallelism: int, fault: str = "") -> None:
    ensure_java_home()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from spate.checkpoint.coordinator import Coordinator
    from spate.spark.stream import StatefulStream

    kind, _, at = fault.partition(":")
    fault_batch = int(at) if at else None
    spark = (SparkSession.builder.master("local[2,3]").appName("spate-job")  # 3 attempts per task
             .config("spark.sql.shuffle.partitions", "2").config("spark.ui.enabled", "false")
             .config("spark.sql.session.timeZone", "UTC").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    if kind == "driver-dies-mid-batch":
        real_complete = Coordinator.complete

        def complete(self, checkpoint_id):
            if checkpoint_id == fault_batch:
                os._exit(17)
            return real_complete(self, checkpoint_id)

        Coordinator.complete = complete  # type: ignore[method-assign]
    processor = CountClicks(fault_batch, os.path.join(out, "failed-once")) if kind == "task-fails-once" else \
        CountClicks()
    df = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(source)
    stream = StatefulStream(df, "user", processor, OUTPUT_SCHEMA, checkpoint_root=root, parallelism=parallelism,
                            local_dir=os.path.join(out, "local"))
    os.makedirs(out, exist_ok=True)

    def sink(outputs, batch_id):
        rows = sorted([r.user, r.clicks, r.batch] for r in outputs.collect())
        with open(os.path.join(out, f"batch-{batch_id}.json"), "w") as f:
            json.dump(rows, f)
        if kind == "driver-dies-after-checkpoint" and batch_id == fault_batch:
            os._exit(17)

    query = stream.start(sink, trigger={"availableNow": True})
    query.awaitTermination()
    stream.close()
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump({**stream.summary(), "redelivered": stream.redelivered,
                   "replayed": [m.batch_id for m in stream.metrics if m.replayed]}, f)
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5] if len(sys.argv) > 5 else "")
