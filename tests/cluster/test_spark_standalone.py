"""The stream on a real Spark standalone cluster on 127.0.0.1: a master and 2 workers (1 core, 1 GB each), each
worker with its own work dir and local dirs, started from the pyspark package and stopped by PID
(:class:`spate_tools.standalone.StandaloneCluster`). Each scenario runs the Spark driver in its own process
(tests/helpers/spark_job.py, bounded in time): lmdb state on the executors' own local disks, changelog on, outputs and
state compared with a single-process run of the same processor (LocalRunner)."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable

import pytest

from helpers.clicks import JOB, clicks, expected_rows, job_outputs, reference_outputs, state, table_rows
from helpers.file_source import write_files
from spate import load_checkpoint, verify_checkpoint
from spate.checkpoint.assignment import overlapping_subtasks
from spate.checkpoint.coordinator import list_complete_checkpoints
from spate.fs import CheckpointStorage
from spate.spark.procfs import is_running
from spate_tools.cli import main as cli
from spate_tools.standalone import QUICK_JVM_OPTIONS, StandaloneCluster

pytestmark = pytest.mark.spark
DRIVER_TIMEOUT_S = 240
SETTINGS = {"table": "lmdb", "changelog": True, "file_merging": "across",
            "local_dir": None}  # lmdb state on each executor's own local disk (its worker's SPARK_LOCAL_DIRS)


@pytest.fixture(scope="module")
def cluster():
    with StandaloneCluster(workers=2, cores=1, memory_mb=1024, jvm_options=QUICK_JVM_OPTIONS) as c:
        yield c
        started = c.alive()
    assert started and not [p for p in started if is_running(p)], "the cluster stopped every process it started"


def drive(cluster: StandaloneCluster, source: str, root: str, out: str, parallelism: int, fault: str = "",
          spark_checkpoint: str | None = None, tick: Callable[[], None] | None = None, extra: tuple = ()) -> dict:
    """Run tests/helpers/spark_job.py as a driver of ``cluster`` (its own process, at most DRIVER_TIMEOUT_S), calling
    ``tick`` every 0.1 s while it runs. Returns the job's summary, plus ``local``: per worker, the subtasks
    whose lmdb state was seen on that worker's local disk during the run (Spark removes an application's
    executor-local dirs when it ends)."""
    os.makedirs(out, exist_ok=True)
    cmd = [sys.executable, JOB, source, root, out, str(parallelism), fault, "--master", cluster.master_url,
           "--settings", json.dumps(SETTINGS), *extra]
    if spark_checkpoint:
        cmd += ["--spark-checkpoint", spark_checkpoint]
    deadline = time.monotonic() + DRIVER_TIMEOUT_S
    local: list[set[str]] = [set() for _ in range(cluster.workers)]
    with open(os.path.join(out, "driver.log"), "a") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            while proc.poll() is None and time.monotonic() < deadline:
                for seen, now in zip(local, local_subtasks(cluster), strict=True):
                    seen |= now
                if tick is not None:
                    tick()
                time.sleep(0.1)
        finally:
            if proc.poll() is None:
                proc.kill()
            code = proc.wait()
    with open(os.path.join(out, "driver.log")) as log:
        assert code == 0, f"driver exited {code} (after {DRIVER_TIMEOUT_S} s: killed):\n" + log.read()[-5000:]
    with open(os.path.join(out, "summary.json")) as f:
        summary = dict(json.load(f))
    ended = time.monotonic() + 15
    while summary["app_id"] in cluster.active_apps() and time.monotonic() < ended:
        time.sleep(0.2)
    assert summary["app_id"] not in cluster.active_apps(), "the driver's application ended: its cores are free"
    return {**summary, "local": local}


def local_subtasks(cluster: StandaloneCluster) -> list[set[str]]:
    """Per worker: the subtask directories of lmdb state on that worker's local disk now."""
    return [{os.path.basename(p) for p in glob.glob(f"{cluster.worker_local_dir(i)}/**/spate-local/*/subtask-*",
                                                     recursive=True)} for i in range(cluster.workers)]


def verify_all(root: str, parallelism: int) -> None:
    """Every retained checkpoint verifies, through the API and `spate checkpoints verify`; task i ran subtask i."""
    storage = CheckpointStorage(root)
    done = list_complete_checkpoints(storage)
    assert done, "no complete checkpoint"
    for n in done:
        meta = load_checkpoint(storage, n)
        assert verify_checkpoint(storage, meta) == [], f"checkpoint {n}"
    assert load_checkpoint(storage).parallelism == parallelism
    assert [st.stats["spark_partition"] for st in load_checkpoint(storage).subtasks] == list(range(parallelism))
    assert cli(["checkpoints", "verify", root]) == 0


def counts(batches: list[list[dict]]) -> dict[str, int]:
    return dict(Counter(r["user"] for rows in batches for r in rows))


BATCHES = clicks(6, users=300, per_batch=200, seed=11)


@pytest.fixture(scope="module")
def first_run(cluster, tmp_path_factory):
    """Batches 0-2 at parallelism 3 (the restart test continues this root)."""
    tmp = tmp_path_factory.mktemp("standalone")
    source, root, out = str(tmp / "in"), str(tmp / "ckpt"), str(tmp / "out")
    write_files(source, BATCHES[:3])
    return source, root, out, drive(cluster, source, root, out, 3)


def test_stream_equals_a_single_process_run(first_run):
    source, root, out, summary = first_run
    assert job_outputs(out, 3) == reference_outputs(BATCHES[:3]), "every batch's outputs equal a LocalRunner run"
    assert state(root) == counts(BATCHES[:3])
    verify_all(root, 3)
    assert summary["batches"] == 3 and summary["rows"] == 600
    subtasks = {"subtask-0-3", "subtask-1-3", "subtask-2-3"}
    assert set().union(*summary["local"]) == subtasks, f"lmdb state on the workers' own disks: {summary['local']}"


def test_restart_at_another_parallelism_continues(cluster, first_run):
    source, root, out, _ = first_run
    write_files(source, BATCHES[3:], start=3)
    summary = drive(cluster, source, root, out, 5)
    assert job_outputs(out, 6) == reference_outputs(BATCHES)
    assert state(root) == counts(BATCHES)
    verify_all(root, 5)
    assert summary["batches"] == 3 and summary["metrics"][0]["restored_subtasks"] == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("sink", ["function", "delta"])
def test_executor_killed_mid_batch(cluster, tmp_path, sink):
    """Batch 2's tasks stall until the test SIGKILLs the executor running one of them; Spark retries the lost
    tasks; outputs and state equal a fault-free run. With a Delta table sink, the table holds every batch once
    and no file of the lost attempts."""
    source, root, out = str(tmp_path / "in"), str(tmp_path / "ckpt"), str(tmp_path / "out")
    batches = BATCHES[:4]
    write_files(source, batches)
    killed: list = []
    go = os.path.join(out, "go")

    def kill_one() -> None:
        stalled = [int(p.rsplit("-", 1)[1]) for p in glob.glob(f"{out}/stalled-*")]
        if not stalled or os.path.exists(go):
            return
        executors = [e for e in map(cluster.executor_of, stalled) if e is not None]
        if executors:
            cluster.kill_executor(executors[0])
            killed.append(executors[0])
        open(go, "w").close()  # the surviving tasks (and the retries of the lost ones) go on

    table = str(tmp_path / "table")
    summary = drive(cluster, source, root, out, 3, fault="stall:2", tick=kill_one,
                    extra=("--table", f"delta:{table}") if sink == "delta" else ())
    assert killed, "no stalled task found on an executor of the cluster"
    assert not is_running(killed[0].pid)
    ran_on = [[st["executor"].split("@")[0] for st in m["subtasks"]] for m in summary["metrics"]]
    lost = [i for i, e in enumerate(ran_on[1]) if e == killed[0].executor_id]
    assert lost, f"the killed executor {killed[0].executor_id} held live state: {ran_on}"
    for i in lost:  # their state came back from checkpoint storage on another executor
        assert summary["metrics"][2]["subtasks"][i]["recovery"] in ("restored", "caught_up"), summary["metrics"][2]
        assert ran_on[2][i] != killed[0].executor_id
    if sink == "delta":
        assert table_rows("delta", table) == expected_rows(batches), "every batch in the table exactly once"
        staging = os.path.join(table, "_spate_staging")
        assert not os.path.isdir(staging) or not os.listdir(staging), "nothing left staged"
    else:
        assert job_outputs(out, 4) == reference_outputs(batches), "every batch's outputs equal a fault-free run"
    assert state(root) == counts(batches), "state counted once"
    verify_all(root, 3)
    assert summary["batches"] == 4


def test_online_rescale_on_the_cluster(cluster, tmp_path):
    """2 → 4 from batch 2 (whose first task attempt fails; Spark retries it) → 3 from batch 4, in one running
    query on 2 workers: each new subtask runs where the old subtask holding most of its key groups ran and
    builds its state from that executor's local copies; outputs and state equal a single-process run."""
    source, root, out = str(tmp_path / "in"), str(tmp_path / "ckpt"), str(tmp_path / "out")
    batches = BATCHES[:6]
    write_files(source, batches)
    summary = drive(cluster, source, root, out, 2, fault="task-fails-once:2", extra=("--rescale", "1:4,3:3"))
    assert job_outputs(out, 6) == reference_outputs(batches)
    assert state(root) == counts(batches)
    verify_all(root, 3)
    assert summary["batches"] == 6, "one query, no restart"
    assert [m["parallelism"] for m in summary["metrics"]] == [2, 2, 4, 4, 3, 3]
    ran_on = [[st["executor"] for st in m["subtasks"]] for m in summary["metrics"]]
    assert len(set(ran_on[1])) == 2, f"the two old subtasks ran on both workers: {ran_on[1]}"
    for batch, seeds in ((2, overlapping_subtasks(128, 2, 4)), (4, overlapping_subtasks(128, 4, 3))):
        subtasks = summary["metrics"][batch]["subtasks"]
        placed = [j for j, rows in enumerate(seeds) if ran_on[batch][j] == ran_on[batch - 1][rows[0]]]
        assert placed, f"batch {batch}: no subtask ran where its state was: {ran_on[batch - 1]} → {ran_on[batch]}"
        for j in placed:
            assert subtasks[j]["recovery"] == "rescaled", (batch, j, subtasks[j])
        assert {st["recovery"] for st in subtasks} <= {"rescaled", "restored"}, subtasks


def test_checkpoint_root_on_s3(cluster, s3_uri, tmp_path, monkeypatch):
    source, out = str(tmp_path / "in"), str(tmp_path / "out")
    root = s3_uri("standalone")
    batches = BATCHES[:4]
    write_files(source, batches)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # the driver's copy of Spark's checkpoint: ~/.spate/...
    drive(cluster, source, root, out, 3)  # no spark_checkpoint: spate keeps it in <root>/_spark
    assert CheckpointStorage(root).exists("_spark/offsets/3")
    assert job_outputs(out, 4) == reference_outputs(batches)
    assert state(root) == counts(batches)
    verify_all(root, 3)
