"""A materialization that spans batches reads each key group from the newest view (renewed at every checkpoint),
and the checkpoints that reference it list each change set only for the key groups it read earlier: a restore
applies every change exactly once, for value, list (``APPEND``, not idempotent) and map state alike."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterable, Iterator

import pytest

from spate import (
    CheckpointStorage,
    Coordinator,
    ListStateDescriptor,
    MapStateDescriptor,
    ValueStateDescriptor,
    key_group,
    keyed_state_entries,
)
from spate.changelog.rolling_view import RollingView, trimmed
from spate.changelog.state import ChangelogConfig, ChangelogKeyedState
from spate.changelog.upload import UploadConfig
from spate.checkpoint.protocol import SubtaskAck
from spate.fs import LocalStorage
from spate.snapshot.handles import ChangeSetHandle
from spate.state.heap import HeapTable
from spate.state.keyed import KeyedStateBackend
from spate.state.lmdb_table import LmdbTable

NOW = UploadConfig(persist_delay_s=0.0, timeout_s=5.0)
KEYS = 300


class PausingStorage(LocalStorage):
    """Fault injection: a materialized snapshot's write stops after its first ``after`` frames (the key groups
    read so far; a native snapshot's before its first part, or before it is linked in) until ``resume`` is set, so
    that batches and checkpoints run in the middle of it."""

    after = 20
    links_before_pause = 0  # native files linked in before the one that pauses (a materialization in parts)
    paused: threading.Event
    resume: threading.Event

    def write_parts(self, rel: str, parts: Iterable[bytes]) -> int:  # every write of a file goes through it
        if rel.endswith(".lmdb"):
            return super().write_parts(rel, self._pausing(parts, 0))
        return super().write_parts(rel, self._pausing(parts, self.after) if rel.endswith(".kg") else parts)

    def link_in(self, rel: str, local_path: str) -> int | None:  # a native snapshot linked in, not copied
        if rel.endswith(".lmdb"):
            if self.links_before_pause:
                self.links_before_pause -= 1
            else:
                self.paused.set()
                assert self.resume.wait(10)
        return super().link_in(rel, local_path)

    def _pausing(self, parts: Iterable[bytes], after: int) -> Iterator[bytes]:
        for i, part in enumerate(parts):
            if i == after:
                self.paused.set()
                assert self.resume.wait(10)
            yield part


class Job:
    """One subtask's keyed state with the changelog on, its checkpoints, and the model of what it must hold."""

    def __init__(self, root: str, table_path: str | None, reader_process: bool = False, native: bool = False,
                 part_mb: float | None = None) -> None:
        self.coord = Coordinator(root)
        self.coord.start(1)
        self.storage = PausingStorage(root)
        self.storage.paused, self.storage.resume = threading.Event(), threading.Event()
        table = self.table = LmdbTable(table_path) if table_path else HeapTable()
        in_process = reader_process or native
        config = ChangelogConfig(upload=NOW, materialize_in_process_from_bytes=0 if in_process else 1 << 40,
                                 native_materialization=native, materialization_part_mb=part_mb)
        self.clog = ChangelogKeyedState(table, self.storage, config, 0, 1)
        self.backend = KeyedStateBackend(self.clog.table, 128, range(128))
        self.value = self.backend.get_state(ValueStateDescriptor("v"))
        self.items = self.backend.get_state(ListStateDescriptor("l"))
        self.tags = self.backend.get_state(MapStateDescriptor("m"))
        # a reader process runs ahead of the frames written until the pipe is full: frames of ~40 KB keep it
        # within a few key groups of the paused write
        self.pad = self.backend.get_state(ValueStateDescriptor("pad")) if reader_process else None
        self.model: dict[str, dict] = {"v": {}, "l": {}, "m": {}}
        self.checkpoints = 0

    def batch(self, round_: int, materialization_first: bool = False) -> None:
        """As a subtask begins a batch: the table committed as dirty, then the changelog's begin (a boundary
        offered again to a reader process that missed it behind the tag's commit)."""
        self.table.put_meta("tag", b"dirty")
        self.table.commit()
        self.clog.begin(self.checkpoints)
        if materialization_first:  # the materialization reads from the boundary just offered, and ends
            self.clog.wait_for_materialization()
        if self.pad is not None and self.clog._running is not None:
            self._wait_for_the_reader()
        for k in range(KEYS):
            self.backend.set_current_key(k)
            self.value.update(round_)
            self.items.add(round_)
            self.tags.put(round_ % 3, k)
            if self.pad is not None:
                self.pad.update(bytes([round_]) * 16_000)
            self.model["v"][k] = round_
            self.model["l"].setdefault(k, []).append(round_)
            self.model["m"].setdefault(k, {})[round_ % 3] = k

    def _wait_for_the_reader(self) -> None:
        """Until the reader process holds the table's newest snapshot (a slot of lmdb's reader table with its
        transaction id), so that the batch's writes come after it took the boundary."""
        newest = str(self.table.env.info()["last_txnid"])
        deadline = time.monotonic() + 10
        while not any(line.split()[-1:] == [newest] for line in self.table.env.readers().splitlines()[1:]):
            assert time.monotonic() < deadline, "the reader process took no snapshot of the boundary"
            time.sleep(0.005)

    def checkpoint(self):
        cid = self.checkpoints
        self.checkpoints += 1
        self.coord.begin(cid, 1, 0)
        self.clog.begin(cid)
        materialized, changelog, self.stats = self.clog.snapshot(cid, self.backend)
        self.table.put_meta("tag", str(cid).encode())  # as a subtask tags its table: a commit right after the boundary
        self.table.commit()
        self.coord.acknowledge(SubtaskAck(cid, 0, self.coord.query.epoch, materialized, changelog))
        meta = self.coord.complete(cid)
        self.clog.checkpoint_completed(cid)
        return meta

    def restored(self, meta) -> dict[str, dict]:
        st = CheckpointStorage(self.storage.root)
        got: dict[str, dict] = {"v": {}, "l": {}, "m": {}}
        for e in keyed_state_entries(st, meta, "v"):
            got["v"][e.key] = e.value
        for e in keyed_state_entries(st, meta, "l"):
            got["l"][e.key] = e.value
        for e in keyed_state_entries(st, meta, "m"):
            got["m"].setdefault(e.key, {})[e.user_key] = e.value
        return got


def _spanning_materialization(job: Job):
    """Round 1, checkpoint; a materialization starts and stops part-way; rounds 2 and 3 each with a checkpoint
    (the view advances twice); the materialization ends; round 4 and the checkpoint that references it."""
    job.batch(1)
    job.checkpoint()
    job.clog.start_materialization(job.backend, job.clog.writer.next_sequence_number())
    assert job.storage.paused.wait(10)
    for round_ in (2, 3):
        job.batch(round_)
        job.checkpoint()
    job.storage.resume.set()
    job.clog.wait_for_materialization()
    job.batch(4)
    return job.checkpoint()


@pytest.mark.parametrize("table", ["lmdb", "heap", "lmdb-reader-process"])
def test_a_materialization_spanning_batches_restores_every_change_once(tmp_path, table):
    job = Job(str(tmp_path / "root"), str(tmp_path / "lmdb") if table != "heap" else None,
              reader_process=table == "lmdb-reader-process")
    meta = _spanning_materialization(job)
    assert job.stats["materialization_read_by"] == (
        "process" if table == "lmdb-reader-process" else "thread")
    later = job.clog.base.positions  # the key groups read after the pause, at the last advance's position
    assert 0 < len(later) < 128 and min(later.values()) > job.clog.materialized_to
    log = meta.subtasks[0].changelog
    assert any(len(h.offsets) < len(job.clog.writer._uploaded[h.sqn].offsets) for h in log), \
        "change sets the later key groups hold already are listed without them"
    assert job.restored(meta) == job.model
    job.clog.close()


def test_a_native_materialization_read_after_batches_holds_them_and_its_log_is_trimmed(tmp_path):
    """The reader process writing a native snapshot is held (SIGSTOP: fault injection) from its start until two
    batches and their checkpoints are done: it reads the key groups at a later boundary, the file holds those
    batches, and the checkpoint lists no change set the file holds already."""
    job = Job(str(tmp_path / "root"), str(tmp_path / "lmdb"), native=True)
    job.batch(1)
    job.checkpoint()
    job.clog.start_materialization(job.backend, job.clog.writer.next_sequence_number())
    reader = job.clog._running.view._reader
    os.kill(reader.pid, signal.SIGSTOP)
    try:
        job.batch(2)
        job.checkpoint()
    finally:
        os.kill(reader.pid, signal.SIGCONT)
    job.storage.resume.set()
    job.batch(3, materialization_first=True)
    meta = job.checkpoint()
    assert job.stats["materialization_read_by"] == "native"
    later = job.clog.base.positions
    assert later and min(later.values()) > job.clog.materialized_to, "read at a boundary after the start"
    log = meta.subtasks[0].changelog
    assert log and all(h.sqn >= min(later.values()) for h in log), "the change sets the file holds are not listed"
    assert job.restored(meta) == job.model, "each change once (the list state's appends are not idempotent)"
    job.clog.close()


@pytest.mark.parametrize("table", ["lmdb", "heap"])
def test_a_state_first_written_while_a_materialization_spans_batches_is_restored(tmp_path, table):
    """Found by the changelog model test (test_changelog_coalescing): a state registered after a materialization
    started, whose entries the materialization then read from a renewed view, was missing after a restore. The
    materialized handle named only the states of the materialization's start, and the change sets that named the
    new one were left out for the key groups read after them."""
    job = Job(str(tmp_path / "root"), str(tmp_path / "lmdb") if table == "lmdb" else None)
    job.batch(1)
    job.checkpoint()
    job.clog.start_materialization(job.backend, job.clog.writer.next_sequence_number())
    assert job.storage.paused.wait(10)
    read_before = set(job.clog._running.view.positions)
    late = job.backend.get_state(ValueStateDescriptor("late"))
    keys = [k for k in range(KEYS) if key_group(k, 128) not in read_before]  # only in key groups read later
    for k in keys:
        job.backend.set_current_key(k)
        late.update(-k)
    job.checkpoint()  # the view advances: the key groups read from here on hold "late"
    job.storage.resume.set()
    job.clog.wait_for_materialization()
    meta = job.checkpoint()
    assert {key_group(k, 128) for k in keys} <= set(job.clog.base.positions), "read after the state was written"
    got = {e.key: e.value for e in keyed_state_entries(CheckpointStorage(job.storage.root), meta, "late")}
    assert got == {k: -k for k in keys} and keys
    assert job.restored(meta) == job.model
    job.clog.close()


def test_listing_change_sets_untrimmed_would_apply_appends_twice(tmp_path):
    """The check above can fail: the same checkpoint with its log listed whole restores list elements twice."""
    job = Job(str(tmp_path / "root"), str(tmp_path / "lmdb"))
    meta = _spanning_materialization(job)
    whole = [job.clog.writer._uploaded[h.sqn].with_states(h.states) for h in meta.subtasks[0].changelog]
    meta.subtasks[0].changelog[:] = whole
    got = job.restored(meta)
    assert got["v"] == job.model["v"], "value state is idempotent under replay"
    assert got["l"] != job.model["l"], "an append replayed onto a key group that holds it already doubles"
    job.clog.close()


def test_a_change_set_is_left_out_when_every_key_group_it_holds_was_read_after_it():
    handle = ChangeSetHandle("f", "log", 3, {1: (0, 10), 5: (10, 10)}, file_size=20)
    assert trimmed(handle, {}) is handle
    assert trimmed(handle, {1: 3, 5: 2}) is handle
    kept = trimmed(handle, {1: 4})
    assert kept is not None and set(kept.offsets) == {5} and kept.segment.length == 20
    assert trimmed(handle, {1: 4, 5: 9}) is None


def test_a_view_in_use_is_closed_by_its_last_reader_and_a_closed_view_refuses_reads():
    opened: list[str] = []
    closed: list[str] = []

    class Table:
        def __init__(self, name: str) -> None:
            self.name = name

        def key_group_flat(self, kg: int) -> list[bytes]:
            return [self.name.encode(), str(kg).encode()]

        def __enter__(self):
            opened.append(self.name)
            return self

        def __exit__(self, *exc) -> None:
            closed.append(self.name)

    names = iter("abc")
    view = RollingView(lambda: Table(next(names)), 0)
    assert view.key_group_flat(0) == [b"a", b"0"]
    view.advance(5)
    assert closed == ["a"], "not in use: closed at once"
    assert view.key_group_flat(1) == [b"b", b"1"]
    assert view.positions == {0: 0, 1: 5}
    view.close()
    view.close()
    assert closed == ["a", "b"]
    view.advance(9)
    assert opened == ["a", "b"], "nothing opens after the end"
    with pytest.raises(RuntimeError):
        view.key_group_flat(2)


def test_a_view_that_cannot_be_renewed_fails_the_materialization_instead_of_hanging_it():
    class Table:
        def key_group_flat(self, kg: int) -> list[bytes]:
            return []

        def __enter__(self):
            return self

        def __exit__(self, *exc) -> None:
            pass

    opens = iter([Table()])

    def open_view():
        try:
            return next(opens)
        except StopIteration:
            raise OSError("the table cannot be committed") from None

    view = RollingView(open_view, 0)
    with pytest.raises(OSError):
        view.advance(3)
    with pytest.raises(RuntimeError, match="closed materialization view"):
        view.key_group_flat(0)  # the background read fails at once, and the materialization with it


@pytest.mark.parametrize("table", ["lmdb", "heap", "lmdb-native"])
def test_close_stops_a_running_materialization_and_deletes_what_it_wrote(tmp_path, table):
    """A materialization no checkpoint can reference any more is not finished at close (a large state's takes
    minutes): it stops after the key group it is reading (a native copy at its next part), and the part of its
    file written so far is deleted (a native snapshot's, linked in or copied); the checkpoint before it still restores
    whole."""
    job = Job(str(tmp_path / "root"), str(tmp_path / "lmdb") if table != "heap" else None,
              native=table == "lmdb-native")
    job.batch(1)
    meta = job.checkpoint()
    job.clog.start_materialization(job.backend, job.clog.writer.next_sequence_number())
    assert job.storage.paused.wait(10)
    view = job.clog._running.view
    threading.Timer(0.2, job.storage.resume.set).start()  # the write goes on once close() has stopped the view
    job.clog.close()
    assert job.clog._running is None
    if table != "lmdb-native":
        # the frames up to the pause (the first one is made before writing starts), then the read the view refused
        assert len(view.positions) <= PausingStorage.after + 2 < 128, f"read {len(view.positions)} of 128 key groups"
    assert list((tmp_path / "root").rglob("*.kg")) == [], "what the stopped materialization wrote is deleted"
    assert list((tmp_path / "root").rglob("*.lmdb")) == []
    assert job.restored(meta) == {k: {key: ([1] if k == "l" else 1 if k == "v" else {1: key}) for key in range(KEYS)}
                                  for k in ("v", "l", "m")}


def _materializing_in_parts(job: Job, placed_first: int) -> None:
    """A native materialization in parts started, held at the link of its part ``placed_first + 1`` once the ones
    before it were placed."""
    job.storage.paused.clear()
    job.storage.resume.clear()
    job.storage.links_before_pause = placed_first
    job.clog.start_materialization(job.backend, job.clog.writer.next_sequence_number(), in_parts=True)
    assert job.storage.paused.wait(10)


def test_a_native_materialization_in_parts_takes_each_parts_key_groups_as_it_is_placed(tmp_path):
    """Written in parts, a native materialization's placed parts take their key groups' place at the next checkpoint,
    while the rest of it is still being read: the checkpoint references them beside the handles before them
    (narrowed to the key groups after the parts) and lists those key groups' log from where each was read. Each
    checkpoint restores to the model, every change once (the list state's appends are not idempotent), through a
    first materialization in parts and a second one over it."""
    job = Job(str(tmp_path / "root"), str(tmp_path / "lmdb"), native=True, part_mb=2e-3)
    job.batch(1)
    job.checkpoint()
    _materializing_in_parts(job, 2)
    job.batch(2)
    meta = job.checkpoint()
    first = meta.subtasks[0].keyed
    assert len(first) == 2 and first[0].end + 1 == first[1].start and first[0].start == 0, "two parts, in order"
    taken = job.clog.base.positions
    assert set(taken) == set(range(first[1].end + 1)), "their key groups' log starts where each was read"
    assert all(not set(h.offsets) & set(taken) for h in meta.subtasks[0].changelog if h.sqn < min(taken.values()))
    assert job.restored(meta) == job.model
    job.storage.resume.set()
    job.clog.wait_for_materialization()
    job.batch(3)
    meta = job.checkpoint()
    whole = meta.subtasks[0].keyed
    assert len(whole) > 2 and [h.start for h in whole[1:]] == [h.end + 1 for h in whole[:-1]], "parts, in order"
    assert job.restored(meta) == job.model
    _materializing_in_parts(job, 1)
    job.batch(4)
    meta = job.checkpoint()
    over = meta.subtasks[0].keyed
    assert over[0].path not in {h.path for h in whole}, "the second materialization's first part"
    assert {h.path for h in over[1:]} <= {h.path for h in whole} and over[1].start == over[0].end + 1, \
        "the first's parts after it, narrowed"
    assert job.restored(meta) == job.model
    job.storage.resume.set()
    job.clog.close()
