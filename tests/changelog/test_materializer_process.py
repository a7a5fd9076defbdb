"""A materialization of a large lmdb table is read by a process of its own: the same frames as a read in the
subtask's thread, each key group at a snapshot the subtask named at a boundary, a failing reader counted as a
failed materialization (the next ones read in a thread), and a stopped reader leaves no lmdb reader slot."""

from __future__ import annotations

import io
import os
import threading
import time

import pytest

from spate.changelog import materializer_process, process_view
from spate.changelog import materializer_protocol as mp
from spate.changelog.materializer_process import serve
from spate.changelog.process_view import MaterializationReads, ProcessView
from spate.changelog.state import ChangelogConfig, ChangelogKeyedState
from spate.changelog.upload import UploadConfig
from spate.fs import LocalStorage
from spate.segments import WholeFileWriter
from spate.snapshot.keyed import SnapshotScope, key_group_frame, write_key_groups
from spate.state import lmdb_read_ahead as read_ahead
from spate.state.descriptors import ValueStateDescriptor
from spate.state.keyed import KeyedStateBackend
from spate.state.lmdb_scan import flat_key_group
from spate.state.lmdb_scan import key_group_keys as keys_of
from spate.state.lmdb_table import LmdbTable
from spate.state.timed import TimedTable

KGS = range(16)


def _filled(path: str, rounds: int = 1) -> LmdbTable:
    table = LmdbTable(path)
    for r in range(rounds):
        for i in range(400):
            table.put(i % len(KGS), f"key-{i}".encode(), f"value-{i}-{r}".encode() * 30)
    table.commit()
    return table


def _scope(table: LmdbTable) -> SnapshotScope:
    return SnapshotScope.of(KeyedStateBackend(table, len(KGS), KGS))


def _frames_of(storage: LocalStorage, handle) -> bytes:
    with open(storage.path(handle.path), "rb") as f:
        return f.read()


def test_messages_round_trip_and_a_cut_stream_is_refused():
    buf = io.BytesIO()
    sent = [mp.Start("/t", 0, 127, 5, 9), mp.Start("/t", 0, 127, 5, 9, "/n", 5e7, 1 << 30), mp.Advance(6, 10),
            mp.KeyGroupRead(3, 6, b"\x00frame"), mp.NativeWritten([1, 5], 2**63 + 1, 0xDEADBEEF, "/n", 127),
            mp.Finished(), mp.Failed("why")]
    for m in sent:
        mp.send(buf, m)
    whole = buf.getvalue()
    buf.seek(0)
    assert [mp.receive(buf) for _ in sent] == sent and mp.receive(buf) is None
    with pytest.raises(mp.ProtocolError, match="inside a message"):
        mp.receive(io.BytesIO(whole[:10]))
    with pytest.raises(mp.ProtocolError, match="not a materializer message"):
        bad = io.BytesIO()
        mp.send(bad, mp.Finished())
        mp.receive(io.BytesIO(bad.getvalue().replace(b"Finished", b"Finishex")))


def test_a_reader_process_writes_the_frames_a_thread_writes(tmp_path):
    table = _filled(str(tmp_path / "t"))
    storage = LocalStorage(str(tmp_path / "root"))
    scope = _scope(table)
    with table.consistent_view() as view:
        by_thread = write_key_groups(view, scope, WholeFileWriter(storage, "a", ".kg"))
    reader = ProcessView(table, KGS, 7)
    try:
        by_process = reader.write(scope, WholeFileWriter(storage, "b", ".kg"))
    finally:
        reader.close()
    assert by_thread is not None and by_process is not None
    assert by_process.offsets == by_thread.offsets
    assert _frames_of(storage, by_process) == _frames_of(storage, by_thread)
    assert reader.positions == dict.fromkeys(KGS, 7)
    assert reader._reader.returncode == 0
    table.close()


def _serve_in_thread(messages: list, table_path: str) -> tuple[list, int]:
    """Run the reader's loop in this process over pipes (the table is closed here: lmdb opens an environment
    once per process), feeding it ``messages``; what it sent and its exit status."""
    to_reader_r, to_reader_w = os.pipe()
    from_reader_r, from_reader_w = os.pipe()
    status: list[int] = []
    with os.fdopen(to_reader_r, "rb") as src, os.fdopen(from_reader_w, "wb") as out:
        server = threading.Thread(target=lambda: status.append(serve(src, out)))
        server.start()
        with os.fdopen(to_reader_w, "wb") as feed:
            for m in messages:
                mp.send(feed, m)
            with os.fdopen(from_reader_r, "rb") as replies:
                got = []
                while (m := mp.receive(replies)) is not None:
                    got.append(m)
                    if isinstance(m, (mp.Finished, mp.Failed)):
                        break
        server.join(10)
    return got, status[0]


def test_a_reader_waits_for_a_snapshot_it_can_catch_and_skips_ones_committed_over(tmp_path):
    table = _filled(str(tmp_path / "t"), rounds=2)
    txn = table.env.info()["last_txnid"]
    table.close()
    # the start's snapshot was committed over (its id is older than the table's), and so was the first boundary's:
    # the reader reads nothing until the boundary whose snapshot is still the newest
    got, status = _serve_in_thread([mp.Start(str(tmp_path / "t"), 0, 15, 3, txn - 1), mp.Advance(4, txn - 1),
                                    mp.Advance(5, txn)], str(tmp_path / "t"))
    assert status == 0 and isinstance(got[-1], mp.Finished)
    assert {m.kg: m.position for m in got if isinstance(m, mp.KeyGroupRead)} == dict.fromkeys(KGS, 5)


def test_a_reader_that_cannot_open_the_table_says_why(tmp_path):
    got, status = _serve_in_thread([mp.Start(str(tmp_path / "none"), 0, 15, 3, 1)], str(tmp_path / "none"))
    assert status == 1 and isinstance(got[0], mp.Failed) and "cannot open the lmdb table" in got[0].error


def test_a_killed_reader_leaves_no_reader_slot_pinning_the_table(tmp_path):
    table = LmdbTable(str(tmp_path / "t"))
    for i in range(400):  # 16 MB of frames, beyond what the pipe holds: the reader is mid-table when it is killed
        table.put(i % len(KGS), f"key-{i}".encode(), os.urandom(40_000))
    table.commit()
    reader = ProcessView(table, KGS, 1)
    first = next(reader._frames())  # the reader has a snapshot open now (it lets go once it read the last key group)
    assert first[0] == 0 and f" {reader._reader.pid} " in f" {table.env.readers()} ".replace("\n", " ")
    reader.close()  # not finished: killed
    assert reader._reader.returncode != 0
    assert f" {reader._reader.pid} " not in f" {table.env.readers()} ".replace("\n", " "), "its slot was cleared"
    table.close()


def test_a_failing_reader_fails_the_materialization_and_the_next_one_reads_in_a_thread(tmp_path, monkeypatch):
    monkeypatch.setattr(process_view, "READER_MODULE", "spate.no_such_reader")  # fault injection: it cannot start
    storage = LocalStorage(str(tmp_path / "root"))
    clog = ChangelogKeyedState(_filled(str(tmp_path / "t")), storage,
                               ChangelogConfig(upload=UploadConfig(persist_delay_s=0.0),
                                               materialize_in_process_from_bytes=0, native_materialization=False),
                               0, 1)
    backend = KeyedStateBackend(clog.table, len(KGS), KGS)
    value = backend.get_state(ValueStateDescriptor("v"))
    backend.set_current_key(1)
    value.update(b"x")
    clog.start_materialization(backend, clog.writer.next_sequence_number())
    clog.wait_for_materialization()
    assert clog._failures == 1 and clog._reads.process_failed and not clog.materialized
    clog.start_materialization(backend, clog.writer.next_sequence_number())
    clog.wait_for_materialization()
    assert clog._failures == 0 and clog.materialized
    assert clog.last_materialization["materialization_read_by"] == "thread"
    clog.close()


def test_only_a_large_lmdb_table_without_ttl_is_read_by_a_process(tmp_path):
    table = _filled(str(tmp_path / "t"))
    scope = _scope(table)
    small = MaterializationReads(table.used_bytes() + 1).open(table, scope, 1)
    assert small.read_by == "thread"
    small.close()
    large = MaterializationReads(table.used_bytes()).open(table, scope, 1)
    assert large.read_by == "process"
    large.close()
    # with profile=True the changelog's table wraps the profiler's, which wraps the lmdb table
    clog = ChangelogKeyedState(TimedTable(table), LocalStorage(str(tmp_path / "root")), ChangelogConfig(), 0, 1)
    profiled = MaterializationReads(table.used_bytes()).open(clog.table, scope, 1)
    assert profiled.read_by == "process", "under both wrappers too (a thread would hold the GIL per entry)"
    profiled.close()
    clog.close()


def test_a_reader_reading_ahead_sends_the_frames_it_would_send_alone(tmp_path, monkeypatch):
    table = _filled(str(tmp_path / "t"), rounds=2)
    txn = table.env.info()["last_txnid"]
    expected = {kg: key_group_frame(kg, flat) for kg in KGS if (flat := table.key_group_flat(kg))}
    table.close()
    monkeypatch.setattr(read_ahead, "MIN_PROBE_BYTES", 0)
    monkeypatch.setattr(read_ahead, "COLD_BYTES_PER_S", float("inf"))  # every key group counts as read from disk
    walked: list[int] = []
    monkeypatch.setattr(read_ahead, "key_group_keys", lambda cur, kg: walked.append(kg) or keys_of(cur, kg))

    def after_a_walk(txn, kg):  # the second key group is read once the threads have walked one (not a race)
        deadline = time.monotonic() + 10
        while kg == 1 and not walked and time.monotonic() < deadline:
            time.sleep(0.001)
        return flat_key_group(txn, kg)

    monkeypatch.setattr(materializer_process, "flat_key_group", after_a_walk)
    got, status = _serve_in_thread([mp.Start(str(tmp_path / "t"), 0, 15, 3, txn)], str(tmp_path / "t"))
    assert status == 0 and isinstance(got[-1], mp.Finished)
    assert {m.kg: m.frame for m in got if isinstance(m, mp.KeyGroupRead) and m.frame} == expected
    assert walked and set(walked) <= set(KGS[1:]), "the threads read ahead, never the first key group"
    assert not [t for t in threading.enumerate() if t.name == "spate-read-ahead"], "joined before the table closed"


def test_the_sender_sends_in_order_while_the_next_key_group_is_read():
    out, released = io.BytesIO(), threading.Event()

    class SlowPipe(io.BytesIO):  # the subtask not reading yet: the first send waits
        def write(self, data):
            released.wait(10)
            return out.write(data)

        def flush(self):
            pass

    sender = materializer_process.Sender(SlowPipe())
    sent = [mp.KeyGroupRead(kg, 7, bytes([kg]) * 10) for kg in range(2)]
    sender.send(sent[0])  # taken by the sending thread, which waits on the pipe
    deadline = time.monotonic() + 10
    while sender._queue.qsize() and time.monotonic() < deadline:
        time.sleep(0.001)
    sender.send(sent[1])  # queued: the reading thread goes on meanwhile
    released.set()
    sender.send(mp.Finished())
    sender.close()
    out.seek(0)
    assert [mp.receive(out) for _ in range(3)] == [*sent, mp.Finished()] and mp.receive(out) is None


def test_a_failed_send_stops_the_reader_with_its_error():
    class GonePipe(io.BytesIO):  # the subtask went away
        def write(self, data):
            raise BrokenPipeError("the subtask closed the pipe")

    sender = materializer_process.Sender(GonePipe())
    sender.send(mp.KeyGroupRead(0, 1, b"frame"))
    with pytest.raises(BrokenPipeError, match="closed the pipe"):
        try:
            for kg in range(1, 100):  # raised at a later send, or at the close
                sender.send(mp.KeyGroupRead(kg, 1, b"frame"))
        finally:
            sender.close()
    assert not sender._thread.is_alive()
