"""Online rescale of a running Spark query (``StatefulStream.rescale``), in local mode: the driver in its own
process (tests/helpers/spark_job.py) rescales between batches from its sink, with a task failure or the driver's death
in the rescaling batch; and the autoscaler rescaling a stream in this process. Outputs and state always equal a
single-process run (LocalRunner)."""

from __future__ import annotations

import json
import os
import sys
from collections import Counter

import pytest
from pyspark import cloudpickle

from helpers.clicks import CountClicks, clicks, job_outputs, reference_outputs, run_job, state
from helpers.file_source import write_files
from spate import AutoscalePolicy, IncompatibleStateError, load_checkpoint
from spate.checkpoint.coordinator import list_complete_checkpoints
from spate.fs import CheckpointStorage
from spate.spark.stream import StatefulStream

pytestmark = pytest.mark.spark
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _summary(out: str) -> dict:
    with open(os.path.join(out, "summary.json")) as f:
        return dict(json.load(f))


def _rescales(root: str) -> dict[int, tuple[int, int, str]]:
    """Per checkpoint that rescaled: (from, to, reason), as its metadata records."""
    storage = CheckpointStorage(root)
    metas = [load_checkpoint(storage, n) for n in list_complete_checkpoints(storage)]
    return {m.checkpoint_id: (m.rescaled_from, m.parallelism, m.rescale_reason) for m in metas
            if m.rescaled_from is not None}


def test_rescale_up_and_down_online_with_a_task_failure_in_the_rescaling_batch(tmp_path):
    """2 → 4 from batch 2 (whose first task attempt fails; Spark retries it) → 1 from batch 4, in one query."""
    source, root, out = str(tmp_path / "in"), str(tmp_path / "ckpt"), str(tmp_path / "out")
    batches = clicks(6, seed=5)
    write_files(source, batches)
    run_job(source, root, out, 2, "task-fails-once:2", extra=["--rescale", "1:4,3:1"])
    assert job_outputs(out, 6) == reference_outputs(batches)
    assert state(root) == dict(Counter(r["user"] for rows in batches for r in rows))
    summary = _summary(out)
    assert summary["batches"] == 6, "one query: no restart"
    assert [(r["batch_id"], r["from"], r["to"]) for r in summary["rescales"]] == [(2, 2, 4), (4, 4, 1)]
    parallelism = [m["parallelism"] for m in summary["metrics"]]
    assert parallelism == [2, 2, 4, 4, 1, 1]
    for m in summary["metrics"]:
        if m["batch_id"] in (2, 4):
            assert {s["recovery"] for s in m["subtasks"]} == {"rescaled"}, m["subtasks"]
    assert os.path.exists(os.path.join(out, "failed-once")), "the rescaling batch's task did fail once"


def test_the_driver_dies_in_the_rescaling_batch_and_the_query_restarts(tmp_path):
    source, root, out = str(tmp_path / "in"), str(tmp_path / "ckpt"), str(tmp_path / "out")
    batches = clicks(5, seed=9)
    write_files(source, batches)
    run_job(source, root, out, 2, "driver-dies-mid-batch:2", expect=17, extra=["--rescale", "1:3"])
    run_job(source, root, out, 3, extra=["--rescale", "3:2"])  # the restarted query runs at what was asked
    assert job_outputs(out, 5) == reference_outputs(batches)
    assert state(root) == dict(Counter(r["user"] for rows in batches for r in rows))
    assert [m["parallelism"] for m in _summary(out)["metrics"]] == [3, 3, 2]


def test_the_autoscaler_rescales_a_running_stream(spark, tmp_path):
    """A target no batch can meet: each decision doubles the parallelism, up to the policy's maximum, a
    cool-down batch apart; the decisions are in the summary and in the checkpoints that rescaled."""
    source, root = str(tmp_path / "in"), str(tmp_path / "ckpt")
    batches = clicks(7, seed=2)
    write_files(source, batches)
    df = spark.readStream.schema("user string, page string, n long").option("maxFilesPerTrigger", 1).json(source)
    policy = AutoscalePolicy(min_parallelism=1, max_parallelism=4, target_batch_ms=0.001, cooldown_batches=1)
    stream = StatefulStream(df, "user", CountClicks, "user string, clicks long, batch long", checkpoint_root=root,
                            parallelism=1, table="lmdb", local_dir=str(tmp_path / "local"), changelog=True,
                            autoscale=policy)
    with pytest.raises(IncompatibleStateError, match="exceeds the max parallelism"):
        stream.rescale(40_000)
    got: dict[int, list] = {}

    def sink(outputs, batch_id):
        got[batch_id] = sorted([r.user, r.clicks, r.batch] for r in outputs.collect())

    query = stream.start(sink, trigger={"availableNow": True})
    query.awaitTermination()
    stream.close()
    assert got == reference_outputs(batches)
    summary = stream.summary()
    assert [m.parallelism for m in stream.metrics] == [1, 2, 2, 4, 4, 4, 4]
    assert [(d["from_parallelism"], d["to_parallelism"]) for d in summary["decisions"]] == [(1, 2), (2, 4)]
    assert summary["parallelism"] == 4 and summary["rescaled"] == 2 + 4
    reasons = [reason for _, _, reason in _rescales(root).values()]
    assert all("target" in r for r in reasons), reasons
    with pytest.raises(IncompatibleStateError, match="exceeds the max parallelism"):
        stream.rescale(stream.coordinator.max_parallelism + 1)
