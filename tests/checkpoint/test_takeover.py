"""Never lose, never leak: atomic take-over, commits conditional on the epoch, cleanup that touches only
spate's own files (issue 9, items 1-4)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from helpers.counting import Count, batches, counts, expected_counts
from spate import CheckpointStorage, Coordinator, FencedError, LocalRunner, load_checkpoint, verify_checkpoint
from spate.checkpoint.coordinator import list_complete_checkpoints
from spate.checkpoint.epochs import EpochLog
from spate.checkpoint.metadata import QueryInfo
from spate.errors import CheckpointError, CorruptFileError
from spate.frames import FrameKind, read_single_frame
from spate.layout import random_name


def _files(root: str) -> dict[str, bytes]:
    out = {}
    for directory, _dirs, names in os.walk(root):
        for name in names:
            full = os.path.join(directory, name)
            out[os.path.relpath(full, root)] = b"<link>" if os.path.islink(full) else Path(full).read_bytes()
    return out


def _run(root: str, until: int, parallelism: int = 2, **kw) -> None:
    with LocalRunner(Count, key="k", checkpoint_root=root, parallelism=parallelism, **kw) as r:
        r.run(batches(until + 1), until=until)


# -- item 1: the take-over is a compare-and-set -------------------------------------------------------------
def test_two_drivers_reading_the_same_epoch_cannot_both_own_it(tmp_path):
    root = str(tmp_path / "c")
    _run(root, 2)
    storage = CheckpointStorage(root)
    stale, stale_query = EpochLog(storage).read(), QueryInfo.read(storage)
    first, second = Coordinator(root), Coordinator(root)
    first.start(2)
    before = _files(root)
    second.epochs.read = lambda: stale  # both read the root before either claimed
    second.take_over._query_file = lambda savepoint, *settings: stale_query  # type: ignore[method-assign]
    with pytest.raises(FencedError, match="same time"):
        second.start(2)
    assert _files(root) == before, "the loser wrote and deleted nothing"
    assert first.query is not None and first.query.epoch == stale.latest + 1
    first.begin(2, 2)


def test_a_later_start_fences_the_running_driver_before_its_commit(tmp_path):
    root, src = str(tmp_path / "c"), batches(4)
    old = LocalRunner(Count, key="k", checkpoint_root=root, parallelism=2)
    old.run(src, until=2)
    new = LocalRunner(Count, key="k", checkpoint_root=root, parallelism=3)
    with pytest.raises(FencedError):
        old.run_batch(2, src[2])
    new.run(src)
    new.close()
    old.close()
    assert counts(root) == expected_counts(src)


# -- item 2: cleanup deletes only what it can prove is an orphan --------------------------------------------
def test_checkpoint_completed_while_a_new_driver_starts_is_kept(tmp_path):
    """The old driver completes a checkpoint after the new driver began starting, before its claim: the new
    driver lists after claiming, so it resumes from that checkpoint and deletes none of its files."""
    root, src = str(tmp_path / "c"), batches(5)
    old = LocalRunner(Count, key="k", checkpoint_root=root, parallelism=2, retained=1)
    old.run(src, until=2)
    new = Coordinator(root, retained=1)
    claim = new.epochs.claim

    def old_driver_commits_first(after: int) -> int:
        old.run_batch(2, src[2])  # its fence check passes: nobody claimed yet
        return claim(after)

    new.epochs.claim = old_driver_commits_first  # type: ignore[method-assign]
    base = new.start(3)
    assert base is not None and base.checkpoint_id == 2
    storage = CheckpointStorage(root)
    assert verify_checkpoint(storage, load_checkpoint(storage, 2)) == []
    new.close()
    old.close()
    with LocalRunner(Count, key="k", checkpoint_root=root, parallelism=3) as r:
        assert r.next_batch_id == 3
        r.run(src)
    assert counts(root) == expected_counts(src)


def test_root_that_lost_every_checkpoint_does_not_restart_from_batch_0(tmp_path):
    root = str(tmp_path / "c")
    _run(root, 3)
    storage = CheckpointStorage(root)
    for n in list_complete_checkpoints(storage):
        os.unlink(storage.path(f"chk-{n}/_metadata"))
    before = _files(root)
    with pytest.raises(CheckpointError, match="had complete checkpoints"):
        LocalRunner(Count, key="k", checkpoint_root=root, parallelism=2)
    lost = set(before) - set(_files(root))
    assert not lost, f"a refused start deleted {lost}"


# -- item 3: the commit is conditional on the epoch ---------------------------------------------------------
def _old_driver_commits_after_take_over(root: str, src: list) -> tuple[LocalRunner, Coordinator]:
    """The old driver passes its fence check; the new driver then takes over completely (claim, seal,
    cleanup); then the old driver writes its metadata."""
    old = LocalRunner(Count, key="k", checkpoint_root=root, parallelism=2, retained=1)
    old.run(src, until=2)
    check, new = old.coordinator.epochs.check, Coordinator(root, retained=1)

    def new_driver_takes_over_after_check(epoch: int) -> None:
        check(epoch)
        if new.query is None:
            new.start(3)

    old.coordinator.epochs.check = new_driver_takes_over_after_check  # type: ignore[method-assign]
    with pytest.raises(FencedError):
        old.run_batch(2, src[2])
    old.close()
    return old, new


def test_commit_after_take_over_is_fenced_and_never_restored(tmp_path):
    root, src = str(tmp_path / "c"), batches(5)
    _old, new = _old_driver_commits_after_take_over(root, src)
    storage = CheckpointStorage(root)
    assert storage.exists("chk-2/_metadata"), "the fenced driver's metadata landed"
    assert list_complete_checkpoints(storage) == [1], "but it does not count"
    new.close()
    with LocalRunner(Count, key="k", checkpoint_root=root, parallelism=2) as r:  # no MissingFileError
        assert r.next_batch_id == 2
        r.run(src)
    assert counts(root) == expected_counts(src)
    for n in list_complete_checkpoints(storage):
        assert verify_checkpoint(storage, load_checkpoint(storage, n)) == []


def test_new_driver_replaces_a_fenced_commit_of_the_same_batch(tmp_path):
    root, src = str(tmp_path / "c"), batches(5)
    _old, new = _old_driver_commits_after_take_over(root, src)
    new.close()
    with LocalRunner(Count, key="k", checkpoint_root=root, parallelism=3) as r:
        r.run(src, until=3)  # batch 2 again, under the new epoch: chk-2/_metadata is replaced
    storage = CheckpointStorage(root)
    meta = load_checkpoint(storage, 2)
    assert meta.parallelism == 3 and list_complete_checkpoints(storage)[-1] == 2
    with LocalRunner(Count, key="k", checkpoint_root=root, parallelism=1) as r:
        r.run(src)
    assert counts(root) == expected_counts(src)


# -- item 4: only spate's files, never through links -------------------------------------------------------
def test_non_empty_directory_that_is_not_a_root_is_refused_untouched(tmp_path):
    root = tmp_path / "mine"
    (root / "photos").mkdir(parents=True)
    (root / "photos" / "cat.jpg").write_bytes(b"meow")
    (root / "notes.txt").write_text("keep me")
    before = _files(str(root))
    with pytest.raises(CheckpointError, match="not a spate checkpoint root"):
        LocalRunner(Count, key="k", checkpoint_root=str(root), parallelism=2)
    assert _files(str(root)) == before


def test_cleanup_deletes_only_names_of_spate_layout(tmp_path):
    root = tmp_path / "c"
    _run(str(root), 2)
    foreign = {"notes.txt": b"mine", "shared/README": b"mine too", "chk-0/report.csv": b"a,b",
               "staged/1/keep.out": b"not a spate name", "taskowned/x/y.seg": b"not a spate name"}
    for rel, data in foreign.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    _run(str(root), 5, parallelism=3, retained=1)
    files = _files(str(root))
    assert {rel: files.get(rel) for rel in foreign} == foreign


def test_cleanup_never_follows_links_out_of_the_root(tmp_path):
    root, outside = tmp_path / "c", tmp_path / "outside"
    _run(str(root), 2)
    outside.mkdir()
    victims = {random_name(".seg"): b"x", random_name(".kg"): b"y"}
    for name, data in victims.items():
        (outside / name).write_bytes(data)
    (root / "taskowned").mkdir(exist_ok=True)
    os.symlink(outside, root / "taskowned" / "0123456789abcdef", target_is_directory=True)
    lone = outside / random_name(".kg")
    lone.write_bytes(b"z")
    os.makedirs(root / "shared" / "subtask-0-2", exist_ok=True)
    os.symlink(lone, root / "shared" / "subtask-0-2" / lone.name)
    _run(str(root), 4, parallelism=3, retained=1)
    assert {p.name for p in outside.iterdir()} == {*victims, lone.name}
    assert os.path.islink(root / "taskowned" / "0123456789abcdef")


def test_a_handle_through_a_link_is_a_corrupt_file(tmp_path):
    root, outside = tmp_path / "c", tmp_path / "outside"
    _run(str(root), 2)
    storage = CheckpointStorage(str(root))
    rel = next(iter(load_checkpoint(storage).files()))
    outside.mkdir()
    (outside / "copy").write_bytes((root / rel).read_bytes())
    os.unlink(root / rel)
    os.symlink(outside / "copy", root / rel)
    with pytest.raises(CorruptFileError, match="symbolic link"):
        storage.read(rel)
    with pytest.raises(CorruptFileError, match="symbolic link"), \
            LocalRunner(Count, key="k", checkpoint_root=str(root), parallelism=3) as r:
        r.run(batches(3))
    assert (outside / "copy").exists()


def test_documented_epoch_seal_is_what_a_take_over_writes(tmp_path):
    root = str(tmp_path / "c")
    _run(root, 2)
    coordinator = Coordinator(root)
    coordinator.start(2)
    doc = (Path(__file__).resolve().parents[2] / "docs" / "formats.md").read_text()
    example = re.search(r"## Epochs.*?```json\n(.*?)\n```", doc, re.S).group(1)  # type: ignore[union-attr]
    storage = CheckpointStorage(root)
    payload = read_single_frame(storage.read("_epochs/0000000002.seal"), "seal", FrameKind.EPOCH)
    assert payload.decode() == example
    assert sorted(p for p, _ in storage.list_files("_epochs")) == [
        "_epochs/0000000001", "_epochs/0000000001.completed", "_epochs/0000000001.seal", "_epochs/0000000002",
        "_epochs/0000000002.seal"]


# -- three drivers, paused drivers (review findings) --------------------------------------------------------
def _passes_next_fence_check(runner: LocalRunner) -> None:
    """The driver passed its pre-commit fence check just before a take-over: that one check is skipped."""
    real, calls = runner.coordinator.epochs.check, []

    def check(epoch: int) -> None:
        calls.append(epoch)
        if len(calls) > 1:
            real(epoch)

    runner.coordinator.epochs.check = check  # type: ignore[method-assign]


def test_late_seal_of_a_fenced_driver_cannot_roll_back_a_resumed_checkpoint(tmp_path, monkeypatch):
    """D2 claims and lists but seals late; D1 commits 3 meanwhile; D3 claims, sees 3 and resumes after it.
    D2's seal must not then make checkpoint 3 invisible."""
    root, src = str(tmp_path / "c"), batches(6)
    _run(root, 3)
    d1 = LocalRunner(Count, key="k", checkpoint_root=root, parallelism=2)
    _passes_next_fence_check(d1)
    seal, resumed, hooked = EpochLog.seal, [], []

    def d2_seals_late(self, s):
        if s.epoch == 3 and not hooked:
            hooked.append(s)
            with pytest.raises(FencedError):
                d1.run_batch(3, src[3])  # its metadata lands; its second check finds it fenced
            with LocalRunner(Count, key="k", checkpoint_root=root, parallelism=2) as d3:
                resumed.append(d3.next_batch_id)
        return seal(self, s)

    monkeypatch.setattr(EpochLog, "seal", d2_seals_late)
    with pytest.raises(FencedError):
        LocalRunner(Count, key="k", checkpoint_root=root, parallelism=2)  # D2
    monkeypatch.setattr(EpochLog, "seal", seal)
    d1.close()
    assert resumed == [4]
    with LocalRunner(Count, key="k", checkpoint_root=root, parallelism=3) as d4:
        assert d4.next_batch_id == 4, "checkpoint 3 still counts"
        d4.run(src)
    assert counts(root) == expected_counts(src)


def test_replacing_a_fenced_commit_never_deletes_a_newer_drivers_commit(tmp_path):
    root, src = str(tmp_path / "c"), batches(6)
    _run(root, 3)
    d = LocalRunner(Count, key="k", checkpoint_root=root, parallelism=2)
    e = LocalRunner(Count, key="k", checkpoint_root=root, parallelism=2)
    _passes_next_fence_check(d)
    with pytest.raises(FencedError):
        d.run_batch(3, src[3])  # a fenced commit of 3, for E to replace
    d.close()
    decide = e.coordinator.take_over.fenced_commit

    def newer_driver_commits_first(checkpoint_id: int) -> bool:
        decision = decide(checkpoint_id)
        with LocalRunner(Count, key="k", checkpoint_root=root, parallelism=2) as f:
            f.run_batch(3, src[3])
        return decision

    e.coordinator.take_over.fenced_commit = newer_driver_commits_first  # type: ignore[method-assign]
    with pytest.raises(FencedError):
        e.run_batch(3, src[3])
    e.close()
    with LocalRunner(Count, key="k", checkpoint_root=root, parallelism=2) as g:
        assert g.next_batch_id == 4, "F's checkpoint 3 survived"
        g.run(src)
    assert counts(root) == expected_counts(src)


def test_paused_old_driver_never_empties_a_newer_drivers_directories(tmp_path):
    """An old driver at parallelism 2 retires the parallelism-4 directories in the background; it pauses, and
    a newer driver at parallelism 4 writes into directories of the same names before the old one resumes."""
    root, src = str(tmp_path / "c"), batches(10)
    _run(root, 2, parallelism=4, retained=1)
    old = LocalRunner(Count, key="k", checkpoint_root=root, parallelism=2, retained=1)
    paused: list = []

    def paused_worker(fn, *args) -> None:  # fault injection: the old driver's janitor gets no CPU for a while
        paused.append((fn, args))

    old.coordinator.janitor._submit = paused_worker  # type: ignore[method-assign]
    old.run(src, until=6)
    with LocalRunner(Count, key="k", checkpoint_root=root, parallelism=4, retained=3) as new:
        new.run(src, until=9)
    assert paused, "the old driver left background deletions"
    for fn, args in paused:  # the old driver resumes
        fn(*args)
    with LocalRunner(Count, key="k", checkpoint_root=root, parallelism=4) as r:
        assert r.next_batch_id == 9
        r.run(src)
    assert counts(root) == expected_counts(src)


def test_nothing_is_written_through_a_link_planted_in_the_root(tmp_path):
    root, outside = tmp_path / "c", tmp_path / "outside"
    _run(str(root), 2)
    outside.mkdir()
    os.symlink(outside, root / "shared" / "subtask-0-3", target_is_directory=True)
    with pytest.raises(CheckpointError, match="symbolic link"), \
            LocalRunner(Count, key="k", checkpoint_root=str(root), parallelism=3) as r:
        r.run(batches(4))
    assert list(outside.iterdir()) == [], "nothing was written outside the root"
    assert list_complete_checkpoints(CheckpointStorage(str(root))) == [0, 1]
