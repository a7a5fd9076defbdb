"""``spate bench cluster --large`` without a cluster: its sizes, input, processor and verification run in-process
on a tiny state (a restart with an empty local directory stands in for the lost executor), the copy floor copies
exactly the segments, the result is shaped from the run's metadata, and the CLI refuses what it cannot run."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pyarrow.parquet as pq
import pytest

from spate import LocalRunner
from spate.checkpoint.ackinfo import AckInfo
from spate.checkpoint.inspect import load_checkpoint
from spate.fs import CheckpointStorage
from spate.spark.stream_metrics import BatchMetrics
from spate_tools.bench.cluster_large import DISK_FACTOR, restore_segments
from spate_tools.bench.cluster_large_job import Overwrite, Sizes, compare, generate, value_of, version_of
from spate_tools.bench.cluster_large_result import Observed, shape_result
from spate_tools.bench.disk_floor import copy_floor
from spate_tools.cli import main

CONTRACT = ("state_gb", "keys", "load_s", "restored_subtasks", "restore_bytes", "recovery_batch_ms",
            "restore_ms_max", "copy_s", "recovery_vs_copy", "state_checked")


def test_sizes():
    s = Sizes.of(4)
    assert (s.keys, s.load_batches, s.updates, s.verify_keys) == (8_000_000, 8, 80_000, 1_000_000)
    assert (s.kill_at, s.recovery_batch, s.verify_batch, s.batches) == (10, 11, 12, 13)
    assert [s.phase(b) for b in (0, 8, 10, 11, 12)] == ["load", "steady", "steady, then the kill", "recovery",
                                                         "verification"]
    small = Sizes.of(0.3)
    assert (small.keys, small.load_batches, small.verify_keys) == (600_000, 2, 600_000)
    with pytest.raises(ValueError, match="too small"):
        Sizes.of(1e-7)
    assert version_of(value_of(12)) == 12 and len(value_of(12)) == 500


def _run_in_process(tmp_path, sizes, expected):
    """The benchmark's batches through a LocalRunner at parallelism 2; before the recovery batch a new runner
    with an empty local directory, which restores both subtasks from the checkpoint root."""
    root = str(tmp_path / "root")
    files = sorted(os.listdir(tmp_path / "in"))
    assert len(files) == sizes.batches
    batches = [[{"k": int(k)} for k in pq.read_table(tmp_path / "in" / f)["k"].to_pylist()] for f in files]

    def runner(local):
        return LocalRunner(Overwrite(sizes.verify_batch), key="k", checkpoint_root=root, parallelism=2,
                           max_parallelism=128, table="lmdb", local_dir=str(tmp_path / local), changelog=True,
                           file_merging="across")

    results = []
    with runner("local-a") as r:
        for b in range(sizes.recovery_batch):
            results.append(r.run_batch(b, batches[b]))
    with runner("local-b") as r:
        for b in range(sizes.recovery_batch, sizes.batches):
            results.append(r.run_batch(b, batches[b]))
    return root, results


def _metrics(results, executors):
    return [BatchMetrics(x.batch_id, sum(st.rows for st in x.checkpoint.subtasks), x.batch_ms, x.checkpoint_ms,
                         subtasks=[AckInfo(**(st.ack_info() | {"executor": e}))
                                   for st, e in zip(x.checkpoint.subtasks, executors, strict=True)])
            for x in results]


def test_in_process_run_is_verified_and_shaped(tmp_path):
    sizes = Sizes.of(0.0005)  # 1,000 keys
    expected = generate(str(tmp_path / "in"), sizes)
    root, results = _run_in_process(tmp_path, sizes, expected)
    out = results[-1].outputs
    check = compare(np.array([r["k"] for r in out]), np.array([r["prev"] for r in out]), expected)
    assert check == {"verified_keys": 1_000, "expected_keys": 1_000, "same_keys": True, "missing": 0, "wrong": 0}
    assert compare(np.array([r["k"] for r in out]), np.zeros(len(out), dtype=np.int64), expected)["wrong"] > 0

    storage = CheckpointStorage(root)
    base, recovered = load_checkpoint(storage, sizes.kill_at), load_checkpoint(storage, sizes.recovery_batch)
    assert [st.recovery for st in recovered.subtasks] == ["restored", "restored"]
    segments = restore_segments(storage, base, [0, 1])
    assert sum(length for _, _, length in segments) == sum(st.restore_bytes for st in recovered.subtasks) > 0
    copy_s = copy_floor(segments, str(tmp_path / "copy"))
    assert not os.path.exists(tmp_path / "copy")

    # both subtasks ran on executor "1" before the kill; the trigger times are Spark's, here made up
    o = Observed({b: 100.0 + b for b in range(sizes.batches)}, _metrics(results, ["1@h", "1@h"]), base, recovered,
                 load_checkpoint(storage, sizes.verify_batch), "1", copy_s, sum(x[2] for x in segments), check,
                 replacement_s=3.0, disk_peak_bytes=10**6)
    r = shape_result(sizes, o)
    assert all(k in r for k in CONTRACT), r
    assert r["state_checked"] and r["state_problems"] == [], r["state_problems"]
    assert r["restored_subtasks"] == [0, 1] == r["killed_subtasks"]
    assert r["load_s"] == round((100 + 101) / 1000, 1) and r["recovery_batch_ms"] == 100.0 + sizes.recovery_batch
    assert r["restore_bytes"] == r["copy_bytes"]
    assert r["recovery_vs_copy"] == pytest.approx(r["restore_ms_max"] / 1000 / copy_s, rel=0.02)

    # what makes it fail: another executor killed, a wrong value read back
    r = shape_result(sizes, Observed(o.trigger_ms, _metrics(results, ["1@h", "2@h"]), base, recovered, o.last, "1",
                                     copy_s, o.copy_bytes, check | {"wrong": 3}))
    assert not r["state_checked"] and len(r["state_problems"]) == 2, r["state_problems"]


def test_copy_floor_copies_exactly_the_segments(tmp_path):
    data = os.urandom(50_000)
    (tmp_path / "f").write_bytes(data)
    copied = []

    def look():
        copied.extend((tmp_path / "copy" / n).read_bytes() for n in sorted(os.listdir(tmp_path / "copy")))

    copy_floor([(str(tmp_path / "f"), 100, 1_000), (str(tmp_path / "f"), 20_000, 30_000)], str(tmp_path / "copy"),
               look)
    assert copied == [data[100:1_100] + data[20_000:50_000]]
    assert not os.path.exists(tmp_path / "copy")


def test_cli_refuses(tmp_path, capsys):
    out = str(tmp_path / "out")
    assert main(["bench", "cluster", "--large", "--quick", "--out", out]) == 2
    assert main(["bench", "cluster", "--state-gb", "0.3", "--out", out]) == 2
    assert main(["bench", "state", "--large", "--out", out]) == 2
    assert "--large" in capsys.readouterr().err
    free_gb = shutil.disk_usage(tmp_path).free / 1e9
    assert main(["bench", "cluster", "--large", "--state-gb", str(round(free_gb / DISK_FACTOR * 2)),
                 "--out", out]) == 2  # refused before anything starts
    assert "GB free" in capsys.readouterr().err
