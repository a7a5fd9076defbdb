"""Table sinks on real PySpark: each subtask writes the batch's data file in the batch's one Spark job, the driver
commits it to the table once the checkpoint completed; exactly once through a driver killed mid-batch or inside
the commit, and a task failing once. The tables are read by their own readers and by Spark."""

from __future__ import annotations

import os
from collections import Counter

import pytest

from helpers.clicks import CountClicks, clicks, expected_rows, run_job, table_rows
from helpers.file_source import write_files
from spate import DeltaSink, IcebergSink, ParquetSink
from spate.spark.stream import StatefulStream

pytestmark = pytest.mark.spark
OUT = "user string, clicks long, batch long"


def test_table_sinks_write_in_the_batchs_own_job(spark, tmp_path):
    """One Spark job per batch (no job reads the outputs back), each sink's table holds every batch once, and
    Spark reads the Parquet directory."""
    source = str(tmp_path / "in")
    batches = clicks(3)
    write_files(source, batches)
    sinks = {"parquet": ParquetSink(str(tmp_path / "pq")), "delta": DeltaSink(str(tmp_path / "delta")),
             "iceberg": IcebergSink("db.out", warehouse=str(tmp_path / "ice"))}
    for kind, sink in sinks.items():
        df = spark.readStream.schema("user string, page string, n long").option("maxFilesPerTrigger", 1).json(source)
        stream = StatefulStream(df, "user", CountClicks, OUT, checkpoint_root=str(tmp_path / f"cp-{kind}"),
                                parallelism=2)
        stream.start(sink, trigger={"availableNow": True}).awaitTermination()
        stream.close()
        assert [m.spark_jobs for m in stream.metrics] == [1, 1, 1], f"{kind}: one Spark job per batch"
        where = sink.warehouse if kind == "iceberg" else sink.location
        assert table_rows(kind, where) == expected_rows(batches), kind
    assert spark.read.parquet(str(tmp_path / "pq")).count() == sum(len({r["user"] for r in b}) for b in batches)


# every sink through every step of the driver and of the commit is tests/sinks/test_table_sinks.py's and
# `spate fuzz --sink`'s (in process); here the Spark transport once: a driver process killed inside the commit,
# restarted at another parallelism (the cluster test kills an executor mid-batch)
@pytest.mark.parametrize("kind,fault", [("delta", "driver-dies-in-commit:2")])
def test_exactly_once_through_faults(tmp_path, kind, fault):
    source, root, out, where = (str(tmp_path / n) for n in ("in", "ckpt", "out", "table"))
    batches = clicks(4, seed=7)
    write_files(source, batches)
    dies = fault.startswith("driver-dies")
    run_job(source, root, out, 2, fault, expect=17 if dies else 0, extra=("--table", f"{kind}:{where}"))
    if dies:
        run_job(source, root, out, 3, extra=("--table", f"{kind}:{where}"))  # restarted at another parallelism
    assert table_rows(kind, where) == expected_rows(batches), "every batch in the table exactly once"
    data = os.path.join(where, "db", "out", "data") if kind == "iceberg" else where
    staging = os.path.join(data, "_spate_staging")
    assert not os.path.isdir(staging) or os.listdir(staging) == [], "nothing left staged"
    part_files = Counter(f.split("-")[1] for f in os.listdir(data) if f.startswith("part-"))
    assert sorted(part_files) == [f"{b:012d}" for b in range(4)]
