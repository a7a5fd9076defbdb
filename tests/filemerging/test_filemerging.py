"""FLIP-306 file merging (docs/formats.md, "Segments (file merging)"): scenarios 10–15, the worker/coordinator
protocol, space control, and crashes with open physical files."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from helpers.counting import Count, batches, counts, expected_counts
from spate import LocalRunner, keyed_state_entries, load_checkpoint, verify_checkpoint
from spate.changelog.state import ChangelogConfig
from spate.changelog.upload import UploadConfig
from spate.checkpoint.coordinator import list_complete_checkpoints
from spate.filemerging.config import FileMergingConfig
from spate.filemerging.manager import FileMergingManager
from spate.filemerging.registry import FileRegistry
from spate.fs import CheckpointStorage
from spate.keygroups import compile_key_hasher
from spate.layout import is_marker, random_name, subtask_dir
from spate.segments import FileRef

MB = 1 << 20


def _registry() -> tuple[FileRegistry, list[str]]:
    discarded: list[str] = []
    return FileRegistry(discarded.append), discarded


# -- scenario 10: logical/physical -------------------------------------------------------------------------
def test_scenario_10_last_use_and_deletion_on_close():
    reg, discarded = _registry()
    ref = FileRef("shared/subtask-0-1/f.seg", 0, 10)
    reg.register(ref, 2)
    reg.register(ref, 1)  # an older checkpoint never lowers the last use
    reg.set_open(["shared/subtask-0-1/f.seg"])
    reg.unregister_unused(2)  # subsuming checkpoint 1: last used by 2, kept
    assert len(reg) == 1 and not discarded
    reg.unregister_unused(3)  # subsuming checkpoint 2: the logical file goes
    assert len(reg) == 0
    assert not discarded, "ref count 0 but still open: not deleted"
    reg.set_open([])
    assert discarded == ["shared/subtask-0-1/f.seg"], "closed with ref count 0: deleted"
    reg.set_open([])
    reg.sweep(["shared/subtask-0-1/f.seg"])
    assert discarded == ["shared/subtask-0-1/f.seg"], "deleted exactly once"


# -- scenario 11: space statistics -------------------------------------------------------------------------
def test_scenario_11_space_stats(tmp_path):
    manager = FileMergingManager(CheckpointStorage(str(tmp_path)), FileMergingConfig("across"))
    out = manager.shared_writer(0, 1, 1)
    a, b = out.write(b"a" * 123), out.write(b"b" * 456)
    assert a.path == b.path and b.offset == 123
    reg, discarded = _registry()
    reg.register(a, 1)
    reg.register(b, 2)
    reg.set_open([a.path])
    s = reg.stats()
    assert (s.physical_bytes, s.logical_bytes) == (579, 579)
    reg.unregister_unused(2)
    s = reg.stats()
    assert (s.physical_bytes, s.logical_bytes) == (579, 456)
    reg.set_open([])  # closed
    reg.unregister_unused(3)
    s = reg.stats()
    assert (s.physical_bytes, s.logical_bytes, s.physical_files) == (0, 0, 0) and discarded == [a.path]
    manager.close()


# -- scenario 12: subsume and abort, within and across checkpoints --------------------------------------------
def _files(root: str, directory: str) -> set[str]:
    return {p for p, _ in CheckpointStorage(root).list_files(directory)}


def _rows_for_subtask(subtask: int, parallelism: int, n: int, start: int = 0) -> list[dict]:
    """Rows whose keys belong to ``subtask`` (max parallelism 128)."""
    h, out, k = compile_key_hasher(None), [], start
    while len(out) < n:
        if (h(f"k{k}") % 128) * parallelism // 128 == subtask:
            out.append({"k": f"k{k}"})
        k += 1
    return out


def test_scenario_12_within_checkpoint_subsume_and_abort(tmp_path):
    root = str(tmp_path)
    with LocalRunner(Count, key="k", checkpoint_root=root, parallelism=2, max_parallelism=128, retained=1,
                     file_merging="within") as r:
        both = _rows_for_subtask(0, 2, 3) + _rows_for_subtask(1, 2, 3)
        r.run_batch(0, both)
        s0_cp0, s1_cp0 = _files(root, subtask_dir(0, 2)), _files(root, subtask_dir(1, 2))
        r.run_batch(1, _rows_for_subtask(1, 2, 2, start=1000))  # only subtask 1 changes
        r.run_batch(2, [])
        r.coordinator.drain()
        assert _files(root, subtask_dir(0, 2)) == s0_cp0, "subtask 0 reused its file: kept"
        s1 = _files(root, subtask_dir(1, 2))
        assert not (s1 & s1_cp0) and len(s1) == 1, "subsuming checkpoint 0 deleted only subtask 1's file"

        coord = r.coordinator  # checkpoint 3 is aborted after every subtask wrote and acknowledged it
        before = {p for p, _ in coord.storage.list_files()}
        h = compile_key_hasher(None)
        for plan in coord.begin(3, r.parallelism, 0):
            rows = [(h(x["k"]) % 128, x["k"], x) for x in _rows_for_subtask(plan.index, 2, 1, 2000)]
            coord.acknowledge(r.subtasks[plan.index].run(plan, rows).ack)
        written = {p for p, _ in coord.storage.list_files()} - before
        coord.abort(3)
        assert written and all(coord.storage.exists(p) for p in written), "still open in the worker's pool"
        r.run_batch(4, [])  # the worker learns of the abort (its pool closes) and checkpoint 4 settles it
        r.run_batch(5, [])  # the worker reports the files unused; the coordinator deletes them
        coord.drain()
        assert not any(coord.storage.exists(p) for p in written), "checkpoint 3's files are deleted"
    assert counts(root) == {**{row["k"]: 1 for row in both}, **{row["k"]: 1 for row in _rows_for_subtask(
        1, 2, 2, start=1000)}}


def test_scenario_12_across_checkpoints_files_survive_while_shared(tmp_path):
    root = str(tmp_path)
    fail = {"on": False}

    def fault(step, batch_id):
        if fail["on"] and step == "after_acks":
            raise RuntimeError("abort")

    cfg = FileMergingConfig("across", max_space_amplification=0)
    with LocalRunner(Count, key="k", checkpoint_root=root, parallelism=1, retained=1, file_merging=cfg,
                     fault_injector=fault) as r:
        r.run_batch(0, [{"k": "a"}])
        files = _files(root, subtask_dir(0, 1))
        r.run_batch(1, [{"k": "b"}])
        r.run_batch(2, [{"k": "c"}])
        r.coordinator.drain()
        assert _files(root, subtask_dir(0, 1)) == files, "one physical file took every checkpoint's snapshot"
        fail["on"] = True
        with pytest.raises(RuntimeError):
            r.run_batch(3, [{"k": "d"}])
        r.coordinator.drain()
        assert _files(root, subtask_dir(0, 1)) == files, "aborting a checkpoint keeps a file still in use"
        fail["on"] = False
        r.run_batch(3, [{"k": "d"}])
        storage = CheckpointStorage(root)
        meta = load_checkpoint(storage)
        assert len(meta.segments()) > len(meta.files()) or meta.subtasks[0].keyed[0].file_offset > 0
    assert counts(root) == {"a": 1, "b": 1, "c": 1, "d": 1}


def test_a_plan_grants_only_its_subtasks_files_and_a_shared_worker_keeps_appending(tmp_path):
    """Each plan lists only the open files of its own shared directory and of workers (small plans at high
    parallelism), and one worker serving every subtask keeps appending to each subtask's file: a plan of
    subtask i does not revoke subtask j's files."""
    root, p = str(tmp_path), 3
    cfg = FileMergingConfig("across", max_space_amplification=0)
    with LocalRunner(Count, key="k", checkpoint_root=root, parallelism=p, file_merging=cfg) as r:
        r.run_batch(0, [{"k": k} for k in "abcdefgh"])
        files = [_files(root, subtask_dir(i, p)) for i in range(p)]
        for n in range(1, 4):
            r.run_batch(n, [{"k": k} for k in "abcdefgh"])
        r.coordinator.drain()
        assert [_files(root, subtask_dir(i, p)) for i in range(p)] == files
        plans = r.coordinator.begin(4, p)
        granted = r.coordinator.registry.open_files
        for plan in plans:
            assert all(f.startswith((subtask_dir(plan.index, p) + "/", "taskowned/")) for f in plan.open_files)
        assert {f for plan in plans for f in plan.open_files} == set(granted)
        r.coordinator.abort(4)


# -- scenario 13: space-amplification control ---------------------------------------------------------------
def test_scenario_13_space_control():
    reg, _ = _registry()
    seg = [None] + [FileRef("A", (i - 1) * 4 * MB, 4 * MB) for i in range(1, 7)]
    seg += [FileRef("B", (i - 7) * 4 * MB, 4 * MB) for i in range(7, 10)]
    for i in range(1, 7):
        reg.register(seg[i], 1)
    for i in (1, 7, 8, 9):
        reg.register(seg[i], 2)
    reg.unregister_unused(2)  # subsume checkpoint 1
    stats = reg.stats()
    assert (stats.logical_files, stats.physical_files) == (4, 2)
    assert reg.control_space() == ["A"]
    assert reg.non_reusable == ["A"], "segment 1's file is no longer reusable; segment 7's is"


def test_space_control_rewrites_live_segments_and_frees_the_file(tmp_path):
    """Across checkpoints: change sets die at each materialization and operator state when its checkpoint is
    subsumed, so open files fill with dead segments; space control revokes them, their live segments are
    re-written and the files go, keeping the amplification near the bound."""
    root, src = str(tmp_path), batches(60)
    clog = ChangelogConfig(materialization_interval_ms=4000, upload=UploadConfig(persist_delay_s=0.0))
    clock = [0]
    amps, marked = [], set()
    with LocalRunner(Count, key="k", checkpoint_root=root, parallelism=2, retained=2, file_merging="across",
                     changelog=clog, clock=lambda: clock[0]) as r:
        for n, rows in enumerate(src):
            clock[0] = 1000 * n
            r.run_batch(n, rows)
            amps.append(r.coordinator.registry.stats().amplification)
            marked |= set(r.coordinator.registry.non_reusable)
        r.coordinator.drain()
        alive = {p for p, _ in CheckpointStorage(root).list_files()}
    assert marked, "space control marked wasteful files"
    assert marked - alive, "marked files were deleted once their live segments were re-written"
    # a materialization kills every change set at once; the files go after their live segments are re-written
    # and the checkpoints still referencing the old copies are subsumed, so peaks last about the retention
    steady = sorted(amps[10:])
    assert steady[len(steady) // 2] <= 2.0 and steady[-1] <= 3.5, f"amplification held near the bound: {amps}"
    assert counts(root) == expected_counts(src)


def test_a_materialization_gets_a_physical_file_of_its_own(tmp_path):
    """Materializations never share a physical file: the next one would sit beside a dead one, and space control
    would then copy the whole live state out of that file on some checkpoint's path."""
    manager = FileMergingManager(CheckpointStorage(str(tmp_path)), FileMergingConfig("across"))
    pooled = manager.shared_writer(0, 1, 1)
    small = pooled.write(b"s" * 10)
    first, second = (manager.shared_writer(0, 1, 1, alone=True).write(b"m" * 100) for _ in range(2))
    assert len({small.path, first.path, second.path}) == 3
    assert pooled.write(b"t" * 10).path == small.path, "the pool keeps its file; the alone files take nothing"
    assert os.path.getsize(tmp_path / first.path) == 100


def test_space_control_rewrites_stay_within_the_budget_per_snapshot(tmp_path):
    """Segments of non-reusable files and segments in another subtask's directory (state restored after a
    rescale) are re-written at most ``rewrite_budget`` bytes per snapshot; the rest is named where it is until a
    later checkpoint moves it."""
    from spate.runtime.snapshot_files import Relocator
    from spate.snapshot.handles import KeyGroupsHandle
    from spate.snapshot.keyed import SnapshotScope, write_key_groups

    storage = CheckpointStorage(str(tmp_path))
    manager = FileMergingManager(storage, FileMergingConfig("across"))

    class View:
        def key_group_flat(self, kg):
            return [b"\0\0k%d" % kg, b"v" * 1000]

    def handle(index: int, parallelism: int) -> KeyGroupsHandle:
        h = write_key_groups(View(), SnapshotScope(range(4), (), {}),
                             manager.shared_writer(index, parallelism, 1, alone=True))
        assert h is not None
        return h

    wasteful = [handle(0, 1) for _ in range(3)]
    foreign = handle(1, 2)
    size = wasteful[0].span()[1]
    out = manager.shared_writer(0, 1, 2)
    fix = Relocator(storage, out, out, [h.path for h in wasteful], subtask_dir(0, 1), budget=2 * size)
    fixed = [fix(h) for h in wasteful]
    assert [f is h for f, h in zip(fixed, wasteful, strict=True)] == [False, False, True]
    assert fix(foreign) is foreign, "another subtask's segment over the budget stays where it is"
    assert fix.rewritten_bytes == 2 * size

    later = Relocator(storage, out, out, [], subtask_dir(0, 1), budget=size)
    moved = later(foreign)
    assert moved is not foreign and moved.path.startswith(subtask_dir(0, 1) + "/"), "within the budget it moves"
    assert later(wasteful[2]) is wasteful[2], "a reusable file's segment in the subtask's own directory stays"
    assert later.rewritten_bytes == size


# -- scenario 14: pools -----------------------------------------------------------------------------------
def test_scenario_14_pools(tmp_path):
    storage = CheckpointStorage(str(tmp_path))
    across = FileMergingManager(storage, FileMergingConfig("across", max_file_size=100))
    out = across.private_writer(1)
    a, b = out.write(b"x" * 60), out.write(b"y" * 60)
    c = out.write(b"z" * 10)
    assert a.path == b.path, "a returned file is reused"
    assert c.path != b.path, "a file that reached the maximum size is not"
    assert across.private_writer(2).write(b"w").path == c.path, "across checkpoints: reused"
    across.close()

    within = FileMergingManager(storage, FileMergingConfig("within"))
    p1 = within.private_writer(1).write(b"a").path
    assert within.private_writer(1).write(b"b").path == p1
    assert within.private_writer(2).write(b"c").path != p1, "within checkpoints: never reused across them"
    within.close()


@pytest.mark.parametrize("blocking", [True, False])
def test_blocking_and_non_blocking_pools(tmp_path, blocking):
    manager = FileMergingManager(CheckpointStorage(str(tmp_path)), FileMergingConfig("across", blocking_pool=blocking))
    out = manager.private_writer(1)
    pool = out.pool
    first = pool.take(1)  # a writer holds the file
    assert first is not None
    got: list = []
    t = threading.Thread(target=lambda: got.append(out.write(b"data")))
    t.start()
    t.join(0.2 if blocking else 5)  # a blocking pool's writer is still waiting; the other is done
    assert bool(got) != blocking, "blocking pool: the second writer waits; non-blocking: it creates a file"
    pool.give_back(first)
    t.join(5)
    assert (got[0].path == first.path) == blocking
    manager.close()


# -- scenario 15: directory cleanup -----------------------------------------------------------------------
def test_scenario_15_directory_ownership(tmp_path):
    storage = CheckpointStorage(str(tmp_path))
    cfg = FileMergingConfig()
    unused = FileMergingManager(storage, cfg)
    unused.close()
    assert not storage.exists(unused.worker_dir)

    aborted = FileMergingManager(storage, cfg)
    ref = aborted.private_writer(3).write(b"state of a checkpoint that never completes")
    aborted.begin(4, None)  # checkpoint 3 was aborted
    aborted.close()
    assert not storage.exists(ref.path) and not storage.list_files(aborted.worker_dir), "removed on close"

    completed = FileMergingManager(storage, cfg)
    ref = completed.private_writer(5).write(b"state")
    completed.checkpoint_completed(5)
    completed.close()
    assert storage.exists(ref.path), "a checkpoint completed: the coordinator owns the directory now"


def test_old_directories_go_after_a_rescale(tmp_path):
    """Restore at the same parallelism takes over the subtask directories; at another parallelism each
    subtask copies what it needs (here all of it fits in the rewrite budget) and the old directories are deleted
    once the old checkpoints are subsumed.
    Change sets a restore carries over are copied out of the old worker's directory too."""
    root, src = str(tmp_path), batches(12)
    kw = dict(key="k", checkpoint_root=root, retained=2, file_merging="across", changelog=True)
    with LocalRunner(Count, parallelism=2, **kw) as r:
        r.run(src, until=4)
        old_worker = r.coordinator.live_workers
    with LocalRunner(Count, parallelism=2, **kw) as r:
        r.run(src, until=6)
        assert _files(root, subtask_dir(0, 2)) or _files(root, "taskowned"), "same parallelism: same directories"
    with LocalRunner(Count, parallelism=3, **kw) as r:
        r.run(src)
        r.coordinator.drain()
        meta = load_checkpoint(r.coordinator.storage)
        paths = {ref.path for ref in meta.segments()}
        assert not any(p.startswith("shared/subtask-") and not p.startswith(("shared/subtask-0-3/",
                       "shared/subtask-1-3/", "shared/subtask-2-3/")) for p in paths), "each subtask owns its state"
    dirs = set(CheckpointStorage(root).list_dirs("shared"))
    assert not {d for d in dirs if d.endswith("-2")}, f"old subtask directories deleted: {dirs}"
    workers = set(CheckpointStorage(root).list_dirs("taskowned"))
    assert not (workers & old_worker), "the first run's worker directory is gone"
    assert counts(root) == expected_counts(src)


@pytest.mark.parametrize("table", ["heap", "lmdb"])
def test_a_rescaled_full_snapshot_is_copied_not_written_again(tmp_path, table):
    """Without the changelog, a rescaled subtask whose state is still the restored one names the base's key
    groups again, copied byte for byte into its own directory (its first checkpoint does not serialize its
    share of the state again), and named as they are by the next unchanged checkpoint; the copies restore to
    the same counts at yet another parallelism."""
    root, src = str(tmp_path / "c"), batches(6)
    kw = dict(key="k", checkpoint_root=root, file_merging="across", table=table)
    with LocalRunner(Count, parallelism=1, local_dir=str(tmp_path / "l1"), **kw) as r:
        r.run(src)
        r.coordinator.drain()
        base = load_checkpoint(r.coordinator.storage).subtasks[0].keyed
    storage = CheckpointStorage(root)
    frames = {kg: storage.read_range(h.path, h.file_offset + o, n) for h in base for kg, (o, n) in h.offsets.items()}
    with LocalRunner(Count, parallelism=2, local_dir=str(tmp_path / "l2"), **kw) as r:
        acks = r.run_batch(len(src), []).checkpoint.subtasks
        assert [a.stats["snapshot_reused"] for a in acks] == [True, True]
        for i, a in enumerate(acks):
            assert a.keyed and all(h.path.startswith(subtask_dir(i, 2) + "/") for h in a.keyed), a.keyed
            copied = {kg: storage.read_range(h.path, h.file_offset + o, n)
                      for h in a.keyed for kg, (o, n) in h.offsets.items()}
            assert copied and copied == {kg: frames[kg] for kg in copied}, "the base's frames, byte for byte"
        assert sorted(kg for a in acks for h in a.keyed for kg in h.offsets) == sorted(frames)
        again = r.run_batch(len(src) + 1, []).checkpoint.subtasks
        assert [a.keyed for a in again] == [a.keyed for a in acks], "the copies named again, not copied again"
    with LocalRunner(Count, parallelism=3, local_dir=str(tmp_path / "l3"), **kw) as r:
        r.run_batch(r.next_batch_id, src[0])  # restored from the copies, then counted on
    assert counts(root) == expected_counts([*src, src[0]])


@pytest.mark.parametrize("table", ["heap", "lmdb"])
def test_a_rescale_beyond_the_rewrite_budget_names_the_old_segments_until_the_state_moves_on(tmp_path, table):
    """A rescaled subtask copies the restored key groups into its own directory only within the rewrite budget:
    beyond it (here 0) its checkpoints name them in the old subtask's directory, which the registry keeps while
    they do; a restore at yet another parallelism reads them there; once full snapshots wrote the state again
    and the checkpoints naming them are subsumed, the old directory goes."""
    root, src = str(tmp_path / "c"), batches(8)
    merging = FileMergingConfig("across", rewrite_budget=0)
    kw = dict(key="k", checkpoint_root=root, file_merging=merging, table=table, retained=2)
    with LocalRunner(Count, parallelism=1, local_dir=str(tmp_path / "l1"), **kw) as r:
        r.run(src[:4])
    old = _files(root, subtask_dir(0, 1))
    assert old
    with LocalRunner(Count, parallelism=2, local_dir=str(tmp_path / "l2"), **kw) as r:
        acks = r.run_batch(4, []).checkpoint.subtasks
        assert [a.stats["snapshot_reused"] for a in acks] == [True, True]
        assert {h.path for a in acks for h in a.keyed} <= old, "named where they are, not copied"
        r.coordinator.drain()
        assert _files(root, subtask_dir(0, 1)) == old, "kept while checkpoints name them"
    assert counts(root) == expected_counts(src[:4])
    with LocalRunner(Count, parallelism=3, local_dir=str(tmp_path / "l3"), **kw) as r:
        r.run(src)  # from batch 5 (4 ran empty): restored from segments in the P=1 directory, then written again
        r.coordinator.drain()
        meta = load_checkpoint(r.coordinator.storage)
        assert not any(ref.path.startswith(subtask_dir(0, 1)) for ref in meta.segments())
    assert not _files(root, subtask_dir(0, 1)), "the old directory went with the last checkpoint naming it"
    assert counts(root) == expected_counts([*src[:4], *src[5:]])


# -- crashes ------------------------------------------------------------------------------------------------
# the job runs in a process of its own (the venv's python), the same Count job as here: helpers is importable
# there through PYTHONPATH (tests/, where the helpers package is)
TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CRASHING_JOB = """
import os
from helpers.counting import Count, batches
from spate import LocalRunner

def fault(step, batch_id):
    if (step, batch_id) == ({step!r}, {batch}):
        os._exit(17)  # the process dies: open physical files are never closed

r = LocalRunner(Count, key="k", checkpoint_root={root!r}, parallelism=3, file_merging={mode!r}, changelog=True,
                fault_injector=fault, sink=lambda rows, b: None)
r.run(batches(10))
"""


@pytest.mark.parametrize("mode,step", [("across", "after_complete"), ("across", "after_subtask_1"),
                                       ("within", "after_acks")])
def test_crash_with_open_physical_files(tmp_path, mode, step):
    root, src = str(tmp_path / "c"), batches(10)
    code = CRASHING_JOB.format(step=step, batch=5, root=root, mode=mode)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [TESTS, os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 17, proc.stderr
    storage = CheckpointStorage(root)
    for n in list_complete_checkpoints(storage):
        assert verify_checkpoint(storage, load_checkpoint(storage, n)) == [], "no referenced segment lost"
    (tmp_path / "c" / "taskowned" / "dead-worker").mkdir(parents=True)
    (tmp_path / "c" / "taskowned" / "dead-worker" / random_name(".seg")).write_bytes(b"half-written")
    before = {p for p, _ in storage.list_files()}
    with LocalRunner(Count, key="k", checkpoint_root=root, parallelism=2, file_merging=mode, changelog=True) as r:
        referenced = {p for n in list_complete_checkpoints(storage) for p in load_checkpoint(storage, n).files()}
        leftovers = {p for p in before if not is_marker(p)} - referenced
        assert leftovers, "the crash left unreferenced files behind"
        assert not [p for p in leftovers if storage.exists(p)], "cleanup removed them"
        assert not storage.exists("taskowned/dead-worker"), "and the dead worker's directory"
        r.run(src)
    assert counts(root) == expected_counts(src)


def test_a_file_with_one_live_segment_survives_subsumption_of_the_others(tmp_path):
    root = str(tmp_path)
    cfg = FileMergingConfig("across", max_space_amplification=0)
    with LocalRunner(Count, key="k", checkpoint_root=root, parallelism=1, retained=1, file_merging=cfg) as r:
        for n, key in enumerate("abc"):
            r.run_batch(n, [{"k": key}])
        for n in range(3, 6):
            r.run_batch(n, [])  # unchanged: the snapshot of checkpoint 2 is reused
        r.coordinator.drain()
        meta = load_checkpoint(r.coordinator.storage)
        handle = meta.subtasks[0].keyed[0]
        assert handle.file_offset > 0, "the live segment is not the first in its file"
        stats = r.coordinator.registry.stats()
        assert stats.physical_bytes > stats.logical_bytes, "the file also holds dead segments"
    storage = CheckpointStorage(root)
    assert storage.exists(handle.path) and verify_checkpoint(storage, load_checkpoint(storage)) == []
    assert {e.key: e.value for e in keyed_state_entries(storage, load_checkpoint(storage), "count")} == {
        "a": 1, "b": 1, "c": 1}


def test_merged_and_unmerged_checkpoints_restore_each_other(tmp_path):
    root, src = str(tmp_path), batches(12)
    for until, merging in ((3, "across"), (6, False), (9, "within"), (12, "across")):
        with LocalRunner(Count, key="k", checkpoint_root=root, parallelism=1 + until % 4, file_merging=merging,
                         changelog=until > 6) as r:
            r.run(src, until=until)
    assert counts(root) == expected_counts(src)


def test_cli_shows_and_verifies_segments(tmp_path, capsys):
    from spate_tools.cli import main

    root = str(tmp_path)
    with LocalRunner(Count, key="k", checkpoint_root=root, parallelism=2, file_merging="across", changelog=True,
                     sink=lambda rows, b: None) as r:
        r.run(batches(5))
    assert main(["checkpoints", "verify", root]) == 0
    assert main(["checkpoints", "show", root]) == 0
    out = capsys.readouterr().out
    assert "physical files" in out and ".seg@" in out
    meta = load_checkpoint(CheckpointStorage(root))
    ref = max((c.segment for st in meta.subtasks for c in st.changelog), key=lambda x: x.offset)
    full = CheckpointStorage(root).path(ref.path)
    with open(full, "r+b") as f:  # flip one byte inside the last change-file segment
        f.seek(ref.offset + ref.length - 1)
        last = f.read(1)
        f.seek(ref.offset + ref.length - 1)
        f.write(bytes([last[0] ^ 0xFF]))
    assert main(["checkpoints", "verify", root]) == 1
    out = capsys.readouterr().out
    assert "checksum mismatch" in out and f"segment at {ref.offset}" in out
    os.truncate(full, ref.offset + 3)
    assert main(["checkpoints", "verify", root]) == 1
    assert "truncated" in capsys.readouterr().out


@pytest.mark.parametrize("mode", ["within", "across"])
def test_a_materialization_spanning_several_checkpoints_is_kept(tmp_path, monkeypatch, mode):
    """A slow background materialization writes after the pool of the checkpoint it started in closed, and
    is referenced only by a later checkpoint: its segment is held until then, never deleted."""
    import spate.changelog.process_view as clog_reads  # a small table: materialized by a thread

    gate, real = threading.Event(), clog_reads.write_key_groups

    def slow(*args, **kwargs):
        gate.wait(10)
        return real(*args, **kwargs)

    monkeypatch.setattr(clog_reads, "write_key_groups", slow)
    root, src, clock = str(tmp_path), batches(14), [0]
    cfg = ChangelogConfig(materialization_interval_ms=1000, upload=UploadConfig(persist_delay_s=0.0))
    with LocalRunner(Count, key="k", checkpoint_root=root, parallelism=1, retained=1, changelog=cfg,
                     file_merging=mode, clock=lambda: clock[0]) as r:
        started_at = None
        for n, rows in enumerate(src):
            clock[0] = 1000 * n
            result = r.run_batch(n, rows)
            if started_at is None and result.checkpoint.subtasks[0].stats.get("materialization_started"):
                started_at = n
            if started_at is not None and n == started_at + 4:
                gate.set()  # finishes after four more checkpoints completed
                r.subtasks[0].clog.wait_for_materialization()
        assert started_at is not None
        r.coordinator.drain()
        meta = load_checkpoint(r.coordinator.storage)
        assert meta.subtasks[0].keyed, "a checkpoint references the materialized snapshot"
        assert verify_checkpoint(r.coordinator.storage, meta) == []
    assert counts(root) == expected_counts(src)


# -- regressions found in review --------------------------------------------------------------------------
def test_a_checkpoint_whose_commit_reported_an_error_keeps_its_files(tmp_path):
    """The metadata PUT went through but raised (a timeout): the checkpoint is complete, and closing the worker
    must not delete the files it references."""
    root, src = str(tmp_path), batches(4)
    r = LocalRunner(Count, key="k", checkpoint_root=root, parallelism=2, file_merging="across")
    storage, real = r.coordinator.storage, r.coordinator.storage.create_exclusive

    def went_through_then_timed_out(rel, data):
        real(rel, data)
        raise TimeoutError("PUT timed out")

    storage.create_exclusive = went_through_then_timed_out
    with pytest.raises(TimeoutError):
        r.run_batch(0, src[0])
    storage.create_exclusive = real
    r.close()
    assert verify_checkpoint(CheckpointStorage(root), load_checkpoint(CheckpointStorage(root))) == []
    with LocalRunner(Count, key="k", checkpoint_root=root, parallelism=2, file_merging="across") as r2:
        r2.run(src)
    assert counts(root) == expected_counts(src)


class _HalfWriteThenFail:
    """Fault injection: the third write stores half its bytes, then fails (a full disk)."""

    def __init__(self, out):
        self.out, self.calls = out, 0

    def write(self, view):
        self.calls += 1
        if self.calls == 3:
            self.out.write(view[: len(view) // 2])
            raise OSError(28, "No space left on device")
        return self.out.write(view)

    def close(self):
        self.out.close()


def test_a_partly_failed_append_retires_the_file(tmp_path, monkeypatch):
    from spate.filemerging import manager as fm_manager

    real_init = fm_manager.PhysicalFile.__init__

    def init(self, storage, path, checkpoint_id):
        real_init(self, storage, path, checkpoint_id)
        if path.startswith("taskowned/"):
            self._out = _HalfWriteThenFail(self._out)

    monkeypatch.setattr(fm_manager.PhysicalFile, "__init__", init)
    root, src = str(tmp_path), batches(6)
    clog = ChangelogConfig(upload=UploadConfig(persist_delay_s=0.0, next_attempt_delay_s=0.01))
    failures = 0
    with LocalRunner(Count, key="k", checkpoint_root=root, parallelism=1, changelog=clog,
                     file_merging="across") as r:
        for n, rows in enumerate(src):
            try:
                r.run_batch(n, rows)
            except OSError:
                failures += 1
                r.run_batch(n, rows)
    storage = CheckpointStorage(root)
    assert failures and verify_checkpoint(storage, load_checkpoint(storage)) == []
    assert counts(root) == expected_counts(src)


def test_segments_of_a_failed_attempt_stop_holding_their_file(tmp_path):
    """Subtask 1 wrote its snapshot, then the checkpoint failed before it acknowledged: its segment is given up
    at the next attempt, so the file goes instead of staying in use for the life of the process."""
    root, src = str(tmp_path), batches(12)
    fail = {"on": False}

    def fault(step, batch_id):
        if fail["on"] and step == "after_subtask_0":
            fail["on"] = False
            raise RuntimeError("boom")

    with LocalRunner(Count, key="k", checkpoint_root=root, parallelism=2, retained=1, file_merging="within",
                     fault_injector=fault) as r:
        r.run(src, until=3)
        before = _files(root, subtask_dir(1, 2))
        fail["on"] = True
        with pytest.raises(RuntimeError):
            r.run_batch(3, src[3])
        written = _files(root, subtask_dir(1, 2)) - before
        r.run(src)
        r.coordinator.drain()
        assert written and not (written & _files(root, subtask_dir(1, 2))), "the failed attempt's file is gone"
    assert counts(root) == expected_counts(src)


def test_a_late_report_of_a_deleted_file_does_not_delete_it_again():
    reg, discarded = _registry()
    reg.track("taskowned/w/f.seg", 10)
    reg.sweep(["taskowned/w/f.seg"])
    reg.track("taskowned/w/f.seg", 10)  # a worker that has not heard of the completion reports it again
    reg.sweep(["taskowned/w/f.seg"])
    assert discarded == ["taskowned/w/f.seg"] and reg.stats().physical_files == 0


def test_nothing_is_written_after_the_manager_closed(tmp_path):
    from spate.errors import CheckpointError

    manager = FileMergingManager(CheckpointStorage(str(tmp_path)), FileMergingConfig("across"))
    out = manager.private_writer(1)
    out.write(b"before")
    manager.close()
    with pytest.raises(CheckpointError, match="closed"):
        out.write(b"after")


def test_a_worker_never_appends_to_a_file_a_new_drivers_cleanup_deleted(tmp_path):
    """Spark's Python workers outlive a driver: a pooled file written for an attempt of checkpoint 1 that never
    completed is an orphan to the next driver, which deletes it; that driver's checkpoint 1 (the same id) must
    not be appended to it (the segment would land in a deleted file)."""
    root, src = str(tmp_path / "c"), batches(4)

    def fail_after_first_subtask(step, batch_id):
        if (step, batch_id) == ("after_subtask_0", 1):
            raise RuntimeError("the driver dies")

    first = LocalRunner(Count, key="k", checkpoint_root=root, parallelism=2, file_merging="within",
                        fault_injector=fail_after_first_subtask)
    first.run(src, until=1)
    with pytest.raises(RuntimeError):
        first.run_batch(1, src[1])  # subtask 0 wrote its files for checkpoint 1 into the worker's pooled file
    # the first driver is gone, but not this process's file-merging manager (it is the worker's, not the driver's)
    with LocalRunner(Count, key="k", checkpoint_root=root, parallelism=2, file_merging="within") as second:
        second.run(src)
    storage = CheckpointStorage(root)
    for n in list_complete_checkpoints(storage):
        assert verify_checkpoint(storage, load_checkpoint(storage, n)) == [], f"checkpoint {n}"
    assert counts(root) == expected_counts(src)
