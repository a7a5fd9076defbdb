"""Catch-up (issue 10, item 2): a subtask whose local lmdb copy is at completed checkpoint k replays only the
change sets (k, n] of its plan's base n; a copy that is not the state of an ancestor of the base (an aborted
attempt, a rejected duplicate, a fenced driver's batch, another key-group range) is restored instead.

Subtasks hop between "workers" (separate Subtask objects with their own services, as Spark's Python workers)
on two "executors" (local dirs). In one process an lmdb directory can be open in one object at a time, so a
worker taking a subtask over first makes the other workers of its executor close theirs (a Python worker that
exits does the same)."""

from __future__ import annotations

import dataclasses
import os
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from spate import Processor, ValueStateDescriptor
from spate.changelog import restore as changelog_restore
from spate.changelog.restore import restore_keyed_state
from spate.changelog.state import ChangelogConfig
from spate.changelog.upload import UploadConfig
from spate.checkpoint.coordinator import Coordinator, list_complete_checkpoints
from spate.checkpoint.inspect import load_checkpoint, verify_checkpoint
from spate.checkpoint.protocol import SubtaskAck, SubtaskPlan
from spate.errors import FencedError
from spate.fs import CheckpointStorage
from spate.keygroups import compile_key_hasher, key_group_range
from spate.runtime.localstate import local_state_dir
from spate.runtime.recovery.trust import LINEAGE_META
from spate.runtime.services import WorkerServices
from spate.runtime.subtask import BatchOutput, Subtask, SubtaskConfig, processor_factory
from spate.state.heap import HeapTable
from spate.state.keyed import KeyedStateBackend
from spate.state.lmdb_table import LmdbTable
from spate.state.overlay import SharedReaders
from spate_tools.campaigns.fuzz import checkpointed
from spate_tools.campaigns.model_job import OPS, Model, ModelJob

MAXP = 16
KEYS = ["a", "b", "c", "d", "e", "f", "1", "2", "3x"]  # a key column holds one type
# no timer-driven materialization; by log length only (every 3 change sets: catch-up distances of 1-2
# batches find their change sets listed, longer ones a materialization in between)
CHANGELOG = ChangelogConfig(materialization_interval_ms=10**9, materialize_after_change_sets=3,
                            upload=UploadConfig(persist_delay_s=0.0))
NO_MATERIALIZATION = dataclasses.replace(CHANGELOG, materialize_after_change_sets=10**6)
HOPPING_CHANGELOG = dataclasses.replace(CHANGELOG, materialize_after_change_sets=5)  # catch-ups of a few batches
WORKERS = ("e1/a", "e1/b", "e2/a")  # <executor>/<worker>


def now_of(batch_id: int) -> int:
    return 1000 * (batch_id + 1)


class Worker:
    """A Python worker of an executor: its own services, and the subtasks it keeps between batches."""

    def __init__(self, root: str, local_dir: str, changelog: ChangelogConfig | None, processor: Any,
                 readers: SharedReaders) -> None:
        self.root, self.local_dir, self.changelog, self.processor = root, local_dir, changelog, processor
        self.readers = readers  # this test's workers share one process, where lmdb opens a file once
        self.services = WorkerServices(root, None, changelog, readers)
        self.subtasks: dict[tuple[int, int], Subtask] = {}

    def subtask(self, index: int, parallelism: int) -> Subtask:
        key = (index, parallelism)
        if key not in self.subtasks:
            config = SubtaskConfig(table="lmdb", local_dir=self.local_dir, sticky=False, changelog=self.changelog)
            self.subtasks[key] = Subtask(index, parallelism, processor_factory(self.processor), config,
                                         self.services)
        return self.subtasks[key]

    def drop(self, key: tuple[int, int]) -> None:
        sub = self.subtasks.pop(key, None)
        if sub is not None:
            sub.close()

    def evict(self) -> None:
        for key in list(self.subtasks):
            self.drop(key)

    def crash(self) -> None:
        """The process dies: what it held goes; a new process (new services) takes its place."""
        self.evict()
        self.services.close()
        self.services = WorkerServices(self.root, None, self.changelog, self.readers)


class Cluster:
    """A driver and the workers of two executors, running ``processor`` on one checkpoint root."""

    def __init__(self, tmp: Path, changelog: ChangelogConfig | None = CHANGELOG, processor: Any = ModelJob) -> None:
        self.root = str(tmp / "root")
        readers = SharedReaders()
        self.workers = {name: Worker(self.root, str(tmp / name.split("/")[0]), changelog, processor, readers)
                        for name in WORKERS}
        self.hash = compile_key_hasher(None)
        self.coord: Coordinator | None = None
        self.parallelism = 1  # the driver's: each plan is at it
        self.recoveries: Counter[str] = Counter()  # of every attempt
        self.completed: Counter[str] = Counter()  # of the attempts whose checkpoint completed

    def start(self, parallelism: int) -> Coordinator:
        """A driver (re)starts: it takes the root over; workers drop the subtasks of the previous run."""
        if self.coord is not None:
            self.coord.close()
        self.coord = Coordinator(self.root, max_parallelism=MAXP)
        self.coord.start(parallelism)
        self.parallelism = parallelism
        for w in self.workers.values():
            w.evict()
        return self.coord

    def plans(self, batch_id: int, now: int) -> list[SubtaskPlan]:
        assert self.coord is not None
        return self.coord.begin(batch_id, self.parallelism, now)

    def rows_of(self, plan: SubtaskPlan, rows: list[dict]) -> list[tuple[int, Any, dict]]:
        out = []
        for row in rows:
            kg = self.hash(row["k"]) % MAXP
            if kg in plan.key_groups:
                out.append((kg, row["k"], row))
        return out

    def take(self, worker: str, plan: SubtaskPlan) -> Subtask:
        key = (plan.index, plan.parallelism)
        executor = worker.split("/")[0]
        for name, w in self.workers.items():
            if name != worker and name.startswith(executor + "/"):
                w.drop(key)
        return self.workers[worker].subtask(*key)

    def attempt(self, worker: str, plan: SubtaskPlan, rows: list[dict]) -> BatchOutput:
        """Run ``plan`` in ``worker`` up to its ack."""
        sub = self.take(worker, plan)
        try:
            out = sub.run(plan, self.rows_of(plan, rows))
        finally:
            sub.release_local_state()
        self.recoveries[out.ack.recovery] += 1
        return out

    def batch(self, batch_id: int, rows: list[dict], where: list[str]) -> tuple[list[SubtaskAck], list[dict]]:
        """A batch without faults: subtask i runs in worker ``where[i]``; returns the acks and outputs."""
        assert self.coord is not None
        outs = [self.attempt(where[p.index], p, rows) for p in self.plans(batch_id, now_of(batch_id))]
        for out in outs:
            assert self.coord.acknowledge(out.ack)
            self.completed[out.ack.recovery] += 1
        self.coord.complete(batch_id)
        return [o.ack for o in outs], [r for o in outs for r in o.rows]

    def close(self) -> None:
        for w in self.workers.values():
            w.evict()
            w.services.close()
        if self.coord is not None:
            self.coord.close()


def _rows(batch_id: int, n: int = 8, seed: int = 0) -> list[dict]:
    rng = random.Random(seed * 1000 + batch_id)
    return [{"k": rng.choice(KEYS), "op": rng.choice(OPS), "x": rng.randint(-20, 20), "i": batch_id * 100 + j}
            for j in range(n)]


def _norm(rows: list[dict]) -> list[str]:
    return sorted(repr(sorted(r.items())) for r in rows)


def _table_content(table: Any, key_groups: range) -> dict[int, dict[bytes, bytes]]:
    """Every entry of a table's key groups: kg -> {key: stored value}."""
    return {kg: dict(zip(flat[0::2], flat[1::2], strict=True)) for kg in key_groups
            if (flat := table.key_group_flat(kg))}


def _restored_content(storage: CheckpointStorage, checkpoint_id: int, index: int) -> dict[int, dict[bytes, bytes]]:
    """What a full restore of subtask ``index`` of checkpoint ``checkpoint_id`` holds."""
    meta = load_checkpoint(storage, checkpoint_id)
    kgs = key_group_range(meta.max_parallelism, meta.parallelism, index)
    backend = KeyedStateBackend(HeapTable(), meta.max_parallelism, kgs)
    st_ = meta.subtasks[index]
    restore_keyed_state(backend, storage, st_.keyed, st_.changelog, "test")
    return _table_content(backend.table, kgs)


def _assert_state_is_the_models(root: str, model: Model, now: int) -> None:
    storage = CheckpointStorage(root)
    for n in list_complete_checkpoints(storage):
        assert verify_checkpoint(storage, load_checkpoint(storage, n)) == [], f"checkpoint {n} is damaged"
    meta = load_checkpoint(storage)
    for name, want in model.checkpointed(now).items():
        assert checkpointed(storage, meta, name, now) == want, f"checkpointed state {name!r} differs from the model"


class _Reads:
    """Records what restores read from checkpoint storage: change sets replayed, snapshots restored."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.change_sets: list[tuple[str, int]] = []
        self.snapshots: list[str] = []
        read_change_set, read_frames = changelog_restore.read_change_set, changelog_restore.read_key_group_frames

        def reading_change_set(storage, handle, context="", only=None, **how):
            if (handle.log_id, handle.sqn) not in self.change_sets:  # read ahead by threads, maybe in parts
                self.change_sets.append((handle.log_id, handle.sqn))
            return read_change_set(storage, handle, context, only, **how)

        def reading_key_groups(storage, handle, context="", only=None, **how):
            self.snapshots.append(handle.path)
            return read_frames(storage, handle, context, only, **how)

        monkeypatch.setattr(changelog_restore, "read_change_set", reading_change_set)
        monkeypatch.setattr(changelog_restore, "read_key_group_frames", reading_key_groups)

    def clear(self) -> None:
        self.change_sets.clear()
        self.snapshots.clear()


# -- catching up --------------------------------------------------------------------------------------------
def test_a_local_copy_at_k_replays_exactly_the_change_sets_after_k(tmp_path, monkeypatch):
    """Subtask 0 runs batches 0-3 on executor e1 (materializing after batch 1), batches 4-7 on e2, then comes
    back to e1: its copy there is at checkpoint 3, so it replays the change sets of checkpoints 4-7 only, and
    its state is then what a full restore of checkpoint 7 gives; the run goes on equal to the model."""
    cluster = Cluster(tmp_path, NO_MATERIALIZATION)
    cluster.start(1)
    model, reads = Model(), _Reads(monkeypatch)
    acks: dict[int, SubtaskAck] = {}
    for n in range(8):
        here = "e1/a" if n < 4 else "e2/a"
        (acks[n],), outputs = cluster.batch(n, _rows(n), [here])
        assert _norm(outputs) == _norm(model.batch(_rows(n), now_of(n)))
        if n == 1:  # a materialized part that checkpoints 2.. carry on: the copy must not re-read it
            sub = cluster.workers["e1/a"].subtasks[(0, 1)]
            sub.clog.materialize_now(sub.keyed)
    storage = CheckpointStorage(cluster.root)
    at_k, base = acks[3], load_checkpoint(storage, 7).subtasks[0]
    assert base.keyed and base.keyed == at_k.keyed, "no materialization between 3 and 7"
    missing = [(h.log_id, h.sqn) for h in base.changelog[len(at_k.changelog):]]
    assert base.changelog[:len(at_k.changelog)] == at_k.changelog and len(missing) == 4

    reads.clear()
    cluster.workers["e1/a"].evict()  # a new Python worker of e1 takes the copy over
    plan = cluster.plans(8, now_of(7))  # the time of batch 7: nothing expires, no timer fires
    sub = cluster.take("e1/b", plan[0])
    try:
        out = sub.run(plan[0], [])
        content = _table_content(sub.keyed.table, plan[0].key_groups)
    finally:
        sub.release_local_state()
    ack = out.ack
    assert (ack.recovery, ack.caught_up_from, ack.restored_from) == ("caught_up", 3, 7)
    assert sorted(reads.change_sets) == sorted(missing), "only the change sets after checkpoint 3"
    assert reads.snapshots == [], "no materialized snapshot"
    replayed = [h for h in plan[0].changelog if (h.log_id, h.sqn) in missing]
    assert ack.restore_bytes == sum(h.span()[1] for h in replayed) + sum(p.length for p in plan[0].operator)
    assert ack.stats["replayed_change_sets"] == 4
    assert content == _restored_content(storage, 7, 0), "the caught-up copy is what a full restore gives"
    cluster.coord.abort(8)

    for n in range(8, 11):  # and it goes on, in other workers, equal to the model
        _, outputs = cluster.batch(n, _rows(n), ["e1/a" if n % 2 else "e1/b"])
        assert _norm(outputs) == _norm(model.batch(_rows(n), now_of(n)))
    _assert_state_is_the_models(cluster.root, model, now_of(10))
    cluster.close()


def test_a_materialization_since_the_copy_means_a_full_restore(tmp_path, monkeypatch):
    cluster = Cluster(tmp_path, CHANGELOG)  # materializes every 3 change sets
    cluster.start(1)
    model, reads = Model(), _Reads(monkeypatch)
    for n in range(10):
        _, outputs = cluster.batch(n, _rows(n), ["e1/a" if n < 2 else "e2/a"])
        assert _norm(outputs) == _norm(model.batch(_rows(n), now_of(n)))
    reads.clear()
    acks, outputs = cluster.batch(10, _rows(10), ["e1/a"])
    assert acks[0].recovery == "restored" and reads.snapshots, "the copy's change sets are no longer listed"
    assert acks[0].stats.get("replayed_change_sets", 0) == len(reads.change_sets), "a restore replays them all"
    assert _norm(outputs) == _norm(model.batch(_rows(10), now_of(10)))
    _assert_state_is_the_models(cluster.root, model, now_of(10))
    cluster.close()


# -- copies that must not be caught up -------------------------------------------------------------------------
def test_a_copy_of_an_aborted_attempt_is_restored_not_reused(tmp_path):
    """The attempt of checkpoint 3 on e1 (at another processing time than its retry, so other timers)
    committed its copy, but its ack was lost: the checkpoint was aborted, and its retry on e2 completed
    checkpoint 3. The e1 copy is tagged 3 too, the base of batch 4 there; trusting it would carry the aborted
    attempt's timers on."""
    cluster = Cluster(tmp_path, NO_MATERIALIZATION)
    cluster.start(1)
    model = Model()
    rows = [[{"k": k, "op": "timer", "x": n, "i": 10 * n + j} for j, k in enumerate(KEYS)] for n in range(6)]
    for n in range(3):
        cluster.batch(n, rows[n], ["e1/a"])
        model.batch(rows[n], now_of(n))
    lost = cluster.attempt("e1/a", cluster.plans(3, now_of(3) + 1)[0], rows[3])  # its ack never arrives
    cluster.coord.abort(3, "an executor was lost")
    assert lost.ack.recovery == "reused"
    for n in range(3, 6):
        acks, outputs = cluster.batch(n, rows[n], ["e2/a" if n == 3 else "e1/b"])
        assert _norm(outputs) == _norm(model.batch(rows[n], now_of(n))), f"batch {n}"
        if n == 4:
            assert acks[0].recovery == "restored", "the copy at 3 is the aborted attempt's, not checkpoint 3"
    _assert_state_is_the_models(cluster.root, model, now_of(5))
    cluster.close()


class Draw(Processor):
    """Remembers a random draw per key: two attempts of one batch differ."""

    def open(self, ctx):
        self.draw = ctx.state(ValueStateDescriptor("draw"))

    def process(self, key, rows, ctx):
        if self.draw.value() is None:
            self.draw.update(random.random())
        yield {"k": key, "draw": self.draw.value()}


@pytest.mark.parametrize("changelog", [NO_MATERIALIZATION, None], ids=["changelog", "no-changelog"])
def test_a_copy_of_a_rejected_duplicate_attempt_is_restored_not_reused(tmp_path, changelog):
    """A speculative second attempt of batch 1 ran on e2 after the accepted one on e1: the e2 copy is tagged 1
    as well, with other draws."""
    cluster = Cluster(tmp_path, changelog, Draw)
    cluster.start(1)
    cluster.batch(0, [{"k": "a"}], ["e1/a"])
    plan = cluster.plans(1, now_of(1))[0]
    accepted = cluster.attempt("e1/a", plan, [{"k": "b"}])
    duplicate = cluster.attempt("e2/a", plan, [{"k": "b"}])
    assert duplicate.rows != accepted.rows
    assert cluster.coord.acknowledge(accepted.ack) and not cluster.coord.acknowledge(duplicate.ack)
    cluster.coord.complete(1)
    acks, outputs = cluster.batch(2, [{"k": "b"}], ["e2/a"])
    assert acks[0].recovery == "restored"
    assert outputs == accepted.rows, "the accepted attempt's state, not the duplicate's"
    cluster.close()


def test_a_fenced_drivers_batch_is_not_caught_up_from(tmp_path):
    """Driver 1 ran batch 2 on e1 (the copy is tagged 2) but was fenced before completing it; driver 2 ran
    batch 2 on e2, at another processing time. Batch 3 on e1 (base 2) must not build on driver 1's batch 2 (whose
    timers would fire late)."""
    cluster = Cluster(tmp_path, NO_MATERIALIZATION)
    old = cluster.start(1)
    model = Model()
    rows = [[{"k": k, "op": "timer", "x": n, "i": 10 * n + j} for j, k in enumerate(KEYS)] for n in range(7)]
    for n in range(2):
        cluster.batch(n, rows[n], ["e1/a"])
        model.batch(rows[n], now_of(n))
    old_attempt = cluster.attempt("e1/a", cluster.plans(2, now_of(2) + 7)[0], rows[2])
    assert old.acknowledge(old_attempt.ack)
    cluster.coord = None  # driver 1 is still running when driver 2 takes over
    cluster.start(1)
    with pytest.raises(FencedError):
        old.complete(2)
    old.close()
    recovery = {}
    for n in range(2, 7):
        (ack,), outputs = cluster.batch(n, rows[n], ["e2/a" if n == 2 else "e1/a"])
        assert _norm(outputs) == _norm(model.batch(rows[n], now_of(n))), f"batch {n}"
        recovery[n] = ack.recovery
    _assert_state_is_the_models(cluster.root, model, now_of(6))
    assert recovery[3] == "restored"
    cluster.close()


@pytest.mark.parametrize("parallelisms, expected", [((2, 1, 2), "caught_up"), ((1, 2, 1), "restored")])
def test_a_copy_from_before_a_rescale_round_trip(tmp_path, parallelisms, expected):
    """The directories of the first parallelism are kept through a round trip: subtask 0's copy on e1 is from
    the first run. 2 → 1 → 2: its change sets come first, whole, in the plan (subtask 0 of 1 restored them
    first): caught up. 1 → 2 → 1: they were split between two subtasks and come back in pieces, after other
    change sets: restored. Either way the state is the model's."""
    cluster = Cluster(tmp_path, NO_MATERIALIZATION)
    model = Model()
    rows = [[{"k": k, "op": "ladd", "x": n, "i": 10 * n + j} for j, k in enumerate(KEYS)] for n in range(8)]
    for run, (parallelism, start, stop) in enumerate(zip(parallelisms, (0, 3, 5), (3, 5, 8), strict=True)):
        cluster.start(parallelism)
        for n in range(start, stop):
            where = ["e2/a", "e2/a"] if run == 1 else ["e1/a", "e2/a"]
            acks, outputs = cluster.batch(n, rows[n], where[:parallelism])
            assert _norm(outputs) == _norm(model.batch(rows[n], now_of(n))), f"batch {n}"
            if n == 5:
                assert acks[0].recovery == expected
    _assert_state_is_the_models(cluster.root, model, now_of(7))
    cluster.close()


def test_a_copy_without_a_lineage_is_restored_even_at_the_base(tmp_path):
    """A copy written by an older spate (tagged with the checkpoint only) cannot be checked: restored."""
    cluster = Cluster(tmp_path, NO_MATERIALIZATION)
    coord = cluster.start(1)
    cluster.batch(0, _rows(0), ["e1/a"])
    cluster.workers["e1/a"].evict()
    table = LmdbTable(local_state_dir(str(tmp_path / "e1"), coord.query.query_id, 0, 1))
    table.put_meta(LINEAGE_META, b"")
    table.close()
    acks, _ = cluster.batch(1, _rows(1), ["e1/a"])
    assert acks[0].recovery == "restored"
    cluster.close()


# -- property: hopping workers, crashes, take-overs ---------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Attempt:
    """One attempt of a batch: where each subtask runs, and what goes wrong (None: nothing, it completes)."""

    where: tuple[int, int, int]  # worker of subtask i (indexes into WORKERS)
    fault: str | None = None  # "lost_ack", "crash", "duplicate", "takeover"
    victim: int = 0  # the subtask the fault hits
    other: int = 0  # "duplicate": the worker of the second attempt; "takeover": the new parallelism - 1


worker_st = st.integers(0, len(WORKERS) - 1)
where_st = st.tuples(worker_st, worker_st, worker_st)
faulty_st = st.builds(Attempt, where_st, st.sampled_from(["lost_ack", "crash", "duplicate", "takeover"]),
                      st.integers(0, 2), st.integers(0, 2))
op_st = st.sampled_from(OPS + ("ladd",) * 3)  # list appends are what a change set replayed twice shows
batch_st = st.tuples(st.lists(st.tuples(st.sampled_from(KEYS), op_st, st.integers(-20, 20)), max_size=8),
                     st.lists(faulty_st, max_size=2), where_st)


def _faulty_attempt(cluster: Cluster, batch_id: int, rows: list[dict], attempt: Attempt) -> None:
    """Run an attempt of the batch that does not complete its checkpoint (at another processing time, so a
    state built on it differs from the model)."""
    coord = cluster.coord
    assert coord is not None
    plans = cluster.plans(batch_id, now_of(batch_id) + 1 + attempt.victim)
    victim = plans[attempt.victim % len(plans)].index
    for plan in plans:
        worker = WORKERS[attempt.where[plan.index]]
        if attempt.fault == "crash" and plan.index == victim:  # dies after processing, before its ack
            sub = cluster.take(worker, plan)
            sub.start(plan, cluster.rows_of(plan, rows))
            cluster.workers[worker].crash()
            break
        out = cluster.attempt(worker, plan, rows)
        if attempt.fault == "duplicate" and plan.index == victim:
            cluster.attempt(WORKERS[attempt.other], plan, rows)  # a rejected second attempt
        if not (attempt.fault == "lost_ack" and plan.index == victim):
            coord.acknowledge(out.ack)
    if attempt.fault == "takeover":  # every ack is in; a new driver takes over before the commit
        cluster.coord = None
        cluster.start(attempt.other + 1)
        with pytest.raises(FencedError):
            coord.complete(batch_id)
        coord.close()
    else:
        coord.abort(batch_id, attempt.fault or "")


def run_hopping(raw: list[tuple], changelog: bool, tmp: Path) -> Counter[str]:
    """Run the batches of ``raw`` (rows, faulty attempts, placement of the attempt that completes) at
    parallelism 2 (until a take-over changes it), checking every batch's outputs and the final state against
    the model; returns how the subtasks of completed checkpoints recovered."""
    cluster = Cluster(tmp, HOPPING_CHANGELOG if changelog else None)
    cluster.start(2)
    model = Model()
    try:
        for n, (ops, faults, where) in enumerate(raw):
            rows = [{"k": k, "op": op, "x": x, "i": 100 * n + j} for j, (k, op, x) in enumerate(ops)]
            for attempt in faults:
                _faulty_attempt(cluster, n, rows, attempt)
            _, outputs = cluster.batch(n, rows, [WORKERS[w] for w in where])
            assert _norm(outputs) == _norm(model.batch(rows, now_of(n))), f"batch {n}: outputs differ from the model"
        _assert_state_is_the_models(cluster.root, model, now_of(len(raw) - 1))
    finally:
        cluster.close()
    return cluster.completed


@settings(max_examples=int(os.environ.get("SPATE_CATCH_UP_EXAMPLES", "40")))
@given(st.lists(batch_st, min_size=1, max_size=9), st.booleans())
def test_state_matches_model_as_subtasks_hop_between_workers_with_crashes(tmp_path_factory, raw, changelog):
    completed = run_hopping(raw, changelog, tmp_path_factory.mktemp("hop"))
    for kind in completed:
        event(f"recovery of a completed checkpoint: {kind}")


def test_hopping_scenario_catches_up_and_restores(tmp_path):
    """A fixed instance of the property: subtasks leave their executor and come back (caught up), with a lost
    ack, a crash, a rejected duplicate and a take-over with a rescale in between (restored)."""
    batch = [("a", "ladd", 1), ("b", "timer", 2), (1, "mput", 3), ((3, "x"), "tput", 4), ("e", "ladd", 5),
             ("c", "ladd", 6), (2, "radd", 7)]
    raw = [(batch, [], (0, 2, 0)), (batch, [], (0, 2, 0)), (batch, [], (2, 0, 0)),  # both leave their executor
           (batch, [], (0, 2, 0)),  # and come back: caught up
           (batch, [Attempt((0, 0, 0), "lost_ack", 1)], (1, 2, 0)),
           (batch, [Attempt((2, 2, 2), "crash", 0)], (0, 0, 0)),
           (batch, [Attempt((0, 1, 0), "duplicate", 1, 2)], (0, 1, 0)),
           (batch, [Attempt((0, 1, 0), "takeover", 0, 2)], (2, 0, 1)),
           (batch, [], (0, 0, 2)), (batch, [], (1, 2, 0))]
    completed = run_hopping(raw, True, tmp_path)
    assert completed["caught_up"] >= 2 and completed["restored"] >= 3 and completed["reused"] >= 1, completed
