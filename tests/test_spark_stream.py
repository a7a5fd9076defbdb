"""The stateful stream on real PySpark (local[2]): foreachBatch + applyInArrow per subtask, checkpoints,
sink after completion, restarts at other parallelisms."""

from __future__ import annotations

import json
import os
import sys
from collections import Counter

import pytest
from pyspark import cloudpickle

from spate import Processor, ValueStateDescriptor, keyed_state_entries, load_checkpoint, verify_checkpoint
from spate.fs import CheckpointStorage
from spate.spark.stream import StatefulStream

pytestmark = pytest.mark.spark
cloudpickle.register_pickle_by_value(sys.modules[__name__])  # executors cannot import test modules
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


def write_files(directory, batches, start=0):
    os.makedirs(directory, exist_ok=True)
    for i, rows in enumerate(batches, start):
        path = os.path.join(directory, f"part-{i:05d}.json")
        with open(path, "w") as f:
            f.write("\n".join(json.dumps(r) for r in rows))
        os.utime(path, (1_700_000_000 + i, 1_700_000_000 + i))  # the file source reads oldest first


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


@pytest.mark.parametrize("table,merging", [("lmdb", "across"), ("heap", "off")])
def test_counts_checkpoints_sink_and_rescale(spark, tmp_path, table, merging):
    source, root = str(tmp_path / "in"), str(tmp_path / "ckpt")
    batches = clicks(6)
    write_files(source, batches[:3])
    sink_log: dict = {}
    stream, query = run_stream(spark, source, root, 2, sink_log, table=table, file_merging=merging,
                               local_dir=str(tmp_path / "local"))
    assert query.lastProgress is not None and query.exception() is None
    assert sorted(sink_log) == [0, 1, 2]
    write_files(source, batches[3:], start=3)
    stream2, _ = run_stream(spark, source, root, 3, sink_log, table=table, file_merging=merging,
                            local_dir=str(tmp_path / "local"))
    assert sorted(sink_log) == list(range(6)), "every batch reached the sink once"
    want = Counter(r["user"] for rows in batches for r in rows)
    assert state(root) == dict(want)
    running: Counter = Counter()
    for b, rows in enumerate(batches):  # the sink saw each batch's running counts
        running.update(r["user"] for r in rows)
        got = {u: c for u, c, batch in sink_log[b][0]}
        assert got == {u: running[u] for u in {r["user"] for r in rows}} and {bb for _, _, bb in sink_log[b][0]} == {b}
    storage = CheckpointStorage(root)
    meta = load_checkpoint(storage)
    assert meta.parallelism == 3 and verify_checkpoint(storage, meta) == []
    assert stream2.metrics[0].restored_subtasks == [0, 1, 2], "a new parallelism restores every subtask"
    assert stream.summary()["rows"] == 180 and stream2.summary()["batches"] == 3
