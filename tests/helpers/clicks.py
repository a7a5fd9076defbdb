"""The click-count job of the Spark tests: ``CountClicks`` (a running click count per user), its input
(``clicks``), a run in this process (``run_stream``) or as a driver process of its own (``run_job``, the
script helpers/spark_job.py), what such a run wrote (``job_outputs``, ``table_rows``), the state its checkpoint
holds (``state``) and the outputs a single-process run of the same processor gives (``reference_outputs``,
``expected_rows``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pyarrow.dataset as ds
from pyspark import cloudpickle

from helpers import spark_job
from spate import IcebergSink, Processor, ValueStateDescriptor, keyed_state_entries, load_checkpoint
from spate.fs import CheckpointStorage
from spate.spark.stream import StatefulStream

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # executors cannot import the tests' helpers
SCHEMA = "user string, page string, n long"
CLICKS = ValueStateDescriptor("clicks", default=0)


class CountClicks(Processor):
    def open(self, ctx):
        self.clicks = ctx.state(CLICKS)
        self.seen = ctx.get_list_state("batches")

    def process(self, key, rows, ctx):
        total = self.clicks.value() + len(rows)
        self.clicks.update(total)
        yield {"user": key, "clicks": total, "batch": ctx.batch_id}

    def end_batch(self, ctx):
        self.seen.add(ctx.batch_id)


def clicks(n_batches, users=40, per_batch=60, seed=0):
    return [[{"user": f"u{(b * 31 + i * 7 + seed) % users}", "page": f"/p{i % 5}", "n": i} for i in range(per_batch)]
            for b in range(n_batches)]


def run_stream(spark, source, root, parallelism, sink_log, **settings):
    df = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(source)
    stream = StatefulStream(df, "user", CountClicks, "user string, clicks long, batch long",
                            checkpoint_root=root, parallelism=parallelism, **settings)

    def sink(out, batch_id):
        sink_log.setdefault(batch_id, []).append(sorted(tuple(r) for r in out.collect()))

    query = stream.start(sink, trigger={"availableNow": True})
    query.awaitTermination()
    stream.close()
    return stream, query


def state(root, name="clicks"):
    storage = CheckpointStorage(root)
    return {e.key: e.value for e in keyed_state_entries(storage, load_checkpoint(storage), name)}


# -- faults and rescales, each Spark driver in its own process -------------------------------------------------
JOB = os.path.abspath(spark_job.__file__)  # the driver script


def run_job(source, root, out, parallelism, fault="", expect=0, extra=()):
    proc = subprocess.run([sys.executable, JOB, source, root, out, str(parallelism), fault, *extra],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == expect, proc.stderr[-3000:]
    return proc


def reference_outputs(batches):
    """Each batch's outputs from a single-process run of the same processor (LocalRunner, no Spark)."""
    import tempfile

    from spate import LocalRunner

    out: dict[int, list] = {}
    with LocalRunner(spark_job.CountClicks, key="user", checkpoint_root=tempfile.mkdtemp(), parallelism=1) as r:
        for result in r.run(batches):
            out[result.batch_id] = sorted([o["user"], o["clicks"], o["batch"]] for o in result.outputs)
    return out


def job_outputs(out, n):
    got = {}
    for b in range(n):
        with open(os.path.join(out, f"batch-{b}.json")) as f:
            got[b] = json.load(f)
    return got


# -- the job's outputs in a table sink -------------------------------------------------------------------------
def table_rows(kind: str, where: str) -> list[list]:
    if kind == "parquet":
        table = ds.dataset(where, format="parquet").to_table()
    elif kind == "delta":
        from deltalake import DeltaTable
        table = DeltaTable(where).to_pyarrow_table()
    else:
        table = IcebergSink("db.out", warehouse=where).load_table().scan().to_arrow()
    return sorted([r["user"], r["clicks"], r["batch"]] for r in table.to_pylist())


def expected_rows(batches: list[list[dict]]) -> list[list]:
    return sorted(row for rows in reference_outputs(batches).values() for row in rows)
