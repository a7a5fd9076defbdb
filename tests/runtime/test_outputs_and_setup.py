"""Issue 9, items 9-12: output rows are checked before the checkpoint (LocalRunner and Spark), a restarted
query runs its new processor, lmdb works without local_dir on Spark, executors without spate are a clear
error at start()."""

from __future__ import annotations

import decimal
import os
import subprocess
import sys
import textwrap
import venv

import pyarrow as pa
import pytest
from pyspark import cloudpickle

from helpers.clicks import clicks, state
from helpers.file_source import write_files
from spate import LocalRunner, Processor, ValueStateDescriptor, load_checkpoint
from spate.errors import OutputError
from spate.fs import CheckpointStorage
from spate.runtime.outputs import OutputBuffer
from spate.spark.stream import StatefulStream

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # executors cannot import test modules
TOTAL = ValueStateDescriptor("total", default=0)
SCHEMA = pa.schema([("user", pa.string()), ("total", pa.int64())])
MISTAKES = {  # mistake -> what the error names besides the processor and the key
    "wrong field name": "'totl'",
    "missing field": "'total'",
    "tuple": "tuple",
    "returned dict": "returned a dict",
    "uncoercible type": "'total'",
}


class Totals(Processor):
    """Running row count per user; with ``mistake``, key ``bob`` gets a bad output row from batch 1 on."""

    def __init__(self, mistake: str | None = None) -> None:
        self.mistake = mistake

    def open(self, ctx):
        self.total = ctx.state(TOTAL)

    def process(self, key, rows, ctx):
        self.total.update(self.total.value() + len(rows))
        row = {"user": key, "total": self.total.value()}
        if self.mistake and key == "bob" and ctx.batch_id >= 1:
            return bad_output(self.mistake, row)
        return [row]


def bad_output(mistake: str, row: dict) -> object:
    if mistake == "returned dict":
        return row
    return [{"wrong field name": {"user": row["user"], "totl": row["total"]},
             "missing field": {"user": row["user"]},
             "tuple": (row["user"], row["total"]),
             "uncoercible type": {"user": row["user"], "total": "many"}}[mistake]]


BATCHES = [[{"user": "ann"}, {"user": "bob"}], [{"user": "bob"}, {"user": "ann"}, {"user": "bob"}],
           [{"user": "bob"}]]


def local_run(root: str, mistake: str | None, sink_log: dict, schema: pa.Schema | None = SCHEMA) -> None:
    with LocalRunner(lambda: Totals(mistake), key="user", checkpoint_root=root, parallelism=2, output_schema=schema,
                     sink=lambda rows, n: sink_log.setdefault(n, []).append(sorted(rows, key=str))) as runner:
        runner.run(BATCHES)


def latest_checkpoint(root: str) -> int:
    return load_checkpoint(CheckpointStorage(root)).checkpoint_id


@pytest.mark.parametrize("mistake", MISTAKES)
def test_local_runner_fails_the_batch_on_a_bad_output_row_and_a_fixed_restart_is_exact(tmp_path, mistake):
    root, sink_log = str(tmp_path / "ckpt"), {}
    with pytest.raises(OutputError) as failure:
        local_run(root, mistake, sink_log)
    assert "Totals.process for key 'bob'" in str(failure.value) and MISTAKES[mistake] in str(failure.value)
    assert latest_checkpoint(root) == 0 and list(sink_log) == [0]  # batch 1 committed nothing
    local_run(root, None, sink_log)
    assert sink_log[1] == [[{"user": "ann", "total": 2}, {"user": "bob", "total": 3}]]
    assert sink_log[2] == [[{"user": "bob", "total": 4}]]
    assert state(root, "total") == {"ann": 2, "bob": 4}


def test_local_runner_without_a_schema_refuses_a_returned_dict_and_tuples(tmp_path):
    for mistake in ("returned dict", "tuple"):
        with pytest.raises(OutputError, match="Totals.process for key 'bob'"):
            local_run(str(tmp_path / mistake), mistake, {}, schema=None)


def test_values_are_accepted_as_spark_coerces_them():
    schema = pa.schema([("f", pa.float64()), ("d", pa.decimal128(10, 2)), ("i", pa.int32()), ("s", pa.string()),
                        ("l", pa.list_(pa.int64()))])
    good = [{"f": 1, "d": 2, "i": None, "s": "x", "l": [1, 2]},
            {"f": 1.5, "d": decimal.Decimal("1.25"), "i": 7, "s": "y", "l": None}]
    buffer = OutputBuffer(Totals(), schema)
    buffer.extend(good, "process", "k")
    out = buffer.finish()
    assert len(out) == 2 and out.table.column("d").to_pylist() == [decimal.Decimal("2.00"), decimal.Decimal("1.25")]
    for field, value in [("f", True), ("d", 1.5), ("i", 2 ** 40), ("i", 1.0), ("s", 1), ("l", [1, "x"])]:
        buffer = OutputBuffer(Totals(), schema)
        buffer.extend(good, "process", "k")
        buffer.extend([{**good[0], field: value}], "process", "j")  # the wrong row, named by its key
        buffer.extend(good, "process", "l")
        with pytest.raises(OutputError, match=f"Totals.process for key 'j' field '{field}'"):
            buffer.finish()


# -- Spark ------------------------------------------------------------------------------------------------

SPARK_BATCHES = [[{"user": "ann", "page": "/", "n": 0}, {"user": "bob", "page": "/", "n": 1}],
                 [{"user": "bob", "page": "/", "n": 2}, {"user": "ann", "page": "/", "n": 3},
                  {"user": "bob", "page": "/", "n": 4}]]


def spark_run(spark, source, root, processor, sink_log, **settings):
    df = spark.readStream.schema("user string, page string, n long").option("maxFilesPerTrigger", 1).json(source)
    stream = StatefulStream(df, "user", processor, "user string, total long", checkpoint_root=root,
                            parallelism=2, **settings)
    query = stream.start(lambda out, n: sink_log.setdefault(n, []).append(sorted(tuple(r) for r in out.collect())),
                         trigger={"availableNow": True})
    try:
        query.awaitTermination(180)
    finally:
        query.stop()
        stream.close()
    return query


@pytest.mark.spark
def test_spark_fails_the_batch_on_each_bad_output_row_and_a_fixed_restart_is_exact(spark, tmp_path):
    """Every mistake in turn on one root: each run fails batch 1 with nothing committed, so the next restart
    (another mistake, at last the fixed processor) starts from batch 0's checkpoint again."""
    source, root, sink_log = str(tmp_path / "in"), str(tmp_path / "ckpt"), {}
    write_files(source, SPARK_BATCHES)
    for mistake, named in MISTAKES.items():
        with pytest.raises(Exception) as failure:  # noqa: B017 - StreamingQueryException, carrying the OutputError
            spark_run(spark, source, root, Totals(mistake), sink_log, local_dir=str(tmp_path / "local"))
        assert "Totals.process for key 'bob'" in str(failure.value) and named in str(failure.value), mistake
        assert latest_checkpoint(root) == 0 and list(sink_log) == [0], mistake
    spark_run(spark, source, root, Totals(), sink_log, local_dir=str(tmp_path / "local"))
    assert sink_log[1] == [[("ann", 2), ("bob", 3)]]
    assert state(root, "total") == {"ann": 2, "bob": 3}


class Tagged(Processor):
    """Counts rows per user and tags every output with ``tag`` (which processor produced it)."""

    def __init__(self, tag: str) -> None:
        self.tag = tag

    def open(self, ctx):
        self.total = ctx.state(TOTAL)

    def process(self, key, rows, ctx):
        self.total.update(self.total.value() + len(rows))
        yield {"user": key, "tag": self.tag}


@pytest.mark.spark
@pytest.mark.parametrize("table", ["heap", "lmdb"])
def test_a_restarted_query_runs_the_new_processor(spark, tmp_path, table):
    source, root = str(tmp_path / "in"), str(tmp_path / "ckpt")
    batches = clicks(6, users=8, per_batch=16)
    write_files(source, batches[:3])
    runs: list[dict] = [{}, {}]
    for run, (tag, new_files) in enumerate([("A", batches[3:]), ("B", [])]):
        df = spark.readStream.schema("user string, page string, n long").option("maxFilesPerTrigger", 1).json(source)
        stream = StatefulStream(df, "user", Tagged(tag), "user string, tag string", checkpoint_root=root,
                                parallelism=2, table=table, local_dir=str(tmp_path / "local"))
        query = stream.start(lambda out, n, log=runs[run]: log.update({n: {r.tag for r in out.collect()}}),
                             trigger={"availableNow": True})
        query.awaitTermination(180)
        query.stop()
        stream.close()
        write_files(source, new_files, start=3)
    assert set(runs[0]) == {0, 1, 2} and set(runs[1]) == {3, 4, 5}
    assert all(tags == {"A"} for tags in runs[0].values())
    assert all(tags == {"B"} for tags in runs[1].values()), runs[1]
    assert sum(state(root, "total").values()) == 6 * 16


@pytest.mark.spark
def test_lmdb_without_local_dir_uses_executor_local_disk(spark, tmp_path):
    source, root, sink_log = str(tmp_path / "in"), str(tmp_path / "ckpt"), {}
    write_files(source, SPARK_BATCHES)
    query = spark_run(spark, source, root, Totals(), sink_log, table="lmdb")
    assert query.exception() is None
    assert sink_log == {0: [[("ann", 1), ("bob", 1)]], 1: [[("ann", 2), ("bob", 3)]]}
    assert state(root, "total") == {"ann": 2, "bob": 3}


NO_SPATE_JOB = textwrap.dedent("""
    import os, sys
    from spate.spark.java import ensure_java_home
    ensure_java_home()
    os.environ["PYSPARK_PYTHON"] = sys.argv[1]      # executors run a Python without spate (nor pyspark)
    from pyspark.sql import SparkSession
    from spate import Processor
    from spate.spark.executors import ExecutorPythonError
    from spate.spark.stream import StatefulStream
    from spate.spark.worker_errors import BatchFailedError

    class Echo(Processor):
        def process(self, key, rows, ctx):
            return rows

    spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "1").getOrCreate())
    stream = StatefulStream(spark.readStream.format("rate").load(), "value", Echo, "value long",
                            checkpoint_root=sys.argv[2], table="heap", idle_batches=False)
    query = stream.start()                          # the check runs beside the first batch
    try:
        query.awaitTermination(180)
    except BatchFailedError as e:
        print("raised by:", type(e.error).__name__)
        print("ExecutorPythonError:", e)
    print("checkpoints:", [name for name in os.listdir(sys.argv[2]) if name.startswith("chk-")])
    with_ticks = StatefulStream(spark.readStream.format("rate").load(), "value", Echo, "value long",
                                checkpoint_root=sys.argv[2] + "-ticks", table="heap", idle_batches=True)
    try:
        with_ticks.start()                          # the tick source's Python fails at start: the same error
    except ExecutorPythonError as e:
        print("at start:", e)
    spark.stop()
""")


@pytest.mark.spark
def test_executors_without_spate_are_a_clear_error_at_the_first_batch(tmp_path):
    """The check runs beside the first batch (not before it, which delayed every first output): the batch fails
    with the check's error, which says what to set, and no checkpoint completes. With batches without input on,
    the tick source's Python fails already in ``start()``, which raises the check's error."""
    bare = tmp_path / "bare-python"
    venv.EnvBuilder(with_pip=False).create(bare)
    root = tmp_path / "ckpt"
    job = subprocess.run([sys.executable, "-c", NO_SPATE_JOB, str(bare / "bin" / "python"), str(root)],
                         capture_output=True, text=True, timeout=240,
                         env={**os.environ, "PYSPARK_PYTHON": str(bare / "bin" / "python")})
    assert "ExecutorPythonError:" in job.stdout, job.stdout + job.stderr[-3000:]
    message = job.stdout.split("ExecutorPythonError:", 1)[1]
    assert "PYSPARK_PYTHON" in message and "spark.pyspark.python" in message and sys.executable in message
    assert str(bare) in message
    assert "raised by: ExecutorPythonError" in job.stdout and "checkpoints: []" in job.stdout
    assert "at start: Spark executors run Python" in job.stdout
