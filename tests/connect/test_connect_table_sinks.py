"""Table sinks on a Spark Connect session: the subtasks write the batch's data files in the batch's
``mapInArrow`` job, the driver (in the server's ``foreachBatch`` process) commits them once the checkpoint
completed; every batch in the table exactly once, through a restart at another parallelism. The client sees the
batches' figures and reads the table with Spark."""

from __future__ import annotations

import pytest

from helpers.clicks import SCHEMA, CountClicks, clicks, expected_rows, table_rows
from helpers.file_source import write_files
from spate import DeltaSink, ParquetSink
from spate.spark.stream import StatefulStream

pytestmark = pytest.mark.spark
OUT = "user string, clicks long, batch long"


@pytest.mark.parametrize("kind", ["parquet", "delta"])
def test_table_sinks_over_connect(connect, tmp_path, kind):
    source, where = str(tmp_path / "in"), str(tmp_path / "table")
    batches = clicks(4, seed=8)
    for parallelism, upto in ((2, 2), (3, 4)):
        write_files(source, batches[upto - 2:upto], start=upto - 2)
        sink = ParquetSink(where) if kind == "parquet" else DeltaSink(where)
        df = connect.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(source)
        stream = StatefulStream(df, "user", CountClicks, OUT, checkpoint_root=str(tmp_path / "ckpt"),
                                parallelism=parallelism)
        stream.start(sink, trigger={"availableNow": True}).awaitTermination()
        stream.close()
        assert [m.batch_id for m in stream.metrics] == list(range(upto - 2, upto)), kind
    assert table_rows(kind, where) == expected_rows(batches), "every batch in the table exactly once"
    if kind == "parquet":
        assert connect.read.parquet(where).count() == sum(len({r["user"] for r in b}) for b in batches)
