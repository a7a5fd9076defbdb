"""Change-set lists: a checkpoint's metadata stays the same size however long the log since the last
materialization grows, and every reader (restore, rescale, savepoint, verify) sees the whole log."""

from __future__ import annotations

import os

import pytest

from spate import LocalRunner, Processor, ValueStateDescriptor, keyed_state_entries, load_checkpoint, verify_checkpoint
from spate.changelog.state import ChangelogConfig
from spate.changelog.upload import UploadConfig
from spate.checkpoint.changelists import INLINE_CHANGE_SETS, ChangeListRef, extend_lists, reused_lists
from spate.errors import CorruptFileError
from spate.fs import CheckpointStorage
from spate.layout import CHANGE_LIST_SUFFIX, metadata_path
from spate.snapshot.handles import ChangeSetHandle

COUNT = ValueStateDescriptor("count", default=0)
NEVER = ChangelogConfig(materialization_interval_ms=10**12, materialize_after_change_sets=10**6,
                        upload=UploadConfig(persist_delay_s=0.0))


class Count(Processor):
    def open(self, ctx):
        self.count = ctx.state(COUNT)

    def process(self, key, rows, ctx):
        self.count.update(self.count.value() + len(rows))


def batch(n: int) -> list[dict]:
    return [{"k": f"k{(n * 7 + i) % 40}"} for i in range(5)]


def expected(batches: int) -> dict[str, int]:
    out: dict[str, int] = {}
    for n in range(batches):
        for row in batch(n):
            out[row["k"]] = out.get(row["k"], 0) + 1
    return out


def runner(root: str, parallelism: int = 2, **kw) -> LocalRunner:
    return LocalRunner(Count, key="k", checkpoint_root=root, parallelism=parallelism, changelog=NEVER,
                       clock=lambda: 0, **kw)


def state_of(root: str) -> dict[str, int]:
    storage = CheckpointStorage(root)
    return {e.key: e.value for e in keyed_state_entries(storage, load_checkpoint(storage), "count")}


def test_metadata_stays_the_same_size_as_the_log_grows(tmp_path):
    root = str(tmp_path / "r")
    storage = CheckpointStorage(root)
    sizes = {}
    with runner(root, retained=2) as r:
        for n in range(300):
            r.run_batch(n, batch(n))
            sizes[n] = len(storage.read(metadata_path(n)))
        log = r.coordinator.latest.subtasks[0]
    assert len(log.changelog) == 300, "no materialization: every change set since the start is in the log"
    assert sum(ref.count for ref in log.changelog_lists) > len(log.changelog) - INLINE_CHANGE_SETS
    assert len(log.changelog_lists) <= 5, [ref.count for ref in log.changelog_lists]
    assert sizes[299] <= 2 * sizes[10], (sizes[10], sizes[299])
    files = [p for p, _ in storage.list_files() if p.endswith(CHANGE_LIST_SUFFIX)]
    referenced = {ref.path for st in load_checkpoint(storage).subtasks for ref in st.changelog_lists}
    previous = {ref.path for st in load_checkpoint(storage, 298).subtasks for ref in st.changelog_lists}
    assert set(files) == referenced | previous, "lists no retained checkpoint references are deleted"
    assert state_of(root) == expected(300)
    assert verify_checkpoint(storage, load_checkpoint(storage)) == []


@pytest.mark.parametrize("parallelism", [1, 3])
def test_restore_reads_the_lists_at_any_parallelism(tmp_path, parallelism):
    root = str(tmp_path / "r")
    with runner(root) as r:
        r.run([batch(n) for n in range(40)])
    with runner(root, parallelism=parallelism, local_dir=str(tmp_path / "fresh")) as r:
        r.run_batch(40, batch(40))
        r.run_batch(41, batch(41))
    assert state_of(root) == expected(42)


def test_a_savepoint_carries_the_lists(tmp_path):
    root, target = str(tmp_path / "r"), str(tmp_path / "sp")
    with runner(root) as r:
        r.run([batch(n) for n in range(40)])
        uri = r.coordinator.savepoint(target_uri=target)
    assert any(p.endswith(CHANGE_LIST_SUFFIX) for p, _ in CheckpointStorage(uri).list_files())
    other = str(tmp_path / "other")
    with runner(other, restore_from=uri) as r:
        r.run_batch(40, batch(40))
    assert state_of(other) == expected(41)


def test_a_damaged_or_missing_list_is_named(tmp_path):
    root = str(tmp_path / "r")
    with runner(root) as r:
        r.run([batch(n) for n in range(40)])
    storage = CheckpointStorage(root)
    ref = load_checkpoint(storage).subtasks[0].changelog_lists[0]
    data = storage.read(ref.path)
    with open(storage.path(ref.path), "wb") as f:
        f.write(data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.raises(CorruptFileError, match=ref.path.rpartition("/")[2]):
        load_checkpoint(storage)
    os.remove(storage.path(ref.path))
    with pytest.raises((CorruptFileError, OSError), match=ref.path.rpartition("/")[2]):
        load_checkpoint(storage)


def _handles(n: int, log: str = "l") -> list[ChangeSetHandle]:
    return [ChangeSetHandle(f"shared/changelog/{i}.chg", log, i, {0: (0, 10)}) for i in range(n)]


def test_lists_grow_like_a_binary_counter_and_are_reused_while_the_log_starts_with_them(tmp_path):
    storage = CheckpointStorage(str(tmp_path))
    log = _handles(7 * INLINE_CHANGE_SETS + 3)
    lists = extend_lists(storage, log, [])
    assert [r.count // INLINE_CHANGE_SETS for r in lists] == [4, 2, 1]
    longer = [*log, *_handles(INLINE_CHANGE_SETS, "m")]
    assert reused_lists(longer, lists, log) == lists
    again = extend_lists(storage, longer, lists)
    assert [r.count // INLINE_CHANGE_SETS for r in again] == [8], "7 + 1 lists of 16 merge into one of 128"
    moved = [*log[:5], ChangeSetHandle("elsewhere.seg", "l", 5, {0: (0, 10)}), *log[6:]]
    assert reused_lists(moved, lists, log) == [], "a re-written change set in the first list: none reused"
    assert reused_lists(log[:INLINE_CHANGE_SETS * 4], lists, log) == lists[:1]
    assert isinstance(lists[0], ChangeListRef)
