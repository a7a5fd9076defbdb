"""Worker-side services are owned, and a worker holds only the subtasks it serves (issue 10, items 6 and 8):
closing a runner or a Spark worker's registry stops every thread it started; a Python worker closes subtasks it
has not run for the grace period; an executor deletes local copies nobody holds and nobody used for it."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import pytest

from spate import ChangelogConfig, Coordinator, LocalRunner, Processor, ValueStateDescriptor
from spate.filemerging.config import FileMergingConfig
from spate.keygroups import compile_key_hasher
from spate.runtime.localstate import local_state_dir, remove_idle_copies, remove_other_parallelisms
from spate.runtime.services import WorkerServices
from spate.runtime.subtask import Subtask, SubtaskConfig
from spate.spark.settings import SpateSettings
from spate.spark.task import TaskSpec, WorkerSubtasks
from spate.state.lmdb_table import LmdbTable, remove_if_unused


class Count(Processor):
    def open(self, ctx):
        self.c = ctx.state(ValueStateDescriptor("c", default=0))

    def process(self, key, rows, ctx):
        self.c.update(self.c.value() + len(rows))
        return None


def _spate_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("spate-")}


# -- A: owned services ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("merging", [False, "across"])
def test_closed_runners_leave_no_spate_threads(tmp_path, merging):
    before = _spate_threads()
    clock = [0]

    def tick() -> int:
        clock[0] += 60_000
        return clock[0]

    config = ChangelogConfig(materialization_interval_ms=1_000)  # due every batch of this clock
    started: set[str] = set()
    for n in range(5):
        with LocalRunner(Count, key="k", checkpoint_root=str(tmp_path / f"root-{n}"), parallelism=2,
                         changelog=config, file_merging=merging, clock=tick) as runner:
            runner.run([[{"k": i} for i in range(20)]] * 3)
            started |= {t.name.rsplit("_", 1)[0] for t in _spate_threads() - before}
    assert {"spate-upload", "spate-materialize"} <= started, "the runners used upload and materializer threads"
    assert _spate_threads() - before == set(), "every thread a closed runner started has ended"


def test_a_subtask_takes_only_services_made_for_its_settings_and_root(tmp_path):
    with pytest.raises(ValueError, match="made with the changelog off, the subtask has it on"):
        Subtask(0, 1, Count, SubtaskConfig(changelog=ChangelogConfig()), WorkerServices(str(tmp_path)))
    with pytest.raises(ValueError, match="made with file merging on, the subtask has it off"):
        Subtask(0, 1, Count, SubtaskConfig(), WorkerServices(str(tmp_path), file_merging=FileMergingConfig()))
    coord = Coordinator(str(tmp_path / "a"))
    coord.start(1)
    services = WorkerServices(str(tmp_path / "b"))
    with pytest.raises(ValueError, match="plan for checkpoint root .* given to a subtask serving"):
        Subtask(0, 1, Count, SubtaskConfig(), services).run(coord.begin(0, 1, 0)[0], [])
    coord.close()


# -- the Spark worker's registry, driven without Spark ---------------------------------------------------------
class _Query:
    """A query of parallelism 2 (a test may change it: an online rescale) on ``root`` whose subtasks run in the
    worker registries a test names."""

    def __init__(self, root: str) -> None:
        self.parallelism = 2
        self.coord = Coordinator(root)
        self.coord.start(self.parallelism)
        self.hash = compile_key_hasher(None)
        self.next = 0

    def spec(self, local_dir: str | None, table: str = "lmdb", **settings) -> TaskSpec:
        s = SpateSettings(checkpoint_root=self.coord.storage.uri, parallelism=2, table=table, local_dir=local_dir,
                          file_merging="off", **settings)
        return TaskSpec("run-1", Count, s, ("k",), None, self.coord.max_parallelism)

    def batch(self, where: dict[int, tuple[WorkerSubtasks, TaskSpec]]) -> dict[int, Subtask]:
        """One batch; subtask i runs in the registry ``where[i]`` (a Python worker) with its spec. Returns the
        objects that ran them."""
        n, self.next = self.next, self.next + 1
        ran = {}
        for plan in self.coord.begin(n, self.parallelism, n):
            worker, spec = where[plan.index]
            subtask = ran[plan.index] = worker.get(spec, plan)
            rows = [(kg, k, {"k": k}) for k in range(10) if (kg := self.hash(k) % plan.max_parallelism)
                    in plan.key_groups]
            try:
                self.coord.acknowledge(subtask.run(plan, rows).ack)
            finally:
                subtask.release_local_state()
        self.coord.complete(n)
        return ran


class _Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


def _workers(n: int, clock: Callable[[], float]) -> list[WorkerSubtasks]:
    return [WorkerSubtasks(clock=clock) for _ in range(n)]


def test_a_worker_closes_a_subtask_it_has_not_run_for_the_grace_period(tmp_path):
    clock = _Clock()
    query = _Query(str(tmp_path / "root"))
    spec = query.spec(None, table="heap", evict_idle_after_batches=3, evict_idle_after_s=60)
    a, b = _workers(2, clock)
    root = query.coord.storage.uri
    moved = query.batch({0: (a, spec), 1: (a, spec)})[1]  # the object worker a keeps for subtask 1
    elsewhere = {0: (a, spec), 1: (b, spec)}  # from now on subtask 1 runs in another worker
    for _ in range(3):  # 3 batches of worker a without subtask 1, but only 30 s
        clock.now += 10
        query.batch(elsewhere)
    assert a.served(root) == {(0, 2), (1, 2)} and moved.keyed is not None
    clock.now += 30
    query.batch(elsewhere)
    assert a.served(root) == {(0, 2)} and moved.keyed is None, "closed: 3 batches and 60 s without it"
    assert b.served(root) == {(1, 2)}
    query.batch({0: (a, spec), 1: (a, spec)})  # subtask 1 is back in worker a, then goes again
    clock.now += 1000
    query.batch(elsewhere)
    assert (1, 2) in a.served(root), "1000 s, but only 1 batch of worker a without it"
    query.batch(elsewhere)
    query.batch(elsewhere)
    assert (1, 2) not in a.served(root)
    for worker in (a, b):
        worker.close()


_HOLDER = """
import sys
from spate.state.lmdb_table import LmdbTable
table = LmdbTable(sys.argv[1])
table.unlock()  # as a Python worker between two batches: the table stays open
print("open", flush=True)
sys.stdin.read()
table.close()
"""


def test_an_executor_removes_idle_copies_no_worker_holds(tmp_path):
    before = _spate_threads()
    clock = _Clock()
    query = _Query(str(tmp_path / "root"))
    grace = {"evict_idle_after_batches": 2, "evict_idle_after_s": 150, "changelog": True}
    here, there = query.spec(str(tmp_path / "e1"), **grace), query.spec(str(tmp_path / "e2"), **grace)
    a, c = _workers(2, clock)  # a: a Python worker of executor e1; c: of executor e2
    qid = query.coord.query.query_id
    copy_0, copy_1 = (local_state_dir(str(tmp_path / "e1"), qid, i, 2) for i in range(2))
    query.batch({0: (a, here), 1: (a, here)})
    # another Python worker of e1 (another process) opens subtask 1's copy, and keeps it open
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, copy_1], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "open"
        moved = {0: (a, here), 1: (c, there)}  # subtask 1 now runs on executor e2
        for _ in range(4):
            clock.now += 100
            query.batch(moved)
        assert (1, 2) not in a.served(query.coord.storage.uri), "worker a closed it"
        assert os.path.isdir(copy_1), "another worker still holds it open: never removed under it"
    finally:
        holder.communicate("", timeout=30)
    clock.now += 100
    query.batch(moved)
    assert not os.path.exists(copy_1), "nobody holds it and nobody used it for the grace period: removed"
    assert os.path.isdir(copy_0), "in use by worker a"
    assert os.path.isdir(local_state_dir(str(tmp_path / "e2"), qid, 1, 2))
    for worker in (a, c):
        worker.close()
    query.coord.close()
    assert _spate_threads() - before == set(), "closing the registries closed their services"


def test_a_new_parallelism_closes_the_old_subtasks_and_removes_their_copies(tmp_path):
    query = _Query(str(tmp_path / "root"))
    spec = query.spec(str(tmp_path / "local"))
    (a,) = _workers(1, _Clock())
    query.batch({0: (a, spec), 1: (a, spec)})
    query.parallelism = 3  # online rescaling: the same run goes on at parallelism 3
    query.batch({i: (a, spec) for i in range(3)})
    assert a.served(query.coord.storage.uri) == {(0, 3), (1, 3), (2, 3)}
    base = os.path.join(str(tmp_path / "local"), query.coord.query.query_id)
    assert sorted(os.listdir(base)) == ["subtask-0-2", "subtask-0-3", "subtask-1-2", "subtask-1-3", "subtask-2-3"], \
        "the old copies stay until a checkpoint at the new parallelism completed: a retry builds from them"
    query.batch({i: (a, spec) for i in range(3)})
    assert sorted(os.listdir(base)) == ["subtask-0-3", "subtask-1-3", "subtask-2-3"]
    a.close()


# -- the hold that keeps removal away ----------------------------------------------------------------------------
def test_a_table_open_in_a_process_is_never_removed_even_between_batches(tmp_path):
    path = str(tmp_path / "subtask-0-1")
    table = LmdbTable(path)
    table.unlock()  # between two batches: another process may take it over, but it is still open here
    assert not remove_if_unused(path) and os.path.isdir(path)
    table.close()
    assert not remove_if_unused(path, idle_since=time.time() - 60), "used less than a minute ago"
    assert remove_if_unused(path, idle_since=time.time() + 1) and not os.path.exists(path)


def test_a_table_removed_by_another_process_during_the_idle_scan_is_gone_not_an_error(tmp_path, monkeypatch):
    """Two executors' Python workers scan the same local copies for idle ones while a task makes one of them anew
    (its table deleted first, without the hold): the scan that finds the directory gone counts it as removed
    (a FileNotFoundError failed a batch of a Spark test before). Fault injection: the other processes' moves run
    inside this one's scan, at the two points where they can happen."""
    from spate.state import lmdb_dir

    path = str(tmp_path / "subtask-1-2")
    LmdbTable(path).close()
    last_used = lmdb_dir.last_used

    def removed_first(p: str) -> float:
        shutil.rmtree(p)  # the task making the table anew deletes it now
        return last_used(p)

    monkeypatch.setattr(lmdb_dir, "last_used", removed_first)
    assert remove_if_unused(path, idle_since=time.time() + 1) and not os.path.exists(path)

    LmdbTable(path).close()
    flock = lmdb_dir.fcntl.flock

    once = [True]

    class RemovedAndMadeAnew:  # another scan removed it, then a task made its table anew, before this scan's lock
        def __getattr__(self, name: str) -> object:
            return getattr(fcntl, name)

        @staticmethod
        def flock(fd: int, op: int) -> None:
            if once[0] and op == fcntl.LOCK_EX | fcntl.LOCK_NB:
                once[0] = False
                shutil.rmtree(path)
                LmdbTable(path).close()
            flock(fd, op)

    monkeypatch.setattr(lmdb_dir, "fcntl", RemovedAndMadeAnew())
    monkeypatch.setattr(lmdb_dir, "last_used", last_used)
    assert not remove_if_unused(path, idle_since=time.time() + 1) and os.path.isdir(path), "the new table stays"


def test_the_grace_period_is_a_setting():
    conf = {"spark.spate.checkpointRoot": "/r", "spark.spate.evictIdleAfterBatches": "4",
            "spark.spate.evictIdleAfterSeconds": "1.5"}
    s = SpateSettings.from_conf(conf)
    assert (s.evict_idle_after_batches, s.evict_idle_after_s) == (4, 1.5)
    assert (SpateSettings("/r").evict_idle_after_batches, SpateSettings("/r").evict_idle_after_s) == (10, 300.0)
    with pytest.raises(ValueError, match="evict_idle_after_batches must be >= 1"):
        SpateSettings("/r", evict_idle_after_batches=0)


def test_local_copy_cleanup_follows_no_link_out_of_the_local_dir(tmp_path):
    """A link named like a copy (or in place of the query's directory) is never followed: what it points to
    stays, whatever the grace period says."""
    outside = tmp_path / "outside"
    (outside / "subtask-0-2").mkdir(parents=True)
    (outside / "subtask-0-2" / "data.mdb").write_bytes(b"not spate's")
    local = tmp_path / "local"
    (local / "q").mkdir(parents=True)
    os.symlink(outside / "subtask-0-2", local / "q" / "subtask-1-2")
    os.symlink(outside, local / "q2")
    assert remove_other_parallelisms(str(local), "q", 3) == []
    assert remove_idle_copies(str(local), "q", idle_since=float("inf")) == []
    assert remove_idle_copies(str(local), "q2", idle_since=float("inf")) == []
    assert (outside / "subtask-0-2" / "data.mdb").read_bytes() == b"not spate's"
