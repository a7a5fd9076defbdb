"""Native snapshots of an lmdb table (``spate.snapshot.native``) as the changelog's materialization: the reader
process writes the key groups it reads into an lmdb file of their own, its bytes are checked on every read, it is
restored by download at the subtask's own key groups and key group by key group elsewhere, and a restore from it
and its log is the state a sequential replay gives."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import re
import shutil
import tempfile
import threading
import zlib
from pathlib import Path
from types import SimpleNamespace

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers.counting import Count, batches, check_checkpoint, counts, expected_counts
from helpers.faults import CrashOnce, crash_segments
from spate import LocalRunner, load_checkpoint
from spate.changelog import process_view
from spate.changelog.materializer_protocol import Start, send
from spate.changelog.process_view import MaterializationReads, NativePace, ProcessView
from spate.changelog.restore import restore_keyed_state
from spate.changelog.state import ChangelogConfig, ChangelogKeyedState
from spate.changelog.upload import UploadConfig
from spate.checkpoint.inspect import verify_checkpoint
from spate.errors import CheckpointError, CorruptFileError, DiskFullError, IncompatibleStateError
from spate.fs import CheckpointStorage, LocalStorage
from spate.pacing import Pace
from spate.runtime.recovery import download
from spate.segments import WholeFileWriter
from spate.snapshot import native_write
from spate.snapshot.handles import KeyGroupsHandle, NativeSnapshotHandle, keyed_handle
from spate.snapshot.keyed import SnapshotScope
from spate.snapshot.native import NativeSource, download_native, verify_native
from spate.snapshot.native_write import BUILD_PREFIX, table_bytes, write_native_snapshot
from spate.state.descriptors import ValueStateDescriptor
from spate.state.heap import HeapTable
from spate.state.keyed import KeyedStateBackend
from spate.state.lmdb_digest import table_digest
from spate.state.lmdb_readonly import ReadOnlyTable
from spate.state.lmdb_table import LmdbTable
from spate.state.overlay import Base, OverlayTable, SharedReaders

NOW = UploadConfig(persist_delay_s=0.0, timeout_s=5.0)
NATIVE = {"materialize_in_process_from_bytes": 0}  # these tables are small: the reader process reads them anyway
PART_MB = 2e-4  # a part every few key groups of these tables
VALUE = ValueStateDescriptor("v")


def _filled(path: str, keys: range) -> KeyedStateBackend:
    backend = KeyedStateBackend(LmdbTable(path), 128, range(128))
    value = backend.get_state(VALUE)
    for key in keys:
        backend.set_current_key(key)
        value.update(f"value-{key}")
    backend.table.commit()
    return backend


def _content(table) -> dict[int, list[bytes]]:
    return {kg: flat for kg in range(128) if (flat := table.key_group_flat(kg))}


def _native(tmp_path, backend: KeyedStateBackend) -> NativeSnapshotHandle:
    storage = CheckpointStorage(str(tmp_path / "root"))
    view = ProcessView(backend.table, backend.key_groups, 7, native=NativePace())
    try:
        handle = view.write(SnapshotScope.of(backend), WholeFileWriter(storage, "sub", "native"))
    finally:
        view.close()
    assert isinstance(handle, NativeSnapshotHandle)
    assert set(view.positions.values()) == {7}, "every key group read at the view's position"
    assert not [n for n in os.listdir(backend.table.path) if n.startswith(BUILD_PREFIX)], "built file removed"
    return handle


def test_a_native_snapshot_holds_the_tables_key_groups_and_digest(tmp_path):
    backend = _filled(str(tmp_path / "t"), range(300))
    expected = _content(backend.table)
    with backend.table.consistent_view() as view:
        digest = table_digest(view.txn)
    handle = _native(tmp_path, backend)
    assert handle.groups == tuple(sorted(expected))
    assert handle.whole and (handle.start, handle.end) == (0, 127)
    assert handle.digest == digest
    storage = CheckpointStorage(str(tmp_path / "root"))
    assert storage.size(handle.path) == handle.size
    source = NativeSource(storage, handle, "test", str(tmp_path))
    try:
        got = {kg: flat for kg, flat, _ in source.key_groups(list(range(128)))}
    finally:
        source.close()
    assert got == expected
    assert os.listdir(tmp_path) == sorted(os.listdir(tmp_path)) and not any(
        n.startswith("spate-native-") for n in os.listdir(tmp_path)), "the download is deleted"
    native = ReadOnlyTable(storage.path(handle.path), file=True)
    try:
        assert native.meta("states") == backend.table.get_meta("states")
        with native.env.begin() as txn:
            assert table_digest(txn) == digest
    finally:
        native.close()
    backend.table.close()


def test_a_native_snapshot_being_built_leaves_the_page_cache_a_commit_behind(tmp_path, monkeypatch):
    """A native snapshot is as large as the state: kept in the page cache while it is built, it would push the
    table's own pages out (the next batches read them back from disk). Each commit lets go of what the commits
    before it wrote (asked to be written back a commit earlier); the snapshot holds every key group still."""
    backend = _filled(str(tmp_path / "t"), range(6000))
    expected = _content(backend.table)
    dropped: list[tuple[int, int]] = []
    monkeypatch.setattr(native_write, "COMMIT_BYTES", 16 << 10)
    monkeypatch.setattr(native_write, "drop_cached", lambda fd, offset, length: dropped.append((offset, length)))
    storage = CheckpointStorage(str(tmp_path / "root"))
    handle = write_native_snapshot(backend, backend.table, WholeFileWriter(storage, "sub", "native"))
    assert handle is not None
    lengths = [length for _, length in dropped]
    assert len(dropped) >= 5 and {offset for offset, _ in dropped} == {0}
    assert lengths[0] == 0 and lengths == sorted(lengths) and 0 < lengths[-1] < handle.size, (
        "each commit lets go of the file as it was at the commit before; linked into place, it is not read again")
    with open(storage.path(handle.path), "rb") as f:
        assert handle.crc == zlib.crc32(f.read()), "the CRC-32 summed commit by commit is the whole file's"
    source = NativeSource(storage, handle, "test", str(tmp_path))
    try:
        assert {kg: flat for kg, flat, _ in source.key_groups(list(range(128)))} == expected
    finally:
        source.close()
    backend.table.close()


@pytest.mark.parametrize("background", [False, True])
def test_a_background_build_waits_for_each_commits_write_back_a_commit_later(tmp_path, monkeypatch, background):
    """A materialization's file goes no faster than the disk takes it: each commit waits until what the commit
    before it added is on disk (then let go of, clean). A build in the batch's own thread waits for nothing."""
    backend = _filled(str(tmp_path / "t"), range(3000))
    monkeypatch.setattr(native_write, "COMMIT_BYTES", 4 << 10)
    waited: list[int] = []
    dropped: list[int] = []
    monkeypatch.setattr(native_write, "wait_written_back", lambda fd, length: waited.append(length))
    monkeypatch.setattr(native_write, "drop_cached", lambda fd, offset, length: dropped.append(length))
    path, _builder = _build(backend, background=background)
    assert len(dropped) >= 5
    assert waited == (dropped if background else [])
    os.unlink(path)
    backend.table.close()


@pytest.mark.parametrize("other_file_system", [False, True])
def test_a_native_snapshot_is_linked_into_a_local_root_and_copied_where_it_cannot_be(tmp_path, monkeypatch,
                                                                                       other_file_system):
    """On a local root the built file becomes the checkpoint's file (written to disk once); where no hard link can
    be made (another file system: ``os.link`` fails with EXDEV, fault injection) it is copied. Either way the file
    holds the table and its CRC-32 is the handle's."""
    backend = _filled(str(tmp_path / "t"), range(300))
    expected = _content(backend.table)
    copied: list[str] = []
    write_parts = LocalStorage.write_parts

    def spied(self, rel, parts):
        copied.append(rel)
        return write_parts(self, rel, parts)

    monkeypatch.setattr(LocalStorage, "write_parts", spied)
    if other_file_system:
        _no_hard_links(monkeypatch)
    handle = _native(tmp_path, backend)
    backend.table.close()
    assert copied == ([handle.path] if other_file_system else [])
    storage = CheckpointStorage(str(tmp_path / "root"))
    assert os.stat(storage.path(handle.path)).st_nlink == 1, "the built file's own name is gone"
    verify_native(storage, handle)
    source = NativeSource(storage, handle, "test", str(tmp_path))
    try:
        assert {kg: flat for kg, flat, _ in source.key_groups(list(range(128)))} == expected
    finally:
        source.close()


def test_a_full_disk_while_linking_a_native_snapshot_names_the_file_and_leaves_nothing(tmp_path, monkeypatch):
    """A hard link needs no data blocks, but its directory may need one: ENOSPC (fault injection) is a
    :class:`DiskFullError` naming the file, and neither the built file nor a checkpoint file is left."""
    backend = _filled(str(tmp_path / "t"), range(300))

    def no_space(src, dst, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), dst)

    monkeypatch.setattr(os, "link", no_space)
    with pytest.raises(DiskFullError, match=r"/root/sub/\S+native: no space left"):
        _native(tmp_path, backend)
    assert not [n for n in os.listdir(backend.table.path) if n.startswith(BUILD_PREFIX)], "built file removed"
    root = tmp_path / "root"
    assert not [f for _d, _s, files in os.walk(root) for f in files], "no checkpoint file left"
    backend.table.close()


def test_a_damaged_or_truncated_native_snapshot_is_refused_and_leaves_nothing(tmp_path):
    backend = _filled(str(tmp_path / "t"), range(200))
    handle = _native(tmp_path, backend)
    backend.table.close()
    storage = CheckpointStorage(str(tmp_path / "root"))
    full = storage.path(handle.path)
    with open(full, "r+b") as f:
        f.seek(handle.size // 2)
        byte = f.read(1)
        f.seek(handle.size // 2)
        f.write(bytes([byte[0] ^ 0x10]))
    dest = str(tmp_path / "data.mdb")
    with pytest.raises(CorruptFileError, match=rf"{handle.path}.*CRC-32.*damaged"):
        download_native(storage, handle, dest, "test")
    assert not os.path.exists(dest)
    with pytest.raises(CorruptFileError, match="damaged"):
        verify_native(storage, handle)
    with open(full, "r+b") as f:
        f.truncate(handle.size - 100)
    with pytest.raises(CorruptFileError, match="truncated"):
        download_native(storage, handle, dest, "test")
    assert not os.path.exists(dest)


def test_a_native_materialization_stopped_early_leaves_no_file(tmp_path):
    backend = _filled(str(tmp_path / "t"), range(50))
    storage = CheckpointStorage(str(tmp_path / "root"))
    stale = os.path.join(backend.table.path, f"{BUILD_PREFIX}left-by-a-dead-process.mdb")
    for name in (stale, stale + native_write.LOCK_SUFFIX):
        open(name, "wb").close()
    view = ProcessView(backend.table, backend.key_groups, 0, native=NativePace())
    assert not os.path.exists(stale), "a file a process left is removed when the next one starts"
    assert not os.path.exists(stale + native_write.LOCK_SUFFIX), "and its lock file"
    open(view._native + native_write.LOCK_SUFFIX, "ab").close()  # as a reader killed while it builds leaves it
    view.close()
    with pytest.raises(CheckpointError, match="reader process"):
        view.write(SnapshotScope.of(backend), WholeFileWriter(storage, "sub", "native"))
    assert not [n for n in os.listdir(backend.table.path) if n.startswith(BUILD_PREFIX)]
    assert not storage.exists("sub") or storage.list_files("sub") == []
    backend.table.put(0, b"\x00\x00x", b"written after")  # nothing holds the table
    backend.table.commit()
    backend.table.close()


def test_the_handle_round_trips_and_narrows_by_intersection():
    handle = NativeSnapshotHandle("sub/x", 0, 63, 0, 63, (3, 17, 40), 4096, 123, 9, ({"name": "v"},), 512)
    assert keyed_handle(handle.to_dict()) == handle
    assert isinstance(keyed_handle(KeyGroupsHandle("p", 0, 1, {0: (0, 5)}, 5).to_dict()), KeyGroupsHandle)
    part = handle.intersect(range(10, 32))
    assert part is not None and (part.start, part.end, part.held) == (10, 31, (17,)) and not part.whole
    assert handle.intersect(range(41, 64)) is None
    assert handle.intersect(range(0, 128)) is handle and handle.whole


@pytest.mark.parametrize("ranges", [[range(128)], [range(0, 43), range(43, 86), range(86, 128)]])
def test_a_restore_from_a_native_materialization_and_its_log_is_the_live_state(tmp_path, ranges):
    storage = CheckpointStorage(str(tmp_path / "root"))
    clog = ChangelogKeyedState(LmdbTable(str(tmp_path / "live")), storage, ChangelogConfig(upload=NOW, **NATIVE),
                               0, 1)
    backend = KeyedStateBackend(clog.table, 128, range(128))
    value = backend.get_state(VALUE)
    for key in range(400):
        backend.set_current_key(key)
        value.update(f"first-{key}")
    clog.materialize_now(backend)
    for n in range(5):  # updates, new keys and deletes in the log
        for key in range(n, 500, 7):
            backend.set_current_key(key)
            value.clear() if key % 5 == 0 else value.update(f"{n}-{key}")
        clog.writer.next_sequence_number()
    materialized, changelog, _ = clog.snapshot(1, backend)
    assert [type(h) for h in materialized] == [NativeSnapshotHandle] and changelog
    expected = _content(clog.table)
    clog.close()
    for kgs in ranges:
        for table in (HeapTable(), LmdbTable(str(tmp_path / f"r{kgs.start}"))):
            got = KeyedStateBackend(table, 128, kgs)
            restore_keyed_state(got, storage, materialized, changelog, "test")
            assert _content(got.table) == {kg: f for kg, f in expected.items() if kg in kgs}
            table.close()


def _run(root: str, local: str, parallelism: int, src, until: int) -> None:
    """Batches up to ``until``, each subtask's materialization waited for after each (the next checkpoint then
    references it, whatever the machine's load)."""
    with LocalRunner(Count, key="k", checkpoint_root=root, parallelism=parallelism, table="lmdb", local_dir=local,
                     changelog=ChangelogConfig(upload=NOW, materialize_after_change_sets=2, **NATIVE)) as r:
        for n in range(r.next_batch_id, until):
            r.run_batch(n, src[n])
            for sub in r.subtasks:
                sub.clog.wait_for_materialization()


CRASH_STEPS = [None, "after_begin", "after_subtask_0", "after_acks", "after_complete"]
EXAMPLES = max(1, int(os.environ.get("SPATE_MODEL_EXAMPLES", "40")) // 5)  # a reader process per materialization


@settings(max_examples=EXAMPLES, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 4), st.integers(1, 4), st.sampled_from(CRASH_STEPS)), min_size=1,
                max_size=4), st.integers(5, 40), st.booleans(), st.sampled_from([None, PART_MB]))
def test_counts_survive_crashes_and_rescales_with_native_materializations(segments, keys, merging, part_mb):
    """Property: runs at random parallelisms (1..4), each for a few batches with every materialization a native
    snapshot (in one file or in parts) waited for, some ending in a crash at a protocol step, and a last run at
    parallelism 2: the last checkpoint's counts are the input's, whichever base each restore took (the files as the
    table's bases, or read key group by key group after a rescale), and so are its entry counts where the subtasks
    know them."""
    src = batches(2 * len(segments) + 8, keys)
    root, local = tempfile.mkdtemp(prefix="native-ckpt-"), tempfile.mkdtemp(prefix="native-local-")
    try:
        done, native = 0, 0

        def runner(parallelism: int, fault: CrashOnce) -> LocalRunner:
            return LocalRunner(Count, key="k", checkpoint_root=root, parallelism=parallelism, table="lmdb",
                               local_dir=local, fault_injector=fault, file_merging=merging,
                               changelog=ChangelogConfig(upload=NOW, materialize_after_change_sets=2,
                                                         materialization_part_mb=part_mb, **NATIVE))

        def materialized(r: LocalRunner) -> None:
            for sub in r.subtasks:
                sub.clog.wait_for_materialization()

        for done in crash_segments(runner, segments, src, materialized):
            if done:
                last = load_checkpoint(CheckpointStorage(root))
                native += sum(isinstance(h, NativeSnapshotHandle) for st in last.subtasks for h in st.keyed)
                check_checkpoint(root, src[:done])
        assert done == len(src) and native, "native snapshots were restored from"
    finally:
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(local, ignore_errors=True)


@pytest.mark.parametrize(("link", "parallelism"), [(True, 2), (False, 2), (True, 3)])
def test_recovery_takes_the_native_materialization_as_the_tables_base(tmp_path, monkeypatch, link, parallelism):
    """An empty local directory: a subtask whose key groups are in one native snapshot takes the snapshot's file
    as its table's base (hard-linked from a local root, else downloaded) and replays the log into the table;
    at parallelism 3 the subtask whose key groups span both old subtasks' takes both files as bases, each owning
    its share of the subtask's key groups."""
    root, src = str(tmp_path / "c"), batches(10)
    _run(root, str(tmp_path / "l1"), 2, src, 4)
    keyed = [h for st in load_checkpoint(CheckpointStorage(root)).subtasks for h in st.keyed]
    assert keyed and all(isinstance(h, NativeSnapshotHandle) for h in keyed)
    placed: list[tuple[str, bool]] = []
    place = download._place

    def counted(storage, handle, *rest, **link):
        placed.append((handle.path, place(storage, handle, *rest, **link)))
        return placed[-1][1]

    monkeypatch.setattr(download, "_place", counted)
    if not link:  # as with an object store: no file to link
        monkeypatch.setattr(download, "local_file", lambda storage, handle: None)
    _run(root, str(tmp_path / "l2"), parallelism, src, 6)  # at 3: 0-42, 43-85, 86-127 of 0-63, 64-127
    assert sorted(set(placed)) == sorted((h.path, link) for h in keyed), "each old subtask's file taken as a base"
    assert len(placed) == {2: 2, 3: 4}[parallelism], "by each new subtask whose key groups it holds"
    rows = [st.stats.get("state_rows") for st in load_checkpoint(CheckpointStorage(root)).subtasks]
    assert None not in rows and sum(rows) == len(expected_counts(src[:6])), rows
    for h in keyed:
        assert os.path.exists(os.path.join(root, h.path)), "the checkpoint's file is left where it was"
    _run(root, str(tmp_path / "l3"), parallelism, src, 10)  # restored again: the tables' own snapshots now
    assert counts(root) == expected_counts(src)
    storage = CheckpointStorage(root)
    assert verify_checkpoint(storage, load_checkpoint(storage)) == []


def test_a_checkpoint_taken_while_a_materialization_is_placed_in_parts_restores_over_every_part(tmp_path, monkeypatch):
    """A native materialization in parts, held (fault injection) at its third part's placement: the next checkpoint
    references its first two parts beside the previous materialization's parts narrowed to the key groups after
    them. A restart with an empty local directory takes every one of those files as a base of its table (hard links
    from this local root) and replays the log from where each part's key groups were read; the counts are the
    input's, and the checkpoint verifies."""
    root, src = str(tmp_path / "c"), batches(9, keys=40)
    config = ChangelogConfig(upload=NOW, materialize_after_change_sets=2, materialization_part_mb=PART_MB / 4,
                             **NATIVE)
    held, third, released, placed = threading.Event(), threading.Event(), threading.Event(), []
    place_part = process_view.write_native_file

    def holding(path, built, scope, out, pace=None):
        placed.append(scope.key_groups)
        if held.is_set() and len(placed) == 3:
            third.set()
            assert released.wait(30)
        return place_part(path, built, scope, out, pace)

    monkeypatch.setattr(process_view, "write_native_file", holding)
    with LocalRunner(Count, key="k", checkpoint_root=root, table="lmdb", local_dir=str(tmp_path / "l1"),
                     changelog=config) as r:
        for n in range(4):
            r.run_batch(n, src[n])
            r.subtasks[0].clog.wait_for_materialization()
        before = {h.path for h in r.subtasks[0].clog.materialized}
        assert len(before) > 2, "the first materialization, in parts"
        placed.clear()
        held.set()
        n = 4
        while not third.wait(0 if n < 6 else 10):  # an ack starts the next materialization once the log is long
            assert n < 7, "two parts placed, the third held"
            r.run_batch(n, src[n])
            n += 1
        r.run_batch(n, src[n])  # takes the two parts
        released.set()
    keyed = _keyed(root)
    assert [h.path in before for h in keyed[:3]] == [False, False, True], (before, keyed)
    assert [h.start for h in keyed] == [0, *(h.end + 1 for h in keyed[:-1])], "the parts, then the rest, in order"
    storage = CheckpointStorage(root)
    assert verify_checkpoint(storage, load_checkpoint(storage)) == []
    taken: list[str] = []
    place = download._place

    def counted(storage, handle, *rest, **link):
        taken.append(handle.path)
        return place(storage, handle, *rest, **link)

    monkeypatch.setattr(download, "_place", counted)
    with LocalRunner(Count, key="k", checkpoint_root=root, table="lmdb", local_dir=str(tmp_path / "l2"),
                     changelog=config) as r:
        for n in range(r.next_batch_id, len(src)):
            r.run_batch(n, src[n])
    assert sorted(taken) == sorted(h.path for h in keyed), "every part taken as a base of the table"
    check_checkpoint(root, src)


def _keyed(root: str) -> list:
    return [h for st in load_checkpoint(CheckpointStorage(root)).subtasks for h in st.keyed]


def test_a_table_over_a_native_base_counts_its_entries_once_it_can(tmp_path):
    """Over a native snapshot a restored table counts its entries while that is cheap to know: not by itself after a
    log was replayed into the base's key groups (which replayed entries replace the base's would take a read of the
    base per entry), nor over a part of the file (parallelism 1 to 2), where the checkpoint's count is of other key
    groups; but exactly once the base is folded in (2,500 entries per batch)."""
    root, keys = str(tmp_path / "c"), 6_000
    src = [[{"k": f"user-{i}"} for i in range(keys)], *batches(8, keys)]
    _run(root, str(tmp_path / "l1"), 1, src, 3)
    assert [type(h) for h in _keyed(root)] == [NativeSnapshotHandle]
    _run(root, str(tmp_path / "l2"), 2, src, 4)  # each new subtask over half of the file
    assert _rows(root) == [None, None]
    _run(root, str(tmp_path / "l2"), 2, src, 7)  # folded in
    assert None not in _rows(root) and sum(_rows(root)) == keys
    assert counts(root) == expected_counts(src[:7])


def test_a_restore_at_the_same_parallelism_learns_its_entry_count_from_the_checkpoint(tmp_path):
    """Restored over a native snapshot with a log replayed into its key groups, the table cannot count its entries by
    itself; the checkpoint's subtask of the same key groups recorded them (``state_entries``), so it counts on from
    that, and Spark's ``numRowsTotal`` is known from the first batch after the restore."""
    root, keys = str(tmp_path / "c"), 6_000
    src = [[{"k": f"user-{i}"} for i in range(keys)], *batches(8, keys)]
    _run(root, str(tmp_path / "l1"), 1, src, 3)
    (before,) = load_checkpoint(CheckpointStorage(root)).subtasks
    assert [type(h) for h in before.keyed] == [NativeSnapshotHandle] and before.changelog, "a log to replay"
    assert before.state_entries == len(expected_counts(src[:3]))
    _run(root, str(tmp_path / "l2"), 1, src, 4)  # an empty local directory: restored from the checkpoint
    meta = load_checkpoint(CheckpointStorage(root))
    (after,) = meta.subtasks
    assert after.recovery == "restored" and after.stats.get("replayed_change_sets")
    assert after.state_entries == len(expected_counts(src[:4])) == _rows(root)[0]
    assert counts(root) == expected_counts(src[:4])
    assert verify_checkpoint(CheckpointStorage(root), meta) == []


def _rows(root: str) -> list:
    return [st.stats.get("state_rows") for st in load_checkpoint(CheckpointStorage(root)).subtasks]


def test_a_table_restored_over_a_native_base_is_materialized_by_the_reader_process(tmp_path):
    """After a restore from a native snapshot the table is an overlay (the file as its base): the next
    materialization still reads it in the reader process, the table's own entries over the base (its file kept
    while the reader reads it), and writes a native snapshot a restore takes as its base again."""
    root = str(tmp_path / "c")
    src = [[{"k": f"user-{(b + i) % 4000}"} for i in range(0, 4000, 1 + b % 3)] for b in range(12)]  # > a batch's fold
    _run(root, str(tmp_path / "l1"), 1, src, 4)
    (restored_from,) = load_checkpoint(CheckpointStorage(root)).subtasks[0].keyed
    with LocalRunner(Count, key="k", checkpoint_root=root, parallelism=1, table="lmdb", local_dir=str(tmp_path / "l2"),
                     changelog=ChangelogConfig(upload=NOW, materialize_after_change_sets=2, **NATIVE)) as r:
        r.run_batch(4, src[4])
        (sub,) = r.subtasks
        overlay = sub.keyed.table.inner
        assert isinstance(overlay, OverlayTable) and overlay.bases, "restored over the native file"
        sub.clog.materialize_now(sub.keyed)
        assert sub.clog.last_materialization["materialization_read_by"] == "native"
        assert [type(h) for h in sub.clog.materialized] == [NativeSnapshotHandle]
        assert overlay.bases, "not folded yet: the reader read the base"
        assert table_bytes(overlay.path) > os.path.getsize(os.path.join(overlay.path, "data.mdb")), \
            "the native file's map is sized on the base too"
        for n in range(5, 8):
            r.run_batch(n, src[n])
    last = load_checkpoint(CheckpointStorage(root))
    assert [type(h) for h in last.subtasks[0].keyed] == [NativeSnapshotHandle]
    assert last.subtasks[0].keyed[0].path != restored_from.path
    _run(root, str(tmp_path / "l3"), 1, src, 12)
    assert counts(root) == expected_counts(src)


def test_a_snapshot_file_this_process_reads_already_is_downloaded_as_the_base(tmp_path, monkeypatch):
    """lmdb opens a file once per process: a file another restore in the process reads in place cannot be opened
    again through a hard link, so the base is a downloaded copy."""
    root, src = str(tmp_path / "c"), batches(6)
    _run(root, str(tmp_path / "l1"), 1, src, 4)
    storage = CheckpointStorage(root)
    (handle,) = load_checkpoint(storage).subtasks[0].keyed
    placed: list[bool] = []
    place = download._place
    monkeypatch.setattr(download, "_place", lambda *args, **kw: placed.append(place(*args, **kw)) or placed[-1])
    held = ReadOnlyTable(storage.path(handle.path), file=True)
    try:
        _run(root, str(tmp_path / "l2"), 1, src, 6)
    finally:
        held.close()
    assert placed == [True, False], "linked, then copied when the link could not be opened"
    assert counts(root) == expected_counts(src)


def test_the_subtasks_of_a_rescaled_restart_check_their_one_native_base_once(tmp_path, monkeypatch):
    """Restored at twice the parallelism, both subtasks take the one native snapshot as their base: the file is
    linked for each, and its CRC-32 read once in the process (each read a whole file as large as the state)."""
    from spate.snapshot import native

    root, src = str(tmp_path / "c"), batches(6)
    _run(root, str(tmp_path / "l1"), 1, src, 4)
    (handle,) = _keyed(root)
    checked: list[str] = []
    chunks = native.native_chunks
    monkeypatch.setattr(native, "native_chunks", lambda st, h, *a: checked.append(h.path) or chunks(st, h, *a))
    placed: list[bool] = []
    place = download._place
    monkeypatch.setattr(download, "_place", lambda *args, **kw: placed.append(place(*args, **kw)) or placed[-1])
    _run(root, str(tmp_path / "l2"), 2, src, 6)
    assert placed == [True, True] and checked == [handle.path]
    assert counts(root) == expected_counts(src)


def test_a_native_base_is_checked_through_its_link_and_stays_in_the_page_cache(tmp_path, monkeypatch):
    """The table reads its base right after the restore: its CRC-32 check reads the file through the link in the
    table's directory and leaves its pages cached, while the log's change sets, read once, leave the cache."""
    from spate import local_file_io

    root, src = str(tmp_path / "c"), batches(6)
    _run(root, str(tmp_path / "l1"), 1, src, 4)
    (handle,) = _keyed(root)
    dropped: list[str] = []
    monkeypatch.setattr(local_file_io, "drop_cached", lambda fd, offset, length: dropped.append(os.readlink(
        f"/proc/self/fd/{fd}")))
    _run(root, str(tmp_path / "l2"), 1, src, 6)
    assert counts(root) == expected_counts(src)
    assert dropped, "the log's change sets were read through the storage"
    assert os.path.realpath(CheckpointStorage(root).path(handle.path)) not in dropped


@pytest.mark.parametrize("link", [True, False])
def test_the_log_replays_while_the_native_base_is_placed(tmp_path, monkeypatch, link):
    """The base's file is placed (linked and its CRC-32 checked, or downloaded) in a thread of its own while the log
    replays into the table's own part, which reads nothing of the base: here placing the file waits until the replay
    is done (serially, it would wait for ever). The table is tagged with the base only after the file is placed."""
    from spate.runtime.recovery import local_copy

    root, src = str(tmp_path / "c"), batches(6)
    _run(root, str(tmp_path / "l1"), 1, src, 4)
    (before,) = load_checkpoint(CheckpointStorage(root)).subtasks
    assert before.changelog, "a log to replay"
    replayed, events = threading.Event(), []
    restore, place, tag = local_copy.restore_keyed_state, download._place, local_copy.write_tag

    def replaying(*args):
        restore(*args)
        events.append("replayed")
        replayed.set()

    def placing(storage, handle, dest, *args, **kw):
        events.append("placing")
        listed = os.path.join(os.path.dirname(dest), download.BASE_NAME)
        assert dest != listed and not os.path.exists(listed), "no file under the listed name until it is checked"
        assert replayed.wait(30), "the replay waited for the base to be placed"
        linked = place(storage, handle, dest, *args, **kw)
        events.append("placed")
        return linked

    monkeypatch.setattr(local_copy, "restore_keyed_state", replaying)
    monkeypatch.setattr(download, "_place", placing)
    monkeypatch.setattr(local_copy, "write_tag", lambda *a: events.append("tagged") or tag(*a))
    if not link:  # as with an object store: downloaded
        monkeypatch.setattr(download, "local_file", lambda storage, handle: None)
    _run(root, str(tmp_path / "l2"), 1, src, 5)
    assert events[:4] == ["placing", "replayed", "placed", "tagged"], events
    (after,) = load_checkpoint(CheckpointStorage(root)).subtasks
    assert after.recovery == "restored"
    assert after.stats.get("local_moved_bytes", 0) == (before.keyed[0].size if link else 0)
    assert counts(root) == expected_counts(src[:5])


def test_a_damaged_native_base_found_as_the_log_replays_leaves_no_table(tmp_path, monkeypatch):
    """The base's check fails once the file is in the table's directory, while the log replays into the table: the
    restore fails naming the file, the table's directory is gone (nothing half restored is trusted by a later
    restart), and the checkpoint is untouched."""
    root, src = str(tmp_path / "c"), batches(6)
    _run(root, str(tmp_path / "l1"), 1, src, 4)
    storage = CheckpointStorage(root)
    (handle,) = load_checkpoint(storage).subtasks[0].keyed
    place = download._place

    def damaged(storage, handle, dest, *rest, **kw):
        place(storage, handle, dest, *rest, **kw)
        assert os.path.exists(dest)
        raise CorruptFileError(f"{handle.path}: CRC-32 (a fault injected after placing)")

    monkeypatch.setattr(download, "_place", damaged)
    local = tmp_path / "l2"
    with pytest.raises(CorruptFileError, match=rf"{handle.path}.*CRC-32"):
        _run(root, str(local), 1, src, 6)
    assert not [p for p in local.rglob("*") if ".mdb" in p.name], "no table, no base, checked or not, left"
    assert os.path.exists(storage.path(handle.path)) and load_checkpoint(storage).checkpoint_id == 3
    monkeypatch.setattr(download, "_place", place)
    _run(root, str(local), 1, src, 6)
    assert counts(root) == expected_counts(src)


@pytest.mark.parametrize("parallelism", [1, 2])
def test_a_damaged_native_materialization_fails_the_restore_and_deletes_nothing(tmp_path, parallelism):
    root, src = str(tmp_path / "c"), batches(6)
    _run(root, str(tmp_path / "l1"), 1, src, 4)
    storage = CheckpointStorage(root)
    (handle,) = load_checkpoint(storage).subtasks[0].keyed
    full = storage.path(handle.path)
    with open(full, "r+b") as f:
        f.seek(handle.file_offset + handle.size // 2)
        byte = f.read(1)
        f.seek(handle.file_offset + handle.size // 2)
        f.write(bytes([byte[0] ^ 0x01]))
    with pytest.raises(CorruptFileError, match=rf"{handle.path}.*CRC-32"):
        _run(root, str(tmp_path / "l2"), parallelism, src, 6)
    assert os.path.exists(full) and load_checkpoint(storage).checkpoint_id == 3


def test_the_documented_native_handle_is_what_a_materialization_writes(tmp_path):
    root = str(tmp_path / "c")
    _run(root, str(tmp_path / "l"), 1, batches(4), 4)
    (real,) = [h.to_dict() for st in load_checkpoint(CheckpointStorage(root)).subtasks for h in st.keyed]
    doc = (Path(__file__).resolve().parents[2] / "docs" / "formats.md").read_text()
    section = doc[doc.index("## Native lmdb snapshots"):doc.index("## Operator state files")]
    documented = json.loads(re.search(r"```json\n(.*?)\n```", section, re.S).group(1))  # type: ignore[union-attr]
    assert list(documented) == list(real)
    assert {k: type(v) for k, v in documented.items()} == {k: type(v) for k, v in real.items()}
    assert re.sub(r"[0-9a-f]{32}", "<hex32>", documented["path"]) == re.sub(r"[0-9a-f]{32}", "<hex32>", real["path"])
    assert (documented["start"], documented["end"], documented["table"], documented["states"]) == (
        real["start"], real["end"], real["table"], real["states"])
    assert isinstance(keyed_handle(documented), NativeSnapshotHandle)


def test_a_savepoint_rewrites_native_snapshots_as_key_group_files(tmp_path):
    root, src = str(tmp_path / "c"), batches(6)
    with LocalRunner(Count, key="k", checkpoint_root=root, parallelism=2, table="lmdb", local_dir=str(tmp_path / "l"),
                     changelog=ChangelogConfig(upload=NOW, materialize_after_change_sets=2, **NATIVE)) as r:
        for n in range(4):
            r.run_batch(n, src[n])
            for sub in r.subtasks:
                sub.clog.wait_for_materialization()
        assert any(isinstance(h, NativeSnapshotHandle)
                   for st in load_checkpoint(CheckpointStorage(root)).subtasks for h in st.keyed)
        sp = r.savepoint(str(tmp_path / "sp"))
    saved = load_checkpoint(CheckpointStorage(sp))
    assert saved.subtasks and all(isinstance(h, KeyGroupsHandle) for st in saved.subtasks for h in st.keyed)
    assert not [p for p, _ in CheckpointStorage(sp).list_files() if p.endswith(".lmdb")]
    new_root = str(tmp_path / "new")
    with LocalRunner(Count, key="k", checkpoint_root=new_root, parallelism=3, restore_from=sp) as r:
        r.run(src)
    assert counts(new_root) == expected_counts(src)


class _Clock:
    """A clock that moves only when the pace sleeps (tests assert no timing, only what the pace asked)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.slept = 0.0

    def sleep(self, s: float) -> None:
        self.slept += s
        self.now += s

    def pace(self, rate: float) -> Pace:
        return Pace(rate, clock=lambda: self.now, sleep=self.sleep)


@pytest.mark.parametrize("other_file_system", [False, True])
def test_a_native_file_is_built_and_copied_at_its_pace(tmp_path, monkeypatch, other_file_system):
    """The entries put into the file, then the file copied where it cannot be linked, each at its own rate: what
    keeps a materialization from taking the disk the batches write to. A file linked into place is not read."""
    backend = _filled(str(tmp_path / "t"), range(3000))
    path = native_write.build_path(backend.table.path)
    written, read = _Clock(), _Clock()
    builder = native_write.NativeFileBuilder(path, native_write.map_bytes(backend.table.path), written.pace(1e5))
    entries = sum(builder.add(kg, flat) for kg in range(128) if (flat := backend.table.key_group_flat(kg)))
    builder.finish({})
    size = os.path.getsize(path)
    if other_file_system:
        _no_hard_links(monkeypatch)
    storage = CheckpointStorage(str(tmp_path / "root"))
    handle = native_write.write_native_file(path, builder.built(), SnapshotScope.of(backend),
                                            WholeFileWriter(storage, "sub", "native"), read.pace(1e6))
    assert handle is not None and handle.size == size
    verify_native(storage, handle)
    assert written.slept == pytest.approx(entries / 1e5) and entries > 0
    assert read.slept == (pytest.approx(size / 1e6) if other_file_system else 0)
    backend.table.close()


def test_a_copy_that_is_not_the_built_file_is_refused_and_leaves_nothing(tmp_path, monkeypatch):
    """The copy's CRC-32 is checked against the one summed as the file was built: a file changed in between
    (here: a build record with another CRC) is a CheckpointError, and nothing is kept in the storage."""
    backend = _filled(str(tmp_path / "t"), range(300))
    path, builder = _build(backend)
    _no_hard_links(monkeypatch)
    storage = CheckpointStorage(str(tmp_path / "root"))
    wrong = dataclasses.replace(builder.built(), crc=builder.built().crc ^ 1)
    with pytest.raises(CheckpointError, match="changed while it was copied"):
        native_write.write_native_file(path, wrong, SnapshotScope.of(backend), WholeFileWriter(storage, "sub", "n"))
    assert not [f for _d, _s, fs in os.walk(tmp_path / "root") for f in fs], "nothing kept in the storage"
    backend.table.close()


def test_a_build_that_cannot_start_closes_its_file_and_leaves_nothing(tmp_path, monkeypatch):
    """A builder whose file cannot be opened again to start its write-back (fault injection: ``os.open`` fails)
    closes the lmdb environment it opened and removes its file and lmdb's lock file before it raises."""
    backend = _filled(str(tmp_path / "t"), range(30))
    path = native_write.build_path(backend.table.path)

    def no_descriptors(*args, **kwargs):
        raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))

    monkeypatch.setattr(native_write.os, "open", no_descriptors)
    with pytest.raises(OSError, match="Too many open files"):
        native_write.NativeFileBuilder(path, native_write.map_bytes(backend.table.path))
    monkeypatch.undo()
    assert not os.path.exists(path) and not os.path.exists(path + native_write.LOCK_SUFFIX)
    backend.table.close()


def _build(backend: KeyedStateBackend, **kwargs) -> tuple[str, native_write.NativeFileBuilder]:
    """The table's native file, built in its directory."""
    path = native_write.build_path(backend.table.path)
    builder = native_write.NativeFileBuilder(path, native_write.map_bytes(backend.table.path), **kwargs)
    for kg in range(128):
        if flat := backend.table.key_group_flat(kg):
            builder.add(kg, flat)
    builder.finish({})
    return path, builder


def _no_hard_links(monkeypatch) -> None:
    """Another file system (fault injection): ``os.link`` fails with EXDEV, so the file is copied."""
    def cross_device(src, dst, **kwargs):
        raise OSError(errno.EXDEV, os.strerror(errno.EXDEV), dst)

    monkeypatch.setattr(os, "link", cross_device)


def test_the_changelogs_pace_reaches_the_reader_process(tmp_path, monkeypatch):
    """ChangelogConfig's MB a second, as bytes, in the reader's start (the reader builds the file at it), and the
    native materialization off means no pace at all."""
    config = ChangelogConfig(materialization_write_mb_per_s=3, materialization_read_mb_per_s=None)
    assert config.native_pace() == NativePace(3 * 2 ** 20, None, 2 ** 30)
    assert ChangelogConfig(native_materialization=False).native_pace() is None
    assert ChangelogConfig().native_pace() == NativePace(35 * 2 ** 20, 200 * 2 ** 20, 2 ** 30)
    assert ChangelogConfig(materialization_part_mb=None).native_pace() == NativePace(35 * 2 ** 20, 200 * 2 ** 20)
    started = []

    def recording_send(stream, message):
        if isinstance(message, Start):
            started.append(message)
        return send(stream, message)

    monkeypatch.setattr(process_view, "send", recording_send)
    backend = _filled(str(tmp_path / "t"), range(300))
    view = MaterializationReads(0, config.native_pace()).open(backend.table, SnapshotScope.of(backend), 1)
    try:
        assert view.read_by == "native"
        storage = CheckpointStorage(str(tmp_path / "root"))
        assert isinstance(view.write(SnapshotScope.of(backend), WholeFileWriter(storage, "sub", "native")),
                          NativeSnapshotHandle)
    finally:
        view.close()
    assert [(s.bytes_per_s, s.part_bytes) for s in started] == [(3 * 2 ** 20, None)]  # one file: not in parts
    backend.table.close()


def test_a_view_closed_during_the_copy_stops_it_and_keeps_nothing(tmp_path, monkeypatch):
    """Paced, the copy of a 10 GB file to storage elsewhere takes about a minute: a subtask closing meanwhile (its
    materialization stopped) must not wait for it. The copy stops at its next chunk, and neither the built file
    nor its copy in the checkpoint storage is left."""
    backend = _filled(str(tmp_path / "t"), range(300))
    _no_hard_links(monkeypatch)
    storage = CheckpointStorage(str(tmp_path / "root"))
    view = ProcessView(backend.table, backend.key_groups, 1, native=NativePace(None, 1e12))
    real = process_view.write_native_file

    def closing_first(*args):
        view.close()  # as _stop_materialization does from the subtask's thread
        return real(*args)

    monkeypatch.setattr(process_view, "write_native_file", closing_first)
    with pytest.raises(CheckpointError, match="stopped while its native file was copied"):
        view.write(SnapshotScope.of(backend), WholeFileWriter(storage, "sub", "native"))
    assert not [n for n in os.listdir(backend.table.path) if n.startswith(BUILD_PREFIX)], "built file removed"
    assert not [f for _d, _s, fs in os.walk(tmp_path / "root") for f in fs], "nothing kept in the storage"
    backend.table.close()


def _over_file(tmp_path, storage: CheckpointStorage, handle: NativeSnapshotHandle, states: list[dict]):
    readers = SharedReaders()
    table = OverlayTable(LmdbTable(str(tmp_path / "restored")), [], readers)
    base = Base(download.BASE_NAME, handle.start, handle.end + 1, readers.open(storage.path(handle.path), file=True))
    table.add_base(base, msgpack.packb(states) if states else b"")
    return table, base


def test_states_registered_while_the_file_was_read_are_known_to_the_table_restored_over_it(tmp_path):
    """A native handle names the registry of when its snapshot began; a state registered while the reader read the
    table is in the file's registry only. Restored over the file, the table knows it under the file's id."""
    backend = _filled(str(tmp_path / "t"), range(200))
    handle = _native(tmp_path, backend)
    storage = CheckpointStorage(str(tmp_path / "root"))
    began = dataclasses.replace(handle, states=())  # before "v" was registered
    table, base = _over_file(tmp_path, storage, began, [])
    download._settled(table, [base], [began], SimpleNamespace(changelog=[]))
    (meta,) = msgpack.unpackb(table.get_meta("states"))
    assert (meta["name"], meta["sid"]) == ("v", backend.state_metas[0].sid)
    assert table.entry_count() == 200, "the file's entries, counted: no log replayed"
    restored = KeyedStateBackend(table, 128, range(128))
    value = restored.get_state(VALUE)
    restored.set_current_key(7)
    assert value.value() == "value-7"
    table.close()


def test_a_file_numbering_its_states_unlike_the_log_fails_the_restore(tmp_path):
    backend = _filled(str(tmp_path / "t"), range(20))
    handle = _native(tmp_path, backend)
    storage = CheckpointStorage(str(tmp_path / "root"))
    (v,) = [m.to_dict() for m in backend.state_metas]
    table, base = _over_file(tmp_path, storage, handle, [{**v, "name": "w"}])  # the log's "w" under "v"'s id
    with pytest.raises(IncompatibleStateError, match=rf"{handle.path}.*numbers its states"):
        download._settled(table, [base], [handle], SimpleNamespace(changelog=[]))
    table.close()
