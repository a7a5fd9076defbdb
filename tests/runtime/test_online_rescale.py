"""Online rescale (``LocalRunner.rescale``): the parallelism changes between two batches of a running runner,
up and down, several times, with crashes during the rescaling batch (then the same runner retries, or a new
one takes over). Outputs, checkpointed keyed state, timers and operator state always equal the plain model of
``spate_tools.campaigns.model_job``; with lmdb, the new subtasks build their state from the old subtasks' local
copies."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers.model import (
    CHANGELOG,
    CRASH_STEPS,
    KEY_FAMILIES,
    MERGING,
    MERGING_MODES,
    Crash,
    as_rows,
    check_against_model,
    normalized,
    now_of,
    rows_of,
)
from spate import LocalRunner, Processor, load_checkpoint, operator_state_elements
from spate.checkpoint.ackinfo import RESCALED
from spate.errors import IncompatibleStateError
from spate.fs import CheckpointStorage
from spate.runtime.localstate import local_state_dir
from spate.state.lmdb_table import LmdbTable
from spate_tools.campaigns.model_job import OPS, ModelJob

KEYS = ["a", "ü", "日本語", "", "z", "k", "b", "c", "d", "e", "f", "g", "h", "i"]  # a key column holds one type
raw_st = st.sampled_from(KEY_FAMILIES).flatmap(lambda keys: st.lists(st.lists(rows_of(keys), max_size=14), min_size=2,
                                                                     max_size=8))
rescale_st = st.tuples(st.integers(1, 16), st.sampled_from(CRASH_STEPS), st.sampled_from(["retry", "restart"]))


class Scenario:
    """One runner at a time on one checkpoint root and local directory, a sink that records every delivery."""

    def __init__(self, raw: list[list[tuple]], table: str, changelog: bool, merging: str) -> None:
        self.batches = as_rows(raw)
        self.root, self.local_dir = tempfile.mkdtemp(prefix="online-ckpt-"), tempfile.mkdtemp(prefix="online-local-")
        self.table, self.changelog, self.merging = table, changelog, merging
        self.deliveries: dict[int, list[list[str]]] = {}
        self.completed: dict[int, int] = {}  # batch -> parallelism it completed at
        self.clock = [0]
        self.crash: tuple[str, int] | None = None
        self.results: list[Any] = []

    def runner(self, parallelism: int) -> LocalRunner:
        return LocalRunner(ModelJob, key="k", checkpoint_root=self.root, parallelism=parallelism, max_parallelism=128,
                           table=self.table, local_dir=self.local_dir, sink=self._sink, clock=lambda: self.clock[0],
                           fault_injector=self._fault, changelog=CHANGELOG if self.changelog else False,
                           file_merging=MERGING[self.merging])

    def _sink(self, rows: list[dict], batch_id: int) -> None:
        self.deliveries.setdefault(batch_id, []).append(normalized(rows))

    def _fault(self, step: str, batch_id: int) -> None:
        if self.crash == (step, batch_id):
            self.crash = None
            raise Crash(step)

    def run(self, r: LocalRunner, n: int) -> None:
        self.clock[0] = now_of(n)
        try:
            self.results.append(r.run_batch(n, self.batches[n]))
        except Crash as e:
            if str(e) in ("after_complete", "after_sink_before_mark"):
                self.completed[n] = r.parallelism
            raise
        self.completed[n] = self.results[-1].parallelism  # an autoscaler may have rescaled the runner since

    def check(self) -> None:
        check_against_model(self.root, self.batches, self.deliveries, self.completed)

    def cleanup(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
        shutil.rmtree(self.local_dir, ignore_errors=True)


def run_online(raw: list[list[tuple]], start: int, rescales: dict[int, tuple[int, str | None, str]], table: str,
               changelog: bool, merging: str) -> Scenario:
    """Run every batch, rescaling online before batch n to ``rescales[n]``'s parallelism, crashing that batch at
    its step (if any), then retrying with the same runner or taking over with a new one at that parallelism."""
    sc = Scenario(raw, table, changelog, merging)
    r = sc.runner(start)
    pending = dict(rescales)
    n = r.next_batch_id
    while n < len(sc.batches):
        if n in pending:
            parallelism, crash_step, then = pending.pop(n)
            r.rescale(parallelism)
            if crash_step is not None:
                sc.crash = (crash_step, n)
                with pytest.raises(Crash):
                    sc.run(r, n)
                if then == "restart":
                    r.close()
                    r = sc.runner(parallelism)
                n = r.next_batch_id
                continue
        sc.run(r, n)
        n += 1
    r.close()
    sc.runner(r.parallelism).close()  # the next runner gives the sink what a crash kept from it
    sc.check()
    return sc


@settings(max_examples=int(os.environ.get("SPATE_MODEL_EXAMPLES", "40")), deadline=None)
@given(raw_st, st.integers(1, 16),
       st.dictionaries(st.integers(1, 7), rescale_st, max_size=4), st.sampled_from(["heap", "lmdb"]), st.booleans(),
       st.sampled_from(MERGING_MODES))
def test_online_rescales_equal_the_model(raw, start, rescales, table, changelog, merging):
    run_online(raw, start, rescales, table, changelog, merging).cleanup()


def _local_bytes(subtask: Any) -> int:
    """Bytes a rescaled subtask took from local copies: copied, moved or hard-linked."""
    return subtask.stats.get("local_copy_bytes", 0) + subtask.stats.get("local_moved_bytes", 0)


def _operator_bytes(result: Any) -> int:
    """Operator state bytes of a batch's checkpoint (what a rescaled subtask reads at most, keyed state aside)."""
    return sum(s.stats["operator_bytes"] for s in result.checkpoint.subtasks)


def _every_op(batches: int) -> list[list[tuple]]:
    return [[(k, op, b) for k in KEYS for op in OPS] for b in range(batches)]


def test_up_and_down_with_crashes_builds_state_from_local_copies():
    """4 → 8 (crash after the acks, retried) → 3 (crash after the first subtask, retried) → 1: equal to the
    model; every subtask of a rescaling batch built its state from local copies, reading nothing from
    checkpoint storage but operator state, except on 8 → 3: an old copy only one new subtask needs is moved,
    not copied, so after the crash the retry reads from checkpoint storage what the failed attempt moved."""
    sc = run_online(_every_op(7), 4, {2: (8, "after_acks", "retry"), 4: (3, "after_subtask_0", "retry"),
                                      5: (1, None, "retry")}, "lmdb", True, "off")
    pairs = zip(sc.results[:-1], sc.results[1:], strict=True)
    rescaling = [(before, res) for before, res in pairs if res.rescaled_from is not None]
    assert [(res.rescaled_from, res.parallelism) for _, res in rescaling] == [(4, 8), (8, 3), (3, 1)]
    for before, res in rescaling:
        assert {st_.recovery for st_ in res.checkpoint.subtasks} == {RESCALED}
        from_storage = [st_.restore_bytes > _operator_bytes(before) for st_ in res.checkpoint.subtasks]
        assert any(from_storage) == (res.parallelism == 3), "keyed state read from checkpoint storage"
        assert all(_local_bytes(st_) for st_ in res.checkpoint.subtasks)
    assert [res.checkpoint.rescale_reason for _, res in rescaling] == ["requested"] * 3
    sc.cleanup()


def test_a_missing_local_copy_is_read_from_checkpoint_storage_for_its_key_groups_only():
    sc = Scenario(_every_op(4), "lmdb", True, "off")
    r = sc.runner(2)
    sc.run(r, 0)
    sc.run(r, 1)
    shutil.rmtree(local_state_dir(sc.local_dir, r.coordinator.query.query_id, 1, 2))  # old subtask 1's copy is lost
    r.rescale(4)
    sc.run(r, 2)
    subtasks = sc.results[-1].checkpoint.subtasks
    # new subtasks 0 and 1 take over old subtask 0's key groups, 2 and 3 old subtask 1's
    assert [_local_bytes(s) > 0 for s in subtasks] == [True, True, False, False]
    operator = _operator_bytes(sc.results[-2])
    assert [s.restore_bytes <= operator for s in subtasks] == [True, True, False, False]
    sc.run(r, 3)
    r.close()
    sc.check()
    sc.cleanup()


def _fold_per_batch(runner: LocalRunner, entries: int) -> None:
    """The runner's subtasks made from now on (at its rescales, when tables over bases appear) fold ``entries``
    entries of their bases into them per batch (a new config: none is changed in place)."""
    runner.config = dataclasses.replace(runner.config, fold_per_batch=entries)


def test_a_rescaled_table_folds_its_bases_in_and_lets_them_go():
    """1 → 2: both new subtasks read the old table through a hard link; the batches after the rescale (not the
    rescaling one) fold it in, a bounded number of entries each, until the tables are plain ones again."""
    sc = Scenario(_every_op(1) + [[(KEYS[0], "ladd", b), (KEYS[1], "mdel", b)] for b in range(5)], "lmdb", False,
                  "off")
    r = sc.runner(1)
    _fold_per_batch(r, 30)
    sc.run(r, 0)
    r.rescale(2)
    sc.run(r, 1)
    assert not any(s.stats.get("folded_entries") for s in sc.results[-1].checkpoint.subtasks), \
        "the rescaling batch folded: that is work for the batches after it"
    assert all(s.stats["local_moved_bytes"] > 0 and not s.stats.get("local_copy_bytes")
               for s in sc.results[-1].checkpoint.subtasks), "linked, not copied"
    qid = r.coordinator.query.query_id
    assert not os.path.exists(local_state_dir(sc.local_dir, qid, 0, 1)), "the old directory outlived the rescale"
    for n in range(2, 6):
        sc.run(r, n)
    folded = [sum(s.stats.get("folded_entries", 0) for s in res.checkpoint.subtasks) for res in sc.results[2:]]
    assert folded[0] > 0 and folded[-1] == 0, folded
    r.close()
    for i in range(2):
        path = local_state_dir(sc.local_dir, qid, i, 2)
        assert [f for f in os.listdir(path) if f.startswith("base-")] == [], "a folded base is unlinked"
        table = LmdbTable(path)
        assert table.committed_meta("bases") in (None, b"") and table.verify() is None
        assert not table.scan(b"\xff\xfe"), "no tombstone outlives the last base"
        table.close()
    sc.check()
    sc.cleanup()


def test_key_groups_left_in_a_copy_from_an_earlier_parallelism_never_come_back():
    """With nothing folded, 1 → 2 → 1 → 2: tables over bases, moved and read entry by entry at the next rescales,
    with deletions of keys the bases hold; nothing deleted comes back."""
    puts = [(k, op, x) for k in KEYS for op, x in [("vput", 5), ("timer", 1), *(("mput", x) for x in range(4))]]
    deletes = [(k, op, x) for k in KEYS for op, x in [("vclear", 0), ("untimer", 0), *(("mdel", x) for x in range(4))]]
    reads = [(k, "ladd", 1) for k in KEYS]
    sc = Scenario([puts, deletes, reads, reads, puts, reads], "lmdb", True, "off")
    r = sc.runner(1)
    _fold_per_batch(r, 0)
    for n, parallelism in enumerate([1, 2, 2, 1, 1, 2]):
        r.rescale(parallelism)
        sc.run(r, n)
    r.close()
    sc.check()
    sc.cleanup()


def test_rescale_beyond_the_max_parallelism_is_refused_and_the_query_goes_on():
    sc = Scenario(_every_op(3), "lmdb", True, "off")
    r = LocalRunner(ModelJob, key="k", checkpoint_root=sc.root, parallelism=2, max_parallelism=8, table="lmdb",
                    local_dir=sc.local_dir, sink=sc._sink, clock=lambda: sc.clock[0])  # noqa: SLF001
    sc.run(r, 0)
    with pytest.raises(IncompatibleStateError, match=r"parallelism 9 exceeds the max parallelism 8 .*at most 8"):
        r.rescale(9)
    with pytest.raises(ValueError, match="parallelism must be an int >= 1"):
        r.rescale(0)
    sc.run(r, 1)
    r.rescale(8)
    sc.run(r, 2)
    assert sc.results[-1].parallelism == 8
    r.close()
    sc.check()
    sc.cleanup()


class AllOperatorStates(Processor):
    """Counts per key, and one element per subtask and batch in split, union and broadcast operator state."""

    def open(self, ctx: Any) -> None:
        self.split = ctx.get_list_state("split")
        self.union = ctx.get_union_list_state("union")
        self.broadcast = ctx.get_broadcast_state("broadcast")

    def end_batch(self, ctx: Any) -> list[dict]:
        self.split.add([ctx.batch_id, ctx.subtask_index])
        self.union.add([ctx.batch_id, ctx.subtask_index]) if ctx.subtask_index == 0 else None
        self.broadcast.put(ctx.batch_id, ctx.subtask_index)
        return []

    def process(self, key: Any, rows: list[dict], ctx: Any) -> list[dict]:
        return []


@pytest.mark.parametrize("table", ["heap", "lmdb"])
def test_operator_state_is_redistributed_online_exactly_as_on_restart(table):
    """The same history on two roots; 3 → 5 online on one, by a restart on the other: every subtask holds the
    same operator state elements afterwards (FLIP-8: split round-robin, union to all, broadcast copied)."""
    rows = [[{"k": i} for i in range(30)] for _ in range(3)]
    metas = []
    for online in (True, False):
        root, local = tempfile.mkdtemp(), tempfile.mkdtemp()
        r = LocalRunner(AllOperatorStates, key="k", checkpoint_root=root, parallelism=3, table=table, local_dir=local)
        r.run(rows, until=2)
        if online:
            r.rescale(5)
        else:
            r.close()
            r = LocalRunner(AllOperatorStates, key="k", checkpoint_root=root, parallelism=5, table=table,
                            local_dir=local)
        r.run(rows)
        r.close()
        storage = CheckpointStorage(root)
        metas.append({name: operator_state_elements(storage, load_checkpoint(storage), name)
                      for name in ("split", "union", "broadcast")})
    assert metas[0] == metas[1]
    assert len(metas[0]["split"]) == 5


def test_the_cli_lists_the_latest_rescales_with_their_reasons(capsys):
    """Rescales by hand and by the autoscaler, as `spate checkpoints list` prints them (table and --json),
    carried forward by every checkpoint after them."""
    from spate import AutoscalePolicy
    from spate_tools.cli import main as cli

    sc = Scenario(_every_op(5), "lmdb", True, "off")
    policy = AutoscalePolicy(min_parallelism=1, max_parallelism=3, target_batch_ms=1e9, cooldown_batches=0)
    r = LocalRunner(ModelJob, key="k", checkpoint_root=sc.root, parallelism=3, max_parallelism=128, table="lmdb",
                    local_dir=sc.local_dir, sink=sc._sink, clock=lambda: sc.clock[0], autoscale=policy)  # noqa: SLF001
    r.rescale(2, "by hand")
    for n in range(5):
        sc.run(r, n)
    r.close()
    sc.check()
    capsys.readouterr()
    assert cli(["checkpoints", "list", sc.root, "--json"]) == 0
    rescales = json.loads(capsys.readouterr().out)["rescales"]
    assert [(x["checkpoint_id"], x["from"], x["to"]) for x in rescales] == [(1, 2, 1)], rescales
    assert "target 1,000,000,000 ms" in rescales[0]["reason"], rescales
    assert [d.to_parallelism for d in r.decisions] == [1]
    assert cli(["checkpoints", "list", sc.root]) == 0
    printed = capsys.readouterr().out
    assert "rescales (the latest" in printed and "target 1,000,000,000 ms" in printed, printed
    sc.cleanup()


def test_a_table_another_directory_links_is_never_written_again():
    """A stale attempt at the old parallelism must not write an old table a rescaled subtask reads as a base:
    a table whose data file has another link is restored from checkpoint storage instead, and the file is
    left as it was."""
    sc = Scenario(_every_op(2), "lmdb", True, "off")
    r = sc.runner(2)
    sc.run(r, 0)
    r.close()
    qid = r.coordinator.query.query_id
    data = os.path.join(local_state_dir(sc.local_dir, qid, 0, 2), "data.mdb")
    other = os.path.join(sc.local_dir, "base-0-2.mdb")
    os.link(data, other)
    with open(other, "rb") as f:
        before = f.read()
    r = sc.runner(2)
    sc.run(r, 1)
    r.close()
    assert [s.recovery for s in sc.results[-1].checkpoint.subtasks] == ["restored", "reused"]
    with open(other, "rb") as f:
        assert f.read() == before, "the linked file was written"
    sc.check()
    sc.cleanup()
