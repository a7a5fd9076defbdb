"""Coordinator invariants (docs/formats.md: "Atomicity, completeness and retention", "Epochs"): completeness,
retention and deletion, orphans, attempt-unique acks, fencing, max parallelism, clear errors for missing or
corrupt files, savepoints, the shared registry."""

from __future__ import annotations

import dataclasses
import os
import shutil

import pytest

from helpers.counting import Count, batches, counts, expected_counts
from spate import (
    CheckpointStorage,
    Coordinator,
    CorruptFileError,
    FencedError,
    IncompatibleStateError,
    LocalRunner,
    MissingFileError,
    load_checkpoint,
)
from spate.checkpoint.coordinator import list_complete_checkpoints
from spate.filemerging.registry import FileRegistry
from spate.layout import random_name
from spate.segments import FileRef


def test_complete_iff_metadata_and_retention_deletes_unreferenced_files(tmp_path):
    root = str(tmp_path / "c")
    src = batches(8)
    with LocalRunner(Count, key="k", checkpoint_root=root, parallelism=3, retained=2) as r:
        r.run(src)
    storage = CheckpointStorage(root)
    assert list_complete_checkpoints(storage) == [6, 7]
    referenced = set()
    for n in (6, 7):
        referenced |= set(load_checkpoint(storage, n).files())
    on_disk = {p for p, _ in storage.list_files() if not p.startswith("_epochs/")} - {
        "_query", "chk-6/_metadata", "chk-7/_metadata", "_delivered"}
    assert on_disk == referenced, "only files of retained checkpoints remain"
    assert counts(root) == expected_counts(src)


def test_idle_subtask_reuses_its_file_which_survives_subsumption(tmp_path):
    root = str(tmp_path / "c")
    hot = [[{"k": "hot"}] for _ in range(6)]
    with LocalRunner(Count, key="k", checkpoint_root=root, parallelism=4, retained=1) as r:
        results = r.run([[{"k": f"u{i}"} for i in range(40)], *hot])
    first = {h.path for st in results[0].checkpoint.subtasks for h in st.keyed}
    last = {h.path for st in results[-1].checkpoint.subtasks for h in st.keyed}
    assert len(first & last) >= 2, "subtasks without changes keep referencing their first snapshot"
    storage = CheckpointStorage(root)
    assert all(storage.exists(p) for p in last)
    assert counts(root)["hot"] == 6 and counts(root)["u3"] == 1


@pytest.mark.parametrize("step", ["after_begin", "after_subtask_1", "after_acks"])
def test_crash_before_metadata_leaves_previous_checkpoint_and_orphans_are_removed(tmp_path, step):
    root = str(tmp_path / "c")
    src = batches(4)

    def fault(s, b):
        if (s, b) == (step, 2):
            raise RuntimeError("crash")

    r = LocalRunner(Count, key="k", checkpoint_root=root, parallelism=2, fault_injector=fault)
    r.run(src, until=2)
    with pytest.raises(RuntimeError):
        r.run_batch(2, src[2])
    r.close()
    storage = CheckpointStorage(root)
    assert list_complete_checkpoints(storage) == [0, 1]
    leftover, attempt = f"shared/subtask-0-2/{random_name('.kg')}", f"chk-9/{random_name('.op')}"
    storage.write(leftover, b"half-written")  # e.g. a hedged upload that lost
    storage.write(attempt, b"from an attempt that never completed")
    with LocalRunner(Count, key="k", checkpoint_root=root, parallelism=2) as r2:
        assert not storage.exists(leftover) and not storage.exists(attempt)
        r2.run(src)
    assert counts(root) == expected_counts(src)


def test_crash_after_metadata_before_subsumption(tmp_path):
    """The metadata is the commit point: a crash right after it still counts the checkpoint as complete."""
    root = str(tmp_path / "c")
    src = batches(5)
    r = LocalRunner(Count, key="k", checkpoint_root=root, parallelism=2, retained=1)
    r.run(src, until=2)
    original = r.coordinator._subsume  # noqa: SLF001

    def crash() -> None:
        raise RuntimeError("crash after metadata")

    r.coordinator._subsume = crash  # noqa: SLF001
    with pytest.raises(RuntimeError):
        r.run_batch(2, src[2])
    r.coordinator._subsume = original  # noqa: SLF001
    r.close()
    with LocalRunner(Count, key="k", checkpoint_root=root, parallelism=2, retained=1) as r2:
        assert r2.next_batch_id == 3
        assert list_complete_checkpoints(CheckpointStorage(root)) == [2]
        r2.run(src)
    assert counts(root) == expected_counts(src)


def test_exactly_one_ack_per_subtask(tmp_path):
    root = str(tmp_path / "c")
    r = LocalRunner(Count, key="k", checkpoint_root=root, parallelism=2)
    coord = r.coordinator
    plans = coord.begin(0, 2, 0)
    acks = [r.subtasks[p.index].run(p, []).ack for p in plans]
    retry = r.subtasks[0].run(plans[0], []).ack  # a retried attempt of subtask 0
    assert coord.acknowledge(acks[0]) and coord.acknowledge(acks[1])
    assert not coord.acknowledge(retry)
    meta = coord.complete(0)
    coord.drain()  # deletions run in the background
    assert retry.files and all(not CheckpointStorage(root).exists(p) for p in retry.files), \
        "rejected attempt's files deleted once the checkpoint completed"
    assert meta.subtasks[0].operator == acks[0].operator
    stale = r.subtasks[1].run(coord.begin(1, 2, 0)[1], []).ack
    stale.checkpoint_id = 0
    assert not coord.acknowledge(stale), "an ack for another checkpoint is refused"
    r.close()


def test_second_driver_fences_the_first(tmp_path):
    root = str(tmp_path / "c")
    src = batches(3)
    first = LocalRunner(Count, key="k", checkpoint_root=root, parallelism=2)
    first.run(src, until=1)
    second = LocalRunner(Count, key="k", checkpoint_root=root, parallelism=2)
    with pytest.raises(FencedError, match="another driver"):
        first.run_batch(1, src[1])
    second.run(src)
    first.close()
    second.close()
    assert counts(root) == expected_counts(src)


def test_max_parallelism_is_fixed_and_bounds_parallelism(tmp_path):
    root = str(tmp_path / "c")
    with LocalRunner(Count, key="k", checkpoint_root=root, parallelism=2, max_parallelism=16) as r:
        r.run(batches(1))
    with pytest.raises(IncompatibleStateError, match=r"max parallelism 16.*cannot change"):
        LocalRunner(Count, key="k", checkpoint_root=root, parallelism=2, max_parallelism=32)
    with pytest.raises(IncompatibleStateError, match="at most 16"):
        LocalRunner(Count, key="k", checkpoint_root=root, parallelism=17)
    with LocalRunner(Count, key="k", checkpoint_root=root, parallelism=16) as r:  # adopts 16
        assert r.max_parallelism == 16
        r.run(batches(3))
    assert counts(root) == expected_counts(batches(3))


def test_missing_and_corrupt_state_files_name_checkpoint_and_file(tmp_path):
    root = str(tmp_path / "c")
    with LocalRunner(Count, key="k", checkpoint_root=root, parallelism=2) as r:
        r.run(batches(2))
    storage = CheckpointStorage(root)
    path = load_checkpoint(storage).subtasks[1].keyed[0].path
    full = storage.path(path)
    with open(full, "r+b") as f:
        f.seek(-1, os.SEEK_END)
        last = f.read(1)[0]
        f.seek(-1, os.SEEK_END)
        f.write(bytes([last ^ 0x01]))
    with LocalRunner(Count, key="k", checkpoint_root=root, parallelism=3) as r, \
            pytest.raises(CorruptFileError, match=rf"{path}.*checkpoint 1.*checksum mismatch"):
        r.run(batches(3))
    os.remove(full)
    with LocalRunner(Count, key="k", checkpoint_root=root, parallelism=3) as r, \
            pytest.raises(MissingFileError, match=rf"{path}.*checkpoint 1.*missing"):
        r.run(batches(3))
    assert list_complete_checkpoints(storage) == [0, 1], "a failed restore deletes nothing"


def test_corrupt_metadata_is_refused_at_start(tmp_path):
    root = str(tmp_path / "c")
    with LocalRunner(Count, key="k", checkpoint_root=root, parallelism=1) as r:
        r.run(batches(2))
    meta = os.path.join(root, "chk-1", "_metadata")
    with open(meta, "r+b") as f:
        f.seek(30)
        f.write(b"#")
    with pytest.raises(CorruptFileError, match="chk-1/_metadata"):
        LocalRunner(Count, key="k", checkpoint_root=root, parallelism=1)


def test_savepoint_is_relocatable_and_restores_at_another_parallelism(tmp_path):
    root = str(tmp_path / "c")
    src = batches(6)
    with LocalRunner(Count, key="k", checkpoint_root=root, parallelism=2) as r:
        r.run(src, until=3)
        sp = r.savepoint(str(tmp_path / "sp"))
    moved = str(tmp_path / "elsewhere" / "sp")
    shutil.move(sp, moved)
    shutil.rmtree(root)
    new_root = str(tmp_path / "new")
    with LocalRunner(Count, key="k", checkpoint_root=new_root, parallelism=5, restore_from=moved) as r:
        assert r.next_batch_id == 3
        r.run(src)
    assert counts(new_root) == expected_counts(src)
    new_storage = CheckpointStorage(new_root)
    for n in list_complete_checkpoints(new_storage):
        for rel in load_checkpoint(new_storage, n).files():
            assert new_storage.exists(rel), "checkpoints after a savepoint restore reference only their own root"


def test_registry_scenario_9(tmp_path):
    """A logical file's key is its location, so registering it again (a later checkpoint reusing it) keeps
    the one entry; unregister_unused(1) deletes what was last used by checkpoint 0."""
    discarded = []
    reg = FileRegistry(discarded.append)
    original = FileRef("shared/original", 0, 10)
    reg.register(original, 0)
    reg.register(FileRef("shared/original", 0, 10), 0)
    assert len(reg) == 1 and discarded == []
    reg.register(FileRef("shared/other", 0, 5), 1)
    reg.unregister_unused(1)
    assert discarded == ["shared/original"] and "shared/other" in reg and "shared/original" not in reg


def test_coordinator_requires_acks_from_every_subtask(tmp_path):
    c = Coordinator(str(tmp_path / "c"))
    c.start(2)
    c.begin(0, 2)
    with pytest.raises(Exception, match=r"lacks acks of subtasks \[0, 1\]"):
        c.complete(0)


def test_metadata_paths_cannot_point_outside_the_root(tmp_path):
    root = str(tmp_path / "c")
    with LocalRunner(Count, key="k", checkpoint_root=root, parallelism=1) as r:
        r.run(batches(1))
    storage = CheckpointStorage(root)
    meta = load_checkpoint(storage)
    meta.subtasks[0].keyed[0] = dataclasses.replace(meta.subtasks[0].keyed[0], path="../../etc/passwd")
    storage.replace("chk-0/_metadata", meta.to_bytes())
    with pytest.raises(CorruptFileError, match=r"chk-0/_metadata.*escapes the checkpoint root"):
        load_checkpoint(storage)
