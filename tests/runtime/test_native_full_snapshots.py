"""Full snapshots of a large lmdb table as native snapshots (``spate.snapshot.native_write``, opt-in): without the
changelog, a checkpoint's keyed state is an lmdb file of the table's own, linked into a local root; a restore at the
same parallelism copies it to be the table's own file, at another reads it key group by key group; crashes and
rescales lose nothing; TTL'd state and small tables stay on key-group frames."""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from helpers.counting import Count, batches, check_checkpoint, counts, expected_counts
from helpers.faults import CrashOnce, crash_segments
from spate import LocalRunner, Processor, ValueStateDescriptor, load_checkpoint
from spate.checkpoint.inspect import verify_checkpoint
from spate.fs import CheckpointStorage
from spate.runtime.recovery import download
from spate.snapshot.handles import KeyGroupsHandle, NativeSnapshotHandle
from spate.snapshot.native_write import BUILD_PREFIX


def _runner(root: str, local: str, parallelism: int, native_from: int | None = 0, processor=Count,
            **kwargs) -> LocalRunner:
    r = LocalRunner(processor, key="k", checkpoint_root=root, parallelism=parallelism, table="lmdb",
                    local_dir=local, **kwargs)
    r.config = dataclasses.replace(r.config, native_snapshots_from_bytes=native_from)  # subtasks made from now on
    for sub in r.subtasks:  # and those made already
        sub.config = r.config
    return r


def _run(root: str, local: str, parallelism: int, src, until: int, **kwargs) -> None:
    with _runner(root, local, parallelism, **kwargs) as r:
        for n in range(r.next_batch_id, until):
            r.run_batch(n, src[n])


def _keyed(root: str) -> list:
    return [h for st in load_checkpoint(CheckpointStorage(root)).subtasks for h in st.keyed]


def _written_keyed(root: str) -> list:
    """The keyed handles of the subtasks whose snapshot was written, not reused. A reused one names its base's
    handles again, and after a rescale, with file merging, re-writes its share of another subtask's native file
    as key-group frames (``spate.snapshot.relocate``)."""
    return [h for st in load_checkpoint(CheckpointStorage(root)).subtasks if not st.stats.get("snapshot_reused")
            for h in st.keyed]


def _state_rows(root: str) -> list:
    return [st.stats.get("state_rows") for st in load_checkpoint(CheckpointStorage(root)).subtasks]


@pytest.mark.parametrize("merging", [False, True])
def test_a_full_snapshot_of_a_large_lmdb_table_is_its_own_file_linked_into_the_root(tmp_path, monkeypatch, merging):
    root, src = str(tmp_path / "c"), batches(10)
    _run(root, str(tmp_path / "l1"), 2, src, 4, file_merging=merging)
    keyed = _keyed(root)
    assert keyed and all(isinstance(h, NativeSnapshotHandle) and h.file_offset == 0 for h in keyed)
    for h in keyed:
        assert os.stat(os.path.join(root, h.path)).st_nlink == 1, "linked in, the build file's name gone"
    for _dirpath, _dirs, files in os.walk(tmp_path / "l1"):
        assert not [f for f in files if f.startswith(BUILD_PREFIX)], "no build file is left"
    copied: list[str] = []
    copy = download.download_native

    def counted(storage, handle, dest, context=""):
        copied.append(handle.path)
        return copy(storage, handle, dest, context)

    monkeypatch.setattr(download, "download_native", counted)
    _run(root, str(tmp_path / "l2"), 2, src, 6, file_merging=merging)  # an empty local directory
    assert sorted(copied) == sorted(h.path for h in keyed), "each subtask's file copied to be its table's own"
    for dirpath, _dirs, files in os.walk(tmp_path / "l2"):
        assert "data.mdb" in files or not files, dirpath
        assert not [f for f in files if f.startswith("base-")], "not a base: the table's own file"
    assert sum(_state_rows(root)) == len(expected_counts(src[:6])), "the restored table's entry count"
    _run(root, str(tmp_path / "l3"), 3, src, 8, file_merging=merging)  # another parallelism: read key group-wise
    _run(root, str(tmp_path / "l4"), 2, src, 10, file_merging=merging)
    assert counts(root) == expected_counts(src)
    storage = CheckpointStorage(root)
    assert verify_checkpoint(storage, load_checkpoint(storage)) == []


class TtlCount(Processor):
    def open(self, ctx):
        self.count = ctx.state(ValueStateDescriptor("count", default=0, ttl_ms=3_600_000))

    def process(self, key, rows, ctx):
        self.count.update(self.count.value() + len(rows))
        yield {"k": key, "n": self.count.value()}


@pytest.mark.parametrize(("processor", "native_from"), [(TtlCount, 0), (Count, 1 << 40), (Count, None)])
def test_ttl_state_and_small_tables_stay_on_key_group_frames(tmp_path, processor, native_from):
    """TTL'd state: a snapshot in frames leaves its expired entries out (and purges them); a native file could
    not. A table below the threshold (or with native snapshots off) is cheaper in frames."""
    root = str(tmp_path / "c")
    _run(root, str(tmp_path / "l"), 2, batches(3), 3, native_from=native_from, processor=processor)
    keyed = _keyed(root)
    assert keyed and all(isinstance(h, KeyGroupsHandle) for h in keyed)


CRASH_STEPS = [None, "after_begin", "after_subtask_0", "after_acks", "after_complete"]
EXAMPLES = max(1, int(os.environ.get("SPATE_MODEL_EXAMPLES", "40")) // 5)


@settings(max_examples=EXAMPLES, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 4), st.integers(1, 4), st.sampled_from(CRASH_STEPS)), min_size=1,
                max_size=4), st.integers(5, 40), st.booleans())
@example([(1, 2, None), (4, 1, None)], 22, True)  # a subtask reuses its share of a native file after a rescale
def test_counts_survive_crashes_and_rescales_with_native_full_snapshots(segments, keys, merging):
    """Property: runs at random parallelisms (1..4), each for a few batches, some ending in a crash at a protocol
    step, and a last run at parallelism 2, every full snapshot native: the last checkpoint's counts are the
    input's, and every checkpoint's entry counts (where known) are the keys seen."""
    src = batches(2 * len(segments) + 8, keys)
    root, local = tempfile.mkdtemp(prefix="native-full-"), tempfile.mkdtemp(prefix="native-full-local-")
    try:
        done = 0

        def runner(parallelism: int, fault: CrashOnce) -> LocalRunner:
            return _runner(root, local, parallelism, fault_injector=fault, file_merging=merging)

        for done in crash_segments(runner, segments, src):
            if done:
                assert all(isinstance(h, NativeSnapshotHandle) for h in _written_keyed(root))
                check_checkpoint(root, src[:done])
        assert done == len(src)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(local, ignore_errors=True)
