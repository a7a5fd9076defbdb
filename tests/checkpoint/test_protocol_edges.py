"""Edge cases of the driver/task protocol and the state API found in review: re-sent and rejected acks,
sink failures, savepoint targets, state checks on restore, TTL in key scans, state outside key scope."""

from __future__ import annotations

import copy

import pytest

from spate import (
    CheckpointStorage,
    Coordinator,
    IncompatibleStateError,
    LocalRunner,
    Processor,
    ValueStateDescriptor,
)
from spate.checkpoint.ackinfo import CAUGHT_UP, RecoveryInfo
from spate.checkpoint.metadata import CheckpointMetadata
from spate.checkpoint.protocol import SubtaskAck
from spate.keygroups import compile_key_hasher
from spate.runtime.recovery import recovered
from spate.runtime.services import WorkerServices
from spate.runtime.subtask import Subtask, SubtaskConfig, processor_factory


class C(Processor):
    def open(self, ctx):
        self.c = ctx.state(ValueStateDescriptor("c", default=0))

    def process(self, key, rows, ctx):
        self.c.update(self.c.value() + len(rows))
        yield {"k": key, "c": self.c.value()}


def _rows(coord, keys):
    h = compile_key_hasher(None)
    return [(h(k) % coord.max_parallelism, k, {"k": k}) for k in keys]


def test_a_resent_ack_never_deletes_the_accepted_files(tmp_path):
    coord = Coordinator(str(tmp_path))
    coord.start(1)
    plan = coord.begin(0, 1, 0)[0]
    ack = Subtask(0, 1, processor_factory(C), SubtaskConfig(), WorkerServices(coord.storage.uri)).run(
        plan, _rows(coord, ["x"])).ack
    assert coord.acknowledge(ack) and not coord.acknowledge(copy.deepcopy(ack))
    coord.complete(0)
    coord.drain()
    assert ack.files and all(CheckpointStorage(str(tmp_path)).exists(p) for p in ack.files)


def test_a_rejected_attempt_does_not_reuse_its_deleted_files(tmp_path):
    root = str(tmp_path)
    coord = Coordinator(root)
    coord.start(1)
    a, b = (Subtask(0, 1, processor_factory(C), SubtaskConfig(), WorkerServices(root)) for _ in range(2))
    plan = coord.begin(0, 1, 0)[0]
    accepted, rejected = b.run(plan, _rows(coord, ["x"])), a.run(plan, _rows(coord, ["x"]))
    assert coord.acknowledge(accepted.ack) and not coord.acknowledge(rejected.ack)
    coord.complete(0)
    again = a.run(coord.begin(1, 1, 0)[0], [])
    assert again.ack.recovery == "restored", "its live state is not the accepted attempt's"
    assert again.ack.keyed == accepted.ack.keyed, "a snapshot it reuses is the accepted one"
    coord.acknowledge(again.ack)
    meta = coord.complete(1)
    assert all(CheckpointStorage(root).exists(p) for p in meta.files())


def test_an_ack_carries_how_the_state_was_recovered_as_its_typed_fields():
    info = RecoveryInfo(recovery=CAUGHT_UP, restored_from=7, caught_up_from=3, restore_bytes=10, restore_ms=1.5)
    ack = SubtaskAck(7, 0, 1, rows=2, **info.recovery_info())
    again = SubtaskAck.from_dict(ack.to_dict())
    assert RecoveryInfo(**again.recovery_info()) == info and (again.recovery, again.rows) == ("caught_up", 2)
    with pytest.raises(ValueError, match="recovery must be one of"):
        RecoveryInfo(recovery="teleported")


def test_a_plan_carries_the_state_entries_of_the_base_subtask_of_its_key_groups(tmp_path):
    """Each ack records the subtask's state entries; the next plan at the same parallelism hands subtask i the
    count of the base's subtask i (the same key groups), at another parallelism none (other key groups). Metadata
    written before the field existed reads as not known."""
    root = str(tmp_path)
    coord = Coordinator(root)
    coord.start(2)
    services = WorkerServices(root)
    for plan in coord.begin(0, 2, 0):
        rows = [r for r in _rows(coord, [f"k{i}" for i in range(20)]) if r[0] in plan.key_groups]
        coord.acknowledge(Subtask(plan.index, 2, processor_factory(C), SubtaskConfig(), services).run(plan, rows).ack)
    meta = coord.complete(0)
    entries = [st.state_entries for st in meta.subtasks]
    assert sum(entries) == 20 and all(entries)
    assert [p.base_state_entries for p in coord.begin(1, 2, 0)] == entries
    assert [p.base_state_entries for p in coord.begin(1, 3, 0)] == [None] * 3
    written = meta.to_dict()
    assert [st["state_entries"] for st in written["subtasks"]] == entries
    for st in written["subtasks"]:
        del st["state_entries"]
    assert [st.state_entries for st in CheckpointMetadata.from_dict(written).subtasks] == [None, None]


class _FailsToOpenOnce(C):
    failures = [1]

    def open(self, ctx):
        super().open(ctx)
        if self.failures[0]:
            self.failures[0] -= 1
            raise RuntimeError("open failed")


@pytest.mark.parametrize("table", ["heap", "lmdb"])
def test_a_processor_that_fails_to_open_on_restored_state_leaves_nothing_open_and_the_retry_restores(
        tmp_path, table):
    root, local = str(tmp_path / "c"), str(tmp_path / "local")
    coord = Coordinator(root)
    coord.start(1)
    config = SubtaskConfig(table=table, local_dir=local if table == "lmdb" else None)
    first = Subtask(0, 1, processor_factory(C), config, WorkerServices(root))
    coord.acknowledge(first.run(coord.begin(0, 1, 0)[0], _rows(coord, ["x"])).ack)
    coord.complete(0)
    first.close(destroy=True)  # the next subtask restores from checkpoint storage
    _FailsToOpenOnce.failures[0] = 1
    second = Subtask(0, 1, processor_factory(_FailsToOpenOnce), config, WorkerServices(root))
    plan = coord.begin(1, 1, 0)[0]
    with pytest.raises(RuntimeError, match="open failed"):
        second.run(plan, _rows(coord, ["x"]))
    assert (second.keyed, second.processor, second.clog) == (None, None, None)
    out = second.run(plan, _rows(coord, ["x"]))
    assert out.ack.recovery == "restored" and out.rows == [{"k": "x", "c": 2}]
    second.close()


def test_files_local_state_carries_are_checked_again_after_the_check_failed(tmp_path, monkeypatch):
    """Reused local state references checkpoint files it did not read; they are checked before the state counts
    as being at the base. If the check itself fails (storage unreachable), the retry checks again instead of
    taking the state as checked."""
    root, local = str(tmp_path / "c"), str(tmp_path / "local")
    settings = {"key": "k", "checkpoint_root": root, "table": "lmdb", "local_dir": local, "changelog": True}
    with LocalRunner(C, **settings) as r:
        r.run_batch(0, [{"k": "x"}])
        r.run_batch(1, [{"k": "x"}])
    checks = []
    real = recovered.verify_handles

    def unreachable_once(*args, **kwargs):  # fault injection: the first check cannot read storage
        checks.append(args[1])
        if len(checks) == 1:
            raise OSError("storage unreachable")
        return real(*args, **kwargs)

    monkeypatch.setattr(recovered, "verify_handles", unreachable_once)
    with LocalRunner(C, **settings) as r:
        with pytest.raises(OSError, match="unreachable"):
            r.run_batch(2, [{"k": "x"}])
        result = r.run_batch(2, [{"k": "x"}])
    assert len(checks) == 2 and checks[0], "the carried files were checked on the retry too"
    assert result.checkpoint.subtasks[0].recovery in ("reused", "caught_up")


def test_a_failed_sink_gets_the_batch_again_before_the_next_one(tmp_path):
    delivered = []
    fail = [True]

    def sink(rows, batch_id):
        if fail[0]:
            fail[0] = False
            raise OSError("sink down")
        delivered.append(batch_id)

    src = [[{"k": "a"}]] * 3
    with LocalRunner(C, key="k", checkpoint_root=str(tmp_path), retained=1, sink=sink) as r:
        with pytest.raises(OSError):
            r.run_batch(0, src[0])
        r.run(src)
    assert delivered == [0, 1, 2]


def test_savepoint_inside_the_root_outside_savepoints_is_refused(tmp_path):
    with LocalRunner(C, key="k", checkpoint_root=str(tmp_path)) as r:
        r.run([[{"k": "a"}]])
        with pytest.raises(ValueError, match="inside the checkpoint root"):
            r.savepoint(str(tmp_path / "backup"))
        assert "savepoints/" in r.savepoint()


@pytest.mark.parametrize("table", ["heap", "lmdb"])
@pytest.mark.parametrize("change", [{"ttl_ms": 1000}, {"serializer": "pickle"}])
def test_state_checks_apply_on_restore(tmp_path, table, change):
    class Changed(C):
        def open(self, ctx):
            self.c = ctx.state(ValueStateDescriptor("c", default=0, **change))

    root = str(tmp_path / "c")
    with LocalRunner(C, key="k", checkpoint_root=root, parallelism=2) as r:
        r.run([[{"k": "a"}, {"k": "b"}]])
    with LocalRunner(Changed, key="k", checkpoint_root=root, parallelism=3, table=table, allow_pickle=True) as r, \
            pytest.raises(IncompatibleStateError, match="'c'"):
        r.run([[], [{"k": "a"}]])


def test_key_scans_skip_expired_values(tmp_path):
    ttl = ValueStateDescriptor("v", ttl_ms=1000)

    class Scan(Processor):
        def open(self, ctx):
            self.v = ctx.state(ttl)

        def process(self, key, rows, ctx):
            if rows[0].get("set"):
                self.v.update(1)
            yield {"keys": sorted(ctx.keys(ttl))}

    clock = [0]
    with LocalRunner(Scan, key="k", checkpoint_root=str(tmp_path), clock=lambda: clock[0]) as r:
        (first,) = r.run([[{"k": "a", "set": True}]])
        clock[0] = 5000
        (later,) = r.run([[{"k": "a", "set": True}], [{"k": "b"}]])
    assert first.outputs == [{"keys": ["a"]}] and later.outputs == [{"keys": []}]


def test_keyed_state_and_timers_outside_a_key_are_refused(tmp_path):
    class Misuse(C):
        def end_batch(self, ctx):
            self.c.update(99)

    with LocalRunner(Misuse, key="k", checkpoint_root=str(tmp_path)) as r, \
            pytest.raises(RuntimeError, match="outside a key"):
        r.run([[{"k": "a"}]])

    class TimerInOpen(C):
        def open(self, ctx):
            super().open(ctx)
            ctx.register_event_time_timer(5)

    with LocalRunner(TimerInOpen, key="k", checkpoint_root=str(tmp_path / "t")) as r, \
            pytest.raises(RuntimeError, match="timers belong to a key"):
        r.run([[{"k": "a"}]])
