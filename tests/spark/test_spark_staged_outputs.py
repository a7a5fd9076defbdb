"""A function sink's DataFrame on Spark: outputs staged as Parquet files (where Spark reads the root by path)
are read by Spark's own Parquet scan in the JVM, with no Python task; staged framed (``staged_outputs="arrow"``,
and every object-store root) they are read back by Python tasks. Both give the sink the same rows."""

from __future__ import annotations

import sys

import pyarrow as pa
import pyarrow.fs as pafs
import pytest
from pyspark import cloudpickle

from helpers.clicks import CountClicks, clicks
from helpers.file_source import write_files
from spate import load_checkpoint, verify_checkpoint
from spate.fs import CheckpointStorage
from spate.spark.staged import staged_format
from spate.spark.stream import StatefulStream

pytestmark = pytest.mark.spark
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def run(spark, source, root, staged_outputs, **settings):
    df = spark.readStream.schema("user string, page string, n long").option("maxFilesPerTrigger", 1).json(source)
    stream = StatefulStream(df, "user", CountClicks, "user string, clicks long, batch long", checkpoint_root=root,
                            parallelism=2, table="heap", staged_outputs=staged_outputs, **settings)
    seen: dict[int, tuple[list, str]] = {}

    def sink(out, batch_id):
        plan = out._jdf.queryExecution().executedPlan().toString()
        seen[batch_id] = (sorted(tuple(r) for r in out.collect()), plan)

    query = stream.start(sink, trigger={"availableNow": True})
    query.awaitTermination()
    assert query.exception() is None
    stream.close()
    return stream, seen


@pytest.mark.parametrize("merging", ["across", "off"])
def test_the_sink_reads_parquet_in_the_jvm_and_gets_what_the_python_read_back_gets(spark, tmp_path, merging):
    source = str(tmp_path / "in")
    write_files(source, clicks(5, seed=3))
    parquet_root, arrow_root = str(tmp_path / "parquet"), str(tmp_path / "arrow")
    jvm, jvm_seen = run(spark, source, parquet_root, "auto", file_merging=merging)
    py, py_seen = run(spark, source, arrow_root, "arrow", file_merging=merging)
    assert (jvm.staged_format, py.staged_format) == ("parquet", "arrow")
    assert sorted(jvm_seen) == sorted(py_seen) == list(range(5))
    assert {b: rows for b, (rows, _) in jvm_seen.items()} == {b: rows for b, (rows, _) in py_seen.items()}
    for rows, plan in jvm_seen.values():
        assert rows and "FileScan parquet" in plan and "Python" not in plan and "MapInArrow" not in plan, plan
    for _, plan in py_seen.values():
        assert "MapInArrow" in plan, plan
    storage = CheckpointStorage(parquet_root)
    meta = load_checkpoint(storage)
    handles = [st.outputs for st in meta.subtasks]
    assert all(h is not None and h.serializer == "parquet" and h.path.startswith(f"staged/{meta.checkpoint_id}/")
               for h in handles)
    assert verify_checkpoint(storage, meta) == []
    staged = sorted(p.parent.name for p in (tmp_path / "parquet" / "staged").rglob("*.parquet"))
    retained = {str(m.checkpoint_id) for m in jvm.coordinator.completed}
    assert set(staged) == retained and len(staged) == 2 * len(retained), \
        "staged files of subsumed checkpoints are deleted, one per subtask and retained checkpoint stays"
    assert {st.outputs.serializer for st in load_checkpoint(CheckpointStorage(arrow_root)).subtasks} == {"arrow"}


def test_parquet_staging_only_where_spark_reads_the_root_by_path(tmp_path):
    local = CheckpointStorage(str(tmp_path))
    store = CheckpointStorage("bucket/root", filesystem=pafs._MockFileSystem())  # an object store's kind
    assert staged_format("auto", local) == "parquet" and staged_format("auto", store) == "arrow"
    assert staged_format("arrow", local) == "arrow" and staged_format("parquet", local) == "parquet"
    with pytest.raises(ValueError, match=r"staged_outputs='parquet' needs a checkpoint root Spark reads by path.*"
                                         r"use staged_outputs='auto' or 'arrow'"):
        staged_format("parquet", store)
    globbed = CheckpointStorage(str(tmp_path / "runs[1]"))  # Hadoop would read [1] as a character class
    assert staged_format("auto", globbed) == "arrow"
    nulls = pa.schema([("user", pa.string()), ("nothing", pa.null())])
    assert staged_format("auto", local, nulls) == "arrow"
    with pytest.raises(ValueError, match=r"reads no column of the null type"):
        staged_format("parquet", local, nulls)
