"""FLIP-158 changelog (docs/formats.md, "Change files (.chg)"): writer (scenarios 1–2), batching (3), retry and
hedging (4), file registry (5–6), materialization gating (7), round trip (8), the seed's state change lifecycle,
and faults."""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from helpers.counting import Count, batches, counts, expected_counts
from spate import (
    CheckpointStorage,
    Coordinator,
    ListStateDescriptor,
    LocalRunner,
    ValueStateDescriptor,
    keyed_state_entries,
    load_checkpoint,
)
from spate.changelog.changeset import ChangeSet
from spate.changelog.state import ChangelogConfig, ChangelogKeyedState
from spate.changelog.upload import (
    BatchingUploadScheduler,
    ChangelogFileRegistry,
    RetryingExecutor,
    UploadConfig,
    UploadTask,
    change_files,
)
from spate.changelog.writer import ChangelogWriter
from spate.checkpoint.coordinator import list_complete_checkpoints
from spate.checkpoint.protocol import SubtaskAck
from spate.errors import CheckpointError
from spate.fs import LocalStorage
from spate.segments import FileRef, SegmentWriter, WholeFileWriter
from spate.state.heap import HeapTable
from spate.state.keyed import KeyedStateBackend
from spate.state.timers import EVENT_TIME

NOW = UploadConfig(persist_delay_s=0.0, timeout_s=5.0)


Fault = Callable[[Callable[[bytes], FileRef], bytes], FileRef]  # (the real write, data) -> the file written


class FaultySegments:
    """Fault injection through the scheduler's own seam for change files, its ``segments``: every change file
    is written by ``fault(write, data)``, ``write`` being the real writer's."""

    def __init__(self, segments: Callable[[int], SegmentWriter], fault: Fault) -> None:
        self.segments, self.fault = segments, fault

    def __call__(self, checkpoint_id: int) -> SegmentWriter:
        return FaultyWriter(self.segments(checkpoint_id), self.fault)


@dataclasses.dataclass
class FaultyWriter:
    writer: SegmentWriter
    fault: Fault

    def write(self, data: bytes) -> FileRef:
        return self.fault(self.writer.write, data)

    def discard(self, ref: FileRef) -> None:
        self.writer.discard(ref)


@contextlib.contextmanager
def faulty_writes(s: BatchingUploadScheduler, fault: Fault) -> Iterator[None]:
    """Inject ``fault`` into the change files of a scheduler made by someone else (a runner's services)."""
    real = s.segments
    s.segments = FaultySegments(real, fault)
    try:
        yield
    finally:
        s.segments = real


def scheduler(tmp_path, config: UploadConfig = NOW, fault: Fault | None = None) -> BatchingUploadScheduler:
    storage = CheckpointStorage(str(tmp_path))
    segments = change_files(storage)
    return BatchingUploadScheduler(storage, config, FaultySegments(segments, fault) if fault else segments)


def change(writer: ChangelogWriter, n: int = 1, size: int = 10) -> None:
    for i in range(n):
        writer.active.put(i % 4, b"\x00\x00" + bytes([i % 256]), b"x" * size)
    writer.after_append()


# -- scenario 1: sequence numbers --------------------------------------------------------------------------
def test_scenario_1_sequence_numbers(tmp_path):
    w = ChangelogWriter("w", scheduler(tmp_path))
    assert w.next_sequence_number() == 0 and w.next_sequence_number() == 0
    change(w)
    assert w.active_sqn == 0, "appending alone never increments"
    assert w.next_sequence_number() == 1
    w.persist(1).result(5)
    assert w.next_sequence_number() == 1, "persist increments only if something was appended"
    change(w)
    w.persist(1).result(5)
    assert w.next_sequence_number() == 2


# -- scenario 2: persistence ---------------------------------------------------------------------------------
def test_scenario_2_preemptive_persist_and_no_reupload(tmp_path):
    s = scheduler(tmp_path)
    w = ChangelogWriter("w", s, preemptive_threshold=1000)
    w.active.put(0, b"k" * 10, b"v" * 990)
    w.after_append()  # 1003 bytes ≥ 1000: uploaded at once
    assert _eventually(lambda: len(s.uploads) == 1)
    handles = w.persist(0).result(5)
    assert len(s.uploads) == 1 and len(handles) == 1, "persist after a pre-emptive upload uploads nothing"
    change(w)
    f1, f2 = w.persist(0), w.persist(0)
    assert len(f1.result(5)) == 2 and f2.result(5) == f1.result(5)
    assert len(s.uploads) == 2, "persist twice before completion: one upload"
    w.confirm(range(0, 2))
    w.persist(0).result(5)
    assert len(s.uploads) == 2, "after confirm: no re-upload"
    change(w, 1, size=5)
    w.persist(0).result(5)
    assert len(s.uploads) == 3 and s.uploads[-1].bytes < s.uploads[0].bytes, "only the new bytes"


def test_scenario_2_failed_upload_and_truncation(tmp_path):
    fail = [True]

    def write(real, data):
        if fail[0]:
            raise OSError("storage down")
        return real(data)

    s = scheduler(tmp_path, UploadConfig(persist_delay_s=0.0, max_attempts=1), write)
    w = ChangelogWriter("w", s)
    change(w)
    with pytest.raises(OSError):
        w.persist(0).result(5)
    with pytest.raises(OSError, match="failed to upload"):
        w.persist(0)
    fail[0] = False
    change(w)
    assert len(w.persist(1).result(5)) == 1, "a later sequence number persists"
    change(w)
    w.next_sequence_number()
    w.truncate(3)
    with pytest.raises(CheckpointError, match="truncated"):
        w.persist(2)
    with pytest.raises(CheckpointError, match="not yet appended"):
        w.persist(9)


# -- scenario 3: batching and back-pressure --------------------------------------------------------------
def _task(size: int, done: list) -> UploadTask:
    cs = ChangeSet()
    cs.put(0, b"k" * (size - 5), b"vv")  # key + value + 3 bytes of framing = size
    assert cs.size == size
    return UploadTask("log", {len(done): cs}, lambda h, st: done.append(h), lambda e: done.append(e))


def test_scenario_3_batching(tmp_path):
    s = scheduler(tmp_path, UploadConfig(persist_delay_s=0.0, persist_size_threshold=0))
    done: list = []
    for _ in range(3):
        s.upload(_task(7, done))
    s.close()
    assert len(s.uploads) == 3, "delay 0 and threshold 0: each upload at once"

    s = scheduler(tmp_path, UploadConfig(persist_delay_s=60.0, persist_size_threshold=77))
    done = []
    for i in range(11):
        s.upload(_task(7, []))
        if i < 10:
            assert not s.uploads
    s.close()
    assert len(s.uploads) == 1 and s.uploads[0].tasks == 11, "threshold reached by the 11th: one file"


def test_scenario_3_in_flight_limit_blocks(tmp_path):
    gate = threading.Event()

    def slow_write(real, data):
        gate.wait(5)
        return real(data)

    s = scheduler(tmp_path, UploadConfig(persist_delay_s=0.0, max_in_flight=10), slow_write)
    s.upload(_task(7, []))
    second = threading.Thread(target=s.upload, args=(_task(7, []),))
    second.start()
    second.join(0.2)
    assert second.is_alive(), "upload blocks while the in-flight limit is reached"
    gate.set()
    second.join(5)
    assert not second.is_alive()
    s.close()


# -- scenario 4: retry ----------------------------------------------------------------------------------------
def _run(max_attempts, action, timeout=None, discard=None):
    pool = ThreadPoolExecutor(8)
    ex = RetryingExecutor(pool, max_attempts, timeout, 0.0).execute(action, discard or (lambda r: None))
    try:
        return ex, ex.result.result(10)
    except Exception as e:  # noqa: BLE001
        return ex, e


def test_scenario_4_retry_policy():
    def always_fail(n):
        raise OSError(n)

    ex, res = _run(1, always_fail)
    assert ex.attempts == 1 and isinstance(res, OSError)
    ex, res = _run(5, always_fail)
    assert ex.attempts == 5 and isinstance(res, OSError)
    ex, res = _run(6, lambda n: n if n >= 3 else always_fail(n))
    assert ex.attempts == 3 and res == 3

    def not_io(n):
        raise ValueError("bug")

    ex, res = _run(6, not_io)
    assert ex.attempts == 1 and isinstance(res, ValueError)


def test_scenario_4_hedging_keeps_exactly_one_result():
    discarded: list = []
    hanging = threading.Event()  # attempts 1-6 hang until the 7th has won

    def action(n):
        if n < 7:
            hanging.wait(5)
        return n

    ex, res = _run(7, action, timeout=0.005, discard=discarded.append)
    hanging.set()
    assert ex.attempts == 7 and res == 7
    assert _eventually(lambda: len(discarded) == 6)
    assert sorted(discarded) == [1, 2, 3, 4, 5, 6], "later results are discarded"


# -- scenarios 5 and 6: the change-file registry ----------------------------------------------------------------
def test_scenario_5_registry(tmp_path):
    storage = CheckpointStorage(str(tmp_path))
    reg = ChangelogFileRegistry()
    out = WholeFileWriter(storage, "changes", ".chg")
    a, b = out.write(b"x"), out.write(b"y")
    reg.track(a, 2, out)
    reg.release(a)
    assert storage.exists(a.path)
    reg.release(a)
    assert not storage.exists(a.path), "ref count 2 + two releases: deleted"
    reg.track(b, 1, out)
    reg.stop_tracking(b)
    reg.release(b)
    assert storage.exists(b.path), "stopped tracking (a checkpoint owns it): never deleted by the writer"


def test_scenario_6_file_shared_by_two_writers(tmp_path):
    s = scheduler(tmp_path, UploadConfig(persist_delay_s=0.2))
    a, b = ChangelogWriter("a", s), ChangelogWriter("b", s)
    change(a)
    change(b)
    fa, fb = a.persist(0), b.persist(0)
    path = fa.result(5)[0].path
    assert fb.result(5)[0].path == path, "batched into one file"
    a.truncate(1)
    assert s.storage.exists(path)
    b.truncate(1)
    assert not s.storage.exists(path), "deleted only after both truncated"


def test_scenario_6_a_checkpoint_waits_no_delay_once_every_log_has_asked(tmp_path):
    """The persist delay gathers the process's logs into one file; once every registered log asked for the
    checkpoint there is nothing to wait for: written at once (a delay of a minute is never waited)."""
    s = scheduler(tmp_path, UploadConfig(persist_delay_s=60.0))
    a, b = ChangelogWriter("a", s), ChangelogWriter("b", s)
    change(a)
    change(b)
    fa = a.persist(0)
    assert not fa.done() and not s.uploads, "b has not asked yet: a waits to share its file"
    fb = b.persist(0)
    assert fa.result(5)[0].path == fb.result(5)[0].path, "both at once, in one file"
    b.close()
    change(a)
    assert a.persist(1).result(5), "b closed: a alone asks, and is written at once"
    c = ChangelogWriter("c", s)
    change(a)
    c.preemptive_threshold = 1
    change(c)  # a pre-emptive upload does not stand for c's checkpoint
    fa = a.persist(2)
    assert not fa.done(), "c has not asked for the checkpoint"
    fc = c.persist(0)  # all of c's changes were on their way already: c asks for nothing new
    assert fa.result(5) and fc.result(5)
    s.close()


def test_scenario_6_close_keeps_what_checkpoints_included(tmp_path):
    root = str(tmp_path)
    cfg = ChangelogConfig(upload=NOW)
    clog = ChangelogKeyedState(HeapTable(), CheckpointStorage(root), cfg, 0, 1)
    backend = KeyedStateBackend(clog.table, 128, range(128))
    v = backend.get_state(ValueStateDescriptor("v"))
    backend.set_current_key("k")
    v.update(1)
    _, included, _ = clog.snapshot(0, backend)
    v.update(2)
    clog.writer.persist(clog.materialized_to).result(5)  # uploaded after the last checkpoint
    later = [h for h in clog.writer._uploaded.values() if h.sqn == 1]  # noqa: SLF001
    clog.close()
    st = CheckpointStorage(root)
    assert st.exists(included[0].path) and not st.exists(later[0].path)


# -- scenario 7: materialization gating ------------------------------------------------------------------------
def test_scenario_7_materialization_gating(tmp_path):
    cfg = ChangelogConfig(materialization_interval_ms=10, upload=NOW)
    storage = FirstWriteFails(str(tmp_path))
    storage.gate = gate = threading.Event()
    clog = ChangelogKeyedState(HeapTable(), storage, cfg, 0, 1)
    backend = KeyedStateBackend(clog.table, 128, range(128))
    v = backend.get_state(ValueStateDescriptor("v"))
    backend.set_current_key("k")
    clog.maybe_materialize(backend, 0)  # schedules the first due time
    v.update(1)
    assert clog.maybe_materialize(backend, 10_000)
    v.update(2)
    assert not clog.maybe_materialize(backend, 20_000), "previous not finished: skipped"
    gate.set()
    clog.wait_for_materialization()  # the first one failed
    v.update(3)
    assert clog.maybe_materialize(backend, 30_000), "after a failure it runs again"
    clog.wait_for_materialization()
    assert clog.materialized and clog.materialized_to > 0


# -- scenario 8: round trip --------------------------------------------------------------------------------------
def test_scenario_8_round_trip(tmp_path):
    root = str(tmp_path)
    coord = Coordinator(root)
    coord.start(1)
    clog = ChangelogKeyedState(HeapTable(), CheckpointStorage(root), ChangelogConfig(upload=NOW), 0, 1)
    backend = KeyedStateBackend(clog.table, 128, range(128))
    v = backend.get_state(ValueStateDescriptor("v"))

    def put(k, x):
        backend.set_current_key(k)
        v.update(x)

    put("k1", "u1")
    put("k2", "u2")
    clog.materialize_now(backend)
    put("k2", 22)
    put("k3", "u3")
    clog.materialize_now(backend)
    put("k4", "u4")
    backend.set_current_key("k4")
    v.clear()
    put("k2", 222)
    for key, ts in (("a", 100), ("a", 10), ("a", 20), ("b", 9), ("c", 9), ("c", 8)):
        backend.set_current_key(key)
        backend.timers.register(EVENT_TIME, ts)
    coord.begin(0, 1, 0)
    materialized, changelog, _ = clog.snapshot(0, backend)
    coord.acknowledge(SubtaskAck(0, 0, coord.query.epoch, materialized, changelog))
    meta = coord.complete(0)
    st = CheckpointStorage(root)
    assert {e.key: e.value for e in keyed_state_entries(st, meta, "v")} == {"k1": "u1", "k2": 222, "k3": "u3"}
    timers = sorted((e.key, e.user_key) for e in keyed_state_entries(st, meta, "timers:event"))
    assert timers == [("a", 10), ("a", 20), ("a", 100), ("b", 9), ("c", 8), ("c", 9)]


# -- the seed's state change lifecycle -------------------------------------------------------------------------
class FirstWriteFails(LocalStorage):
    """Fault injection: the first file written (the first materialization) waits for ``gate``, then fails."""

    gate: threading.Event
    writes = 0

    def write_parts(self, rel: str, parts: Iterable[bytes]) -> int:  # every write of a file goes through it
        self.writes += 1
        if self.writes == 1:
            self.gate.wait(5)
            raise OSError("first materialization fails")
        return super().write_parts(rel, parts)


class GatedStorage(LocalStorage):
    """Fault injection: writes of materialized snapshots wait for ``gate``; ``writing`` tells one began."""

    def _attach(self, uri, fs, root) -> None:
        super()._attach(uri, fs, root)
        self.gate, self.writing = threading.Event(), threading.Event()

    def write_parts(self, rel: str, parts: Iterable[bytes]) -> int:  # every write of a file goes through it
        if rel.endswith(".kg"):
            self.writing.set()
            self.gate.wait(10)
        return super().write_parts(rel, parts)


def test_seed_state_change_lifecycle(tmp_path):
    root = str(tmp_path)
    storage = GatedStorage(root)
    coord = Coordinator(root, retained=1)
    coord.start(1)
    clog = ChangelogKeyedState(HeapTable(), storage, ChangelogConfig(upload=NOW), 0, 1)
    backend = KeyedStateBackend(clog.table, 128, range(128))
    lst = backend.get_state(ListStateDescriptor("list"))
    backend.set_current_key("op")

    def checkpoint(n):
        coord.begin(n, 1, 0)
        materialized, changelog, _ = clog.snapshot(n, backend)
        coord.acknowledge(SubtaskAck(n, 0, coord.query.epoch, materialized, changelog))
        meta = coord.complete(n)
        coord.drain()  # deletions run in the background
        clog.checkpoint_completed(n)
        return meta

    def restored(meta):
        return [e.value for e in keyed_state_entries(CheckpointStorage(root), meta, "list")]

    lst.add("a")                                   # T0
    cp1 = checkpoint(1)                            # CP1: (T0:T1 = a)
    assert [h.sqn for h in cp1.subtasks[0].changelog] == [0] and restored(cp1) == [["a"]]
    file_a = cp1.subtasks[0].changelog[0].path
    lst.add("b")
    clog.start_materialization(backend, clog.writer.next_sequence_number())  # T2: materializes (a, b)
    # the materialization reads the key group in the background, racing the boundary of CP2 below: read after it,
    # the key group would hold c too, and CP3 would rightly list (T3:T4 = d) alone. As the figure shows, it reads
    # (a, b) first: its file is being written once the only key group with state is read
    assert storage.writing.wait(10)
    lst.add("c")
    cp2 = checkpoint(2)                            # CP2: (T0:T1 = a) + (T1:T3 = b, c)
    assert [h.sqn for h in cp2.subtasks[0].changelog] == [0, 1, 2] and not cp2.subtasks[0].keyed
    assert restored(cp2) == [["a", "b", "c"]]
    assert storage.exists(file_a), "CP1 subsumed, but CP2 still needs (T0:T1 = a)"
    storage.gate.set()
    clog.wait_for_materialization()                # materializedTo = T2
    lst.add("d")
    cp3 = checkpoint(3)                            # CP3: materialized (a, b) + (T2:T4 = c, d)
    assert len(cp3.subtasks[0].keyed) == 1 and [h.sqn for h in cp3.subtasks[0].changelog] == [2, 3]
    assert restored(cp3) == [["a", "b", "c", "d"]]
    assert not storage.exists(file_a), "deleted exactly when CP3 completed and CP2 was subsumed"
    assert all(storage.exists(p) for p in cp3.files())


# -- faults ------------------------------------------------------------------------------------------------------
def _count_job():
    from spate import Processor

    class CountJob(Processor):
        def open(self, ctx):
            self.c = ctx.state(ValueStateDescriptor("c", default=0))

        def process(self, key, rows, ctx):
            self.c.update(self.c.value() + len(rows))
            return None

    return CountJob


def _ref_of(path: str, data: bytes) -> FileRef:
    return FileRef(path, 0, len(data))


def test_hanging_upload_is_hedged(tmp_path):
    cfg = ChangelogConfig(upload=UploadConfig(persist_delay_s=0.0, timeout_s=0.05, max_attempts=3))
    root = str(tmp_path)
    with LocalRunner(_count_job(), key="k", checkpoint_root=root, changelog=cfg) as r:
        calls: list = []
        hanging = threading.Event()

        def hang_first(real, data):
            n = len(calls)
            calls.append(None)
            if n == 0:
                hanging.wait(5)
            calls[n] = real(data).path
            return calls[n]

        with faulty_writes(r.services.scheduler, lambda real, data: _ref_of(hang_first(real, data), data)):
            started = time.perf_counter()
            result = r.run_batch(0, [{"k": "a"}])
            assert time.perf_counter() - started < 0.9, "the hedged attempt finished first"
            assert result.checkpoint.subtasks[0].stats["upload_attempts"] >= 2
            hanging.set()
            storage = CheckpointStorage(root)
            assert _eventually(lambda: calls[0] is not None), "the hanging attempt wrote its file late"
            assert _eventually(lambda: not storage.exists(calls[0])), "the late duplicate was deleted"


def test_failing_upload_fails_the_checkpoint_and_the_next_one_succeeds(tmp_path):
    cfg = ChangelogConfig(upload=UploadConfig(persist_delay_s=0.0, max_attempts=2, next_attempt_delay_s=0.0))
    root = str(tmp_path)
    with LocalRunner(_count_job(), key="k", checkpoint_root=root, changelog=cfg) as r:
        failures = [2]

        def flaky(real, data):
            if failures[0] > 0:
                failures[0] -= 1
                raise OSError("throttled")
            return real(data)

        with faulty_writes(r.services.scheduler, flaky):
            with pytest.raises(OSError, match="throttled"):
                r.run_batch(0, [{"k": "a"}])
            assert list_complete_checkpoints(CheckpointStorage(root)) == []
            r.run_batch(0, [{"k": "a"}])
            r.run_batch(1, [{"k": "a"}])
    meta = load_checkpoint(CheckpointStorage(root))
    assert {e.key: e.value for e in keyed_state_entries(CheckpointStorage(root), meta, "c")} == {"a": 2}


def test_crash_between_persist_and_metadata_leaves_no_dangling_checkpoint(tmp_path):
    root = str(tmp_path)
    cfg = ChangelogConfig(upload=NOW)

    def crash(step, batch):
        if (step, batch) == ("after_acks", 2):
            raise RuntimeError("driver died")

    src = [[{"k": i % 3} for i in range(9)]] * 4
    r = LocalRunner(_count_job(), key="k", checkpoint_root=root, parallelism=2, changelog=cfg, fault_injector=crash)
    r.run(src, until=2)
    with pytest.raises(RuntimeError):
        r.run_batch(2, src[2])
    r.close()
    storage = CheckpointStorage(root)
    referenced = set()
    for n in list_complete_checkpoints(storage):
        referenced |= set(load_checkpoint(storage, n).files())
    leftovers = {p for p, _ in storage.list_files("shared/changelog")} - referenced
    with LocalRunner(_count_job(), key="k", checkpoint_root=root, parallelism=3, changelog=cfg) as r2:
        assert not any(storage.exists(p) for p in leftovers), "orphaned change files were cleaned"
        r2.run(src)
    meta = load_checkpoint(storage)
    assert {e.key: e.value for e in keyed_state_entries(storage, meta, "c")} == {0: 12, 1: 12, 2: 12}


@pytest.mark.parametrize("coalesce", [True, False])
def test_coalescing_logs_a_hot_key_once(tmp_path, coalesce):
    root = str(tmp_path)
    cfg = ChangelogConfig(upload=NOW, coalesce=coalesce)
    clog = ChangelogKeyedState(HeapTable(), CheckpointStorage(root), cfg, 0, 1)
    backend = KeyedStateBackend(clog.table, 128, range(128))
    v = backend.get_state(ValueStateDescriptor("v"))
    lst = backend.get_state(ListStateDescriptor("l"))
    backend.set_current_key("hot")
    for i in range(100):
        v.update(i)
        lst.add(i)
    lst.update([7])
    lst.add(8)
    _, handles, _ = clog.snapshot(0, backend)
    from spate.changelog.format import read_change_set

    records = [r for h in handles for _, recs in read_change_set(CheckpointStorage(root), h) for r in recs[0::3]]
    assert len(records) == (2 if coalesce else 202)
    restored = KeyedStateBackend(HeapTable(), 128, range(128))
    from spate.changelog.restore import restore_keyed_state

    restore_keyed_state(restored, CheckpointStorage(root), [], handles, "test")
    restored.set_current_key("hot")
    assert restored.get_state(ValueStateDescriptor("v")).value() == 99
    assert restored.get_state(ListStateDescriptor("l")).get() == [7, 8]


def test_a_materialization_no_checkpoint_used_is_deleted(tmp_path):
    root = str(tmp_path)
    storage = CheckpointStorage(root)
    clog = ChangelogKeyedState(HeapTable(), storage, ChangelogConfig(upload=NOW), 0, 1)
    backend = KeyedStateBackend(clog.table, 128, range(128))
    v = backend.get_state(ValueStateDescriptor("v"))
    backend.set_current_key("k")
    v.update(1)
    clog.materialize_now(backend)
    first = clog.materialized[0].path
    v.update(2)
    clog.materialize_now(backend)
    assert not storage.exists(first), "superseded before any checkpoint referenced it"
    second = clog.materialized[0].path
    clog.snapshot(0, backend)  # referenced now: the coordinator owns it
    v.update(3)
    clog.materialize_now(backend)
    assert storage.exists(second)
    third = clog.materialized[0].path
    clog.close()
    assert not storage.exists(third), "abandoned at close"


def test_lmdb_map_growth_waits_for_a_running_materialization(tmp_path):
    from spate.state.lmdb_table import LmdbTable

    root = str(tmp_path / "c")
    storage = GatedStorage(root)
    table = LmdbTable(str(tmp_path / "lmdb"), map_size=1 << 20)
    table.env.set_mapsize(1 << 20)
    clog = ChangelogKeyedState(table, storage, ChangelogConfig(upload=NOW), 0, 1)
    backend = KeyedStateBackend(clog.table, 128, range(128))
    v = backend.get_state(ValueStateDescriptor("v"))
    for i in range(50):
        backend.set_current_key(i)
        v.update("x" * 100)
    clog.start_materialization(backend, clog.writer.next_sequence_number())  # holds a read view
    threading.Timer(0.3, storage.gate.set).start()
    for i in range(50, 3000):  # fills the map: growing it must wait for the view, not break it
        backend.set_current_key(i)
        v.update("y" * 1000)
    clog.wait_for_materialization()
    assert clog.materialized and clog.materialized_to == 1
    assert table.env.info()["map_size"] > 1 << 20, "the map did grow"
    restored = KeyedStateBackend(HeapTable(), 128, range(128))
    from spate.changelog.restore import restore_keyed_state

    restore_keyed_state(restored, storage, clog.materialized, [], "test")
    assert len(list(restored.keys(ValueStateDescriptor("v")))) == 50, "the view saw the table as of its start"
    clog.close()
    table.close()


def test_switching_the_changelog_off_keeps_unmaterialized_changes(tmp_path):
    root = str(tmp_path)
    job = _count_job()
    src = [[{"k": i} for i in range(20)]] * 3 + [[]] * 2
    with LocalRunner(job, key="k", checkpoint_root=root, parallelism=2, changelog=ChangelogConfig(upload=NOW)) as r:
        r.run(src, until=3)
    with LocalRunner(job, key="k", checkpoint_root=root, parallelism=2) as r:
        r.run(src)  # batches without rows: nothing changes, nothing may be lost
    meta = load_checkpoint(CheckpointStorage(root))
    assert {e.key: e.value for e in keyed_state_entries(CheckpointStorage(root), meta, "c")} == {
        i: 3 for i in range(20)}


def test_aborted_checkpoints_leave_no_change_files_behind(tmp_path):
    root = str(tmp_path)
    aborts = {3, 5}

    def fault(step, batch):
        if step == "after_acks" and batch in aborts:
            aborts.discard(batch)
            raise RuntimeError("abort")

    src = [[{"k": i} for i in range(10)]] * 8
    with LocalRunner(_count_job(), key="k", checkpoint_root=root, parallelism=2,
                     changelog=ChangelogConfig(upload=NOW), fault_injector=fault) as r:
        n = 0
        while n < len(src):
            try:
                r.run_batch(n, src[n])
                n += 1
            except RuntimeError:
                pass
    storage = CheckpointStorage(root)
    referenced = set()
    for cid in list_complete_checkpoints(storage):
        referenced |= set(load_checkpoint(storage, cid).files())
    assert {p for p, _ in storage.list_files("shared")} <= referenced


def _eventually(condition, seconds: float = 10.0) -> bool:
    """Whether ``condition()`` holds within ``seconds`` (background work finishing), checked as it happens."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def _finishes(fn, seconds: float) -> bool:
    t = threading.Thread(target=fn, daemon=True)
    t.start()
    t.join(seconds)
    return not t.is_alive()


def test_no_deadlock_between_flush_timer_and_writers(tmp_path):
    s = scheduler(tmp_path, UploadConfig(persist_delay_s=0.0002, timeout_s=None))
    writers = [ChangelogWriter(f"w{i}", s, preemptive_threshold=1 << 30) for i in range(2)]

    def loop():
        for i in range(300):
            for w in writers:
                w.active.put(0, b"\x00\x00" + bytes([i % 256]), b"x")
                w.persist(w.lowest)

    assert _finishes(loop, 60), "writers and the flush timer deadlocked"


def test_no_deadlock_under_back_pressure(tmp_path):
    def slow(real, data):
        time.sleep(0.3)
        return real(data)

    s = scheduler(tmp_path, UploadConfig(persist_delay_s=0.0, max_in_flight=2500, num_threads=1, timeout_s=None),
                  slow)
    w = ChangelogWriter("w", s, preemptive_threshold=400)

    def changes():
        for i, n in ((1, 500), (2, 1500), (3, 1500)):
            w.active.put(0, b"\x00\x00" + bytes([i]), b"x" * n)
            w.after_append()
        w.persist(0).result(10)

    assert _finishes(changes, 10), "back-pressure wait and upload callbacks deadlocked"


def test_a_timer_firing_after_the_scheduler_closed_gives_up_quietly():
    """A hedge or retry timer that fires once the scheduler's threads are gone ends the attempt instead of
    raising in a timer thread."""
    pool = ThreadPoolExecutor(1)
    ex = RetryingExecutor(pool, max_attempts=3, timeout_s=None, next_attempt_delay_s=0.0)
    pool.shutdown()
    execution = ex.execute(lambda n: n, lambda r: None)
    with pytest.raises(CheckpointError, match="abandoned"):
        execution.result.result(timeout=5)


def test_materialization_follows_the_log_length_not_only_the_timer(tmp_path):
    """With a timer that never fires, the change sets a checkpoint lists (and a restore replays) stay bounded:
    a materialization starts once the log since the last one holds ``materialize_after_change_sets``. Each batch
    waits for a materialization it started: how many batches one spans in the background is the machine's speed."""
    root, src = str(tmp_path / "c"), batches(14)
    cfg = ChangelogConfig(materialization_interval_ms=10**12, materialize_after_change_sets=3, upload=NOW)
    with LocalRunner(Count, key="k", checkpoint_root=root, parallelism=1, changelog=cfg) as r:
        lengths = []
        for n in range(12):
            lengths.append(len(r.run_batch(n, src[n]).checkpoint.subtasks[0].changelog))
            r.subtasks[0].clog.wait_for_materialization()
    assert max(lengths) <= 3 + 2, f"change sets per checkpoint stay bounded: {lengths}"
    assert lengths[-1] < 12
    with LocalRunner(Count, key="k", checkpoint_root=root, parallelism=2, changelog=cfg) as r:
        r.run(src)
    assert counts(root) == expected_counts(src)


def _hopping(runner: LocalRunner) -> None:
    """The subtasks behave as on Spark, whose Python workers are not sticky: no background materialization."""
    for sub in runner.subtasks:
        sub.config = dataclasses.replace(sub.config, sticky=False)


def test_non_sticky_subtasks_materialize_within_the_batch_that_references_it(tmp_path):
    root, src = str(tmp_path / "c"), batches(12)
    cfg = ChangelogConfig(materialization_interval_ms=10**12, materialize_after_change_sets=3, upload=NOW)
    with LocalRunner(Count, key="k", checkpoint_root=root, parallelism=2, changelog=cfg) as r:
        _hopping(r)
        results = r.run(src, until=10)
    lengths = [max(len(st.changelog) for st in res.checkpoint.subtasks) for res in results]
    assert max(lengths) <= 3 + 1, f"the log is materialized in the batch that reaches the bound: {lengths}"
    assert any(st.keyed for st in results[-1].checkpoint.subtasks), "checkpoints reference the materializations"
    with LocalRunner(Count, key="k", checkpoint_root=root, parallelism=3, changelog=cfg) as r:
        r.run(src)
    assert counts(root) == expected_counts(src)


def test_a_failing_materialization_is_retried_after_a_back_off_not_every_batch(tmp_path, monkeypatch):
    import spate.changelog.process_view as changelog_reads  # a small table: materialized by a thread

    def unavailable(*args, **kwargs):  # fault injection: the storage refuses materializations for a while
        raise OSError("storage unavailable")

    monkeypatch.setattr(changelog_reads, "write_key_groups", unavailable)
    root, src = str(tmp_path / "c"), batches(10)
    cfg = ChangelogConfig(materialization_interval_ms=10**12, materialize_after_change_sets=1,
                          max_materialization_failures=2, upload=NOW)
    with LocalRunner(Count, key="k", checkpoint_root=root, parallelism=1, changelog=cfg) as r:
        r.run(src)  # a long log would otherwise retry (and fail) every batch, exceeding the limit
    assert counts(root) == expected_counts(src)
