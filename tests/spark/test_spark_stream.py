"""The stateful stream on real PySpark (local[2]): foreachBatch + applyInArrow per subtask, checkpoints,
sink after completion, restarts at other parallelisms."""

from __future__ import annotations

import json
import os
import sys
from collections import Counter

import pytest
from pyspark import cloudpickle

from helpers.clicks import CountClicks, clicks, job_outputs, reference_outputs, run_job, run_stream, state
from helpers.file_source import write_files
from spate import load_checkpoint, verify_checkpoint
from spate.fs import CheckpointStorage

pytestmark = pytest.mark.spark
cloudpickle.register_pickle_by_value(sys.modules[__name__])  # executors cannot import test modules


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
    # a new parallelism restores every subtask; with lmdb, from the local copies this machine still holds
    assert [st.recovery for st in stream2.metrics[0].subtasks] == ["rescaled" if table == "lmdb" else "restored"] * 3
    if table == "lmdb":  # the executor removed its local copies of the parallelism-2 subtasks
        local = tmp_path / "local" / meta.query_id
        assert sorted(p.name for p in local.iterdir()) == ["subtask-0-3", "subtask-1-3", "subtask-2-3"]
    assert stream.summary()["rows"] == 180 and stream2.summary()["batches"] == 3


# -- faults and rescales, each Spark driver in its own process -------------------------------------------------
@pytest.mark.parametrize(("fault", "restart_parallelism"), [
    ("task-fails-once:2", None), ("driver-dies-mid-batch:2", 5), ("driver-dies-after-checkpoint:2", 1)])
def test_exactly_once_state_through_faults(tmp_path, fault, restart_parallelism):
    """A task fails once, or the driver dies in a batch; the query restarts at another parallelism (more
    subtasks than Spark has cores, or one), as a restart on other resources would."""
    source, root, out = str(tmp_path / "in"), str(tmp_path / "ckpt"), str(tmp_path / "out")
    batches = clicks(5, seed=3)
    write_files(source, batches)
    dies = fault.startswith("driver-dies")
    run_job(source, root, out, 2, fault, expect=17 if dies else 0)
    if dies:
        assert load_checkpoint(CheckpointStorage(root)).parallelism == 2
        run_job(source, root, out, restart_parallelism)  # the query restarts
        assert load_checkpoint(CheckpointStorage(root)).parallelism == restart_parallelism
    assert job_outputs(out, 5) == reference_outputs(batches), "every batch's outputs equal a fault-free run"
    assert state(root) == dict(Counter(r["user"] for rows in batches for r in rows)), "state counted once"
    with open(os.path.join(out, "summary.json")) as f:
        summary = json.load(f)
    if fault.startswith("driver-dies-after-checkpoint"):
        assert summary["redelivered"] == [2] or summary["replayed"] == [2], summary
    if fault.startswith("task-fails-once"):
        assert os.path.exists(os.path.join(out, "failed-once")), "the injected failure happened"


def test_settings_from_spark_conf():
    from spate.spark.settings import SpateSettings

    conf = {"spark.spate.checkpointRoot": "/data/spate", "spark.spate.parallelism": "5",
            "spark.spate.changelog": "false", "spark.spate.fileMerging": "within", "spark.app.name": "x"}
    s = SpateSettings.from_conf(conf, parallelism=None, table="heap")
    assert (s.checkpoint_root, s.parallelism, s.changelog_config, s.file_merging_config.mode, s.table) == (
        "/data/spate", 5, None, "within", "heap")
    with pytest.raises(ValueError, match="unknown setting spark.spate.paralelism"):
        SpateSettings.from_conf({"spark.spate.paralelism": "2", "spark.spate.checkpointRoot": "/x"})
    with pytest.raises(ValueError, match="spark.spate.changelog='yes': expected true or false"):
        SpateSettings.from_conf({"spark.spate.changelog": "yes", "spark.spate.checkpointRoot": "/x"})
    with pytest.raises(ValueError, match="needs checkpoint_root"):
        SpateSettings.from_conf({})


def test_one_job_and_exactly_one_task_per_subtask_whatever_aqe_and_shuffle_partitions_say(spark, tmp_path):
    """Parallelism 5 with AQE on and 2 shuffle partitions: 5 tasks, task i running subtask i (today's
    groupBy + applyInArrow gave AQE's coalesced partitions, or hash collisions without AQE)."""
    from spate.checkpoint.coordinator import list_complete_checkpoints

    source, root = str(tmp_path / "in"), str(tmp_path / "ckpt")
    batches = clicks(3)
    write_files(source, batches)
    saved = {k: spark.conf.get(k) for k in ("spark.sql.adaptive.enabled", "spark.sql.shuffle.partitions")}
    spark.conf.set("spark.sql.adaptive.enabled", "true")
    spark.conf.set("spark.sql.shuffle.partitions", "2")
    try:
        stream, _ = run_stream(spark, source, root, 5, {})
    finally:
        for k, v in saved.items():
            spark.conf.set(k, v)
    storage = CheckpointStorage(root)
    for n in list_complete_checkpoints(storage):
        meta = load_checkpoint(storage, n)
        assert [st.stats["spark_partition"] for st in meta.subtasks] == list(range(5)), f"checkpoint {n}"
    assert state(root) == dict(Counter(r["user"] for b in batches for r in b))
    assert [m.spark_jobs for m in stream.metrics] == [1, 1, 1], "one Spark job per micro-batch (the sink's apart)"


def test_a_stream_starts_from_a_savepoint_of_a_local_runner(spark, tmp_path):
    """One settings object and one driver loop: ``restore_from`` works on Spark as on LocalRunner. A savepoint
    taken by a LocalRunner after 3 batches (at parallelism 2) seeds a stream on a new root (parallelism 3),
    whose batch ids start at 0 again; the state continues the counts."""
    from spate import LocalRunner

    batches = clicks(6)
    with LocalRunner(CountClicks, key="user", checkpoint_root=str(tmp_path / "local"), parallelism=2) as runner:
        runner.run(batches[:3])
        savepoint = runner.savepoint(str(tmp_path / "sp"))
    source, root = str(tmp_path / "in"), str(tmp_path / "ckpt")
    write_files(source, batches[3:])
    stream, _ = run_stream(spark, source, root, 3, {}, restore_from=savepoint)
    assert [m.batch_id for m in stream.metrics] == [0, 1, 2]
    assert state(root) == dict(Counter(r["user"] for b in batches for r in b))


def test_plans_name_the_log_and_executors_list_it(spark, tmp_path, monkeypatch):
    """Every plan sent to the executors names its log instead of listing it (``INLINE_CHANGE_SETS`` 0): subtasks
    whose live state has that log go on, a restart lists it from the base's metadata; state is exact."""
    from spate.checkpoint import protocol

    monkeypatch.setattr(protocol, "INLINE_CHANGE_SETS", 0)
    source, root = str(tmp_path / "in"), str(tmp_path / "ckpt")
    batches = clicks(6)
    write_files(source, batches[:3])
    changelog = {"changelog": True, "local_dir": str(tmp_path / "local")}
    stream, _ = run_stream(spark, source, root, 2, {}, table="lmdb", **changelog)
    write_files(source, batches[3:], start=3)
    stream2, _ = run_stream(spark, source, root, 2, {}, table="heap", **changelog)  # heap: restored from storage
    assert state(root) == dict(Counter(r["user"] for b in batches for r in b))
    assert [st.recovery for st in stream2.metrics[0].subtasks] == ["restored", "restored"]
    assert all(m.subtasks for m in stream.metrics)
