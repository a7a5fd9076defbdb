"""Keyed state types, namespaces, TTL, timers and serialization on both table kinds."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spate import (
    AggregatingStateDescriptor,
    IncompatibleStateError,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    SerializationError,
    ValueStateDescriptor,
)
from spate.errors import SpateError
from spate.fs import CheckpointStorage
from spate.segments import WholeFileWriter
from spate.snapshot.keyed import restore_keyed_snapshot, write_keyed_snapshot
from spate.state.heap import HeapTable
from spate.state.keyed import KeyedStateBackend
from spate.state.lmdb_table import LmdbTable
from spate.state.timers import EVENT_TIME, PROCESSING_TIME

MAXP = 128


@pytest.fixture(params=["heap", "lmdb"])
def make_backend(request, tmp_path):
    made = []

    def make(key_groups: range = range(MAXP), name: str = "t", allow_pickle: bool = False) -> KeyedStateBackend:
        table = HeapTable() if request.param == "heap" else LmdbTable(str(tmp_path / name))
        made.append(table)
        return KeyedStateBackend(table, MAXP, key_groups, allow_pickle=allow_pickle)

    yield make
    for t in made:
        t.close()


def test_value_state_is_scoped_by_key(make_backend):
    b = make_backend()
    v = b.get_state(ValueStateDescriptor("v", default=0))
    for k in ("a", "b", 3, (1, "x")):
        b.set_current_key(k)
        assert v.value() == 0
        v.update(len(str(k)))
    b.set_current_key("a")
    assert v.value() == 1
    v.update(None)
    assert v.value() == 0 and not v.exists()
    b.set_current_key((1, "x"))
    assert v.value() == 8


def test_mutable_default_is_not_shared(make_backend):
    b = make_backend()
    v = b.get_state(ValueStateDescriptor("v", default=[]))
    b.set_current_key("a")
    v.value().append(1)
    assert v.value() == []


def test_list_map_reducing_aggregating(make_backend):
    b = make_backend()
    lst = b.get_state(ListStateDescriptor("l"))
    mp = b.get_state(MapStateDescriptor("m"))
    red = b.get_state(ReducingStateDescriptor("r", max))

    class Avg:
        def create_accumulator(self):
            return (0, 0)

        def add(self, v, acc):
            return (acc[0] + v, acc[1] + 1)

        def get_result(self, acc):
            return acc[0] / acc[1]

        def merge(self, a, c):
            return (a[0] + c[0], a[1] + c[1])

    agg = b.get_state(AggregatingStateDescriptor("a", aggregate_fn=Avg()))
    b.set_current_key("k")
    assert lst.get() == [] and red.get() is None and agg.get() is None and mp.is_empty()
    lst.add(1)
    lst.add_all([2, 3])
    assert lst.get() == [1, 2, 3]
    lst.update([9])
    assert lst.get() == [9]
    lst.update([])
    assert lst.get() == []
    mp.put("x", {"n": 1})
    mp.put(("t", 1), [1, 2])
    assert mp.get("x") == {"n": 1} and mp.contains(("t", 1)) and not mp.contains("y")
    assert sorted(mp.keys(), key=repr) == sorted(["x", ("t", 1)], key=repr)
    mp.remove("x")
    assert mp.items() == [(("t", 1), [1, 2])]
    mp.clear()
    assert mp.is_empty()
    for x in (3, 7, 5):
        red.add(x)
        agg.add(x)
    assert red.get() == 7 and agg.get() == 5.0


def test_namespaces_and_merge(make_backend):
    b = make_backend()
    lst = b.get_state(ListStateDescriptor("l"))
    red = b.get_state(ReducingStateDescriptor("r", lambda a, c: a + c))
    b.set_current_key("k")
    for ns, xs in (((0, 10), [1, 2]), ((10, 20), [3]), (None, [100])):
        lst.set_namespace(ns)
        red.set_namespace(ns)
        for x in xs:
            lst.add(x)
            red.add(x)
    lst.merge_namespaces((0, 20), [(0, 10), (10, 20)])
    red.merge_namespaces((0, 20), [(0, 10), (10, 20)])
    lst.set_namespace((0, 20))
    red.set_namespace((0, 20))
    assert sorted(lst.get()) == [1, 2, 3] and red.get() == 6
    lst.set_namespace((0, 10))
    assert lst.get() == []
    lst.set_namespace(None)
    red.set_namespace(None)
    assert lst.get() == [100] and red.get() == 100


def test_ttl_expires_resets_on_update_and_is_dropped_on_snapshot(make_backend, tmp_path):
    b = make_backend()
    v = b.get_state(ValueStateDescriptor("v", ttl_ms=100))
    lst = b.get_state(ListStateDescriptor("l", ttl_ms=100))
    mp = b.get_state(MapStateDescriptor("m", ttl_ms=100))
    b.set_current_key("k")
    b.now_ms = 1000
    v.update(1)
    lst.add("old")
    mp.put("a", 1)
    b.now_ms = 1050
    lst.add("new")
    mp.put("b", 2)
    b.now_ms = 1099
    assert v.value() == 1 and lst.get() == ["old", "new"]
    b.now_ms = 1100
    assert v.value() is None and lst.get() == ["new"] and mp.items() == [("b", 2)]
    v.update(2)  # update resets expiry
    b.now_ms = 1120
    assert v.value() == 2
    handle = write_keyed_snapshot(b, WholeFileWriter(CheckpointStorage(str(tmp_path / "c")), "s", ".kg"))
    restored = make_backend(name="restored")
    restore_keyed_snapshot(restored, CheckpointStorage(str(tmp_path / "c")), handle)
    restored.now_ms = 0  # even at an earlier time, what had expired was not written
    restored.set_current_key("k")
    rv = restored.get_state(ValueStateDescriptor("v", ttl_ms=100))
    rl = restored.get_state(ListStateDescriptor("l", ttl_ms=100))
    rm = restored.get_state(MapStateDescriptor("m", ttl_ms=100))
    assert rv.value() == 2 and rl.get() == ["new"] and rm.items() == [("b", 2)]


def test_a_backend_over_a_table_with_timers_indexes_them_at_first_use(make_backend):
    """The timers' index is built from the table when a timer is first used, not when the backend opens: a timer
    registered first joins the ones the table held, each fires once."""
    first = make_backend()
    for key, ts in (("a", 30), ("b", 10)):
        first.set_current_key(key)
        first.timers.register(EVENT_TIME, ts)
    first.table.commit()
    again = KeyedStateBackend(first.table, MAXP, range(MAXP))
    again.set_current_key("c")
    again.timers.register(EVENT_TIME, 20)
    again.set_current_key("b")
    again.timers.register(EVENT_TIME, 10)  # already in the table: still one timer
    assert again.timers.earliest(EVENT_TIME) == 10
    assert [(ts, again.current_key) for ts, _ns in again.timers.pop_due(EVENT_TIME, 100)] == [
        (10, "b"), (20, "c"), (30, "a")]


def test_timers_fire_in_timestamp_order_and_can_be_deleted(make_backend):
    b = make_backend()
    for key, ts in (("a", 100), ("a", 10), ("a", 20), ("b", 9), ("c", 9), ("c", 8), ("d", -5)):
        b.set_current_key(key)
        b.timers.register(EVENT_TIME, ts)
    b.set_current_key("a")
    assert b.timers.list(EVENT_TIME) == [10, 20, 100]
    b.timers.delete(EVENT_TIME, 20)
    b.timers.register(EVENT_TIME, 10)  # duplicate registration fires once
    b.set_current_key("z")
    b.timers.register(PROCESSING_TIME, 5)
    fired = [(ts, b.current_key) for ts, _ns in b.timers.pop_due(EVENT_TIME, 50)]
    assert [ts for ts, _ in fired] == [-5, 8, 9, 9, 10]  # ties fire in key-group order
    assert fired[:2] == [(-5, "d"), (8, "c")] and {k for _, k in fired[2:4]} == {"b", "c"} and fired[4] == (10, "a")
    assert [(ts, b.current_key) for ts, _ in b.timers.pop_due(EVENT_TIME, 1000)] == [(100, "a")]
    assert [ts for ts, _ in b.timers.pop_due(PROCESSING_TIME, 1000)] == [5]


def test_key_outside_key_groups_is_refused(make_backend):
    b = make_backend(range(0, 1))
    with pytest.raises(ValueError, match="key group"):
        b.set_current_key("surely-not-group-0", key_group=5)


def test_unserializable_value_names_state_and_fix(make_backend):
    b = make_backend(allow_pickle=True)
    v = b.get_state(ValueStateDescriptor("profile"))
    b.set_current_key("k")
    with pytest.raises(SerializationError, match=r"state 'profile'.*serializer='pickle'"):
        v.update(object())
    p = b.get_state(ValueStateDescriptor("pickled", serializer="pickle"))
    p.update(dt.UTC)
    assert p.value() is dt.UTC


def test_state_kind_and_serializer_changes_are_refused(make_backend):
    b = make_backend()
    b.get_state(ValueStateDescriptor("s"))
    with pytest.raises(IncompatibleStateError, match="already obtained"):
        b.get_state(ListStateDescriptor("s"))
    b2 = KeyedStateBackend(b.table, MAXP, range(MAXP))
    with pytest.raises(IncompatibleStateError, match="stored as value state"):
        b2.get_state(ListStateDescriptor("s"))
    with pytest.raises(IncompatibleStateError, match="serializer"):
        b2.get_state(ValueStateDescriptor("s", serializer="pickle"))


def test_unsupported_key_type_is_a_clear_error(make_backend):
    b = make_backend()
    with pytest.raises(TypeError, match="key"):
        b.set_current_key({"a": 1})


def test_lmdb_map_grows_instead_of_failing(tmp_path):
    table = LmdbTable(str(tmp_path / "grow"), map_size=1 << 20, commit_every=10**9)
    table.env.set_mapsize(1 << 20)
    b = KeyedStateBackend(table, MAXP, range(MAXP))
    v = b.get_state(ValueStateDescriptor("v"))
    for i in range(20_000):
        b.set_current_key(i)
        v.update("x" * 200)
    table.commit()
    assert table.env.info()["map_size"] > 1 << 20
    b.set_current_key(19_999)
    assert v.value() == "x" * 200
    table.close()


def test_lmdb_map_grows_under_bulk_writes_too(tmp_path):
    """``put_many`` filling the map mid-batch: the map grows, every entry lands, the digest stays right."""
    table = LmdbTable(str(tmp_path / "grow"), map_size=1 << 20, commit_every=10**9)
    table.env.set_mapsize(1 << 20)
    table.put(0, b"first", b"y")
    table.commit()  # the digest is known from here on: put_many takes its one-pass path
    entries = [(i % MAXP, i.to_bytes(4, "big"), b"x" * 200) for i in range(20_000)]
    for first in range(0, len(entries), 5_000):
        table.put_many(entries[first:first + 5_000])
    table.commit()
    assert table.env.info()["map_size"] > 1 << 20
    assert table.get_many([e[0] for e in entries], [e[1] for e in entries]) == [b"x" * 200] * len(entries)
    assert table.verify() is None
    table.close()


def test_a_bulk_write_larger_than_the_transactions_room_commits_at_each_boundary(tmp_path):
    """``put_many_existed`` of more entries than ``commit_every`` leaves room: written in runs, committed every
    ``commit_every`` writes (what is committed is visible to a reader), each entry's ``existed`` right, and the
    digest kept through every run."""
    table = LmdbTable(str(tmp_path / "runs"), commit_every=100)
    table.put_many([(i % MAXP, b"old-%03d" % i, b"o") for i in range(30)])
    table.commit()
    committed = table.env.stat()["entries"]
    entries = [(i % MAXP, b"old-%03d" % i if i < 30 else b"new-%03d" % i, b"v%d" % i) for i in range(250)]
    assert table.put_many_existed(entries) == [i < 30 for i in range(250)]
    assert table.env.stat()["entries"] - committed == 200 - 30, "two runs of 100 committed, the last 50 open"
    table.commit()
    assert table.get_many([e[0] for e in entries], [e[1] for e in entries]) == [e[2] for e in entries]
    assert table.verify() is None
    table.close()


def test_lmdb_is_locked_while_open_and_reopens_from_another_process(tmp_path):
    path = str(tmp_path / "shared")
    table = LmdbTable(path)
    child = subprocess.run([sys.executable, "-c", f"from spate.state.lmdb_table import LmdbTable; LmdbTable({path!r})"],
                           capture_output=True, text=True, env={**os.environ})
    assert child.returncode != 0 and "in use by another process" in child.stderr
    b = KeyedStateBackend(table, MAXP, range(MAXP))
    b.get_state(ValueStateDescriptor("v"))
    b.set_current_key("k")
    b.get_state(ValueStateDescriptor("v")).update(42)
    table.close()
    code = ("from spate.state.lmdb_table import LmdbTable; from spate.state.keyed import KeyedStateBackend;"
            "from spate import ValueStateDescriptor;"
            f"b = KeyedStateBackend(LmdbTable({path!r}), 128, range(128)); b.set_current_key('k');"
            "print(b.get_state(ValueStateDescriptor('v')).value())")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    assert out.stdout.strip() == "42"


def test_lmdb_too_long_key_is_a_clear_error(tmp_path):
    table = LmdbTable(str(tmp_path / "long"))
    b = KeyedStateBackend(table, MAXP, range(MAXP))
    v = b.get_state(ValueStateDescriptor("v"))
    b.set_current_key("x" * 600)
    with pytest.raises(SpateError, match="too large for the lmdb table"):
        v.update(1)
    table.close()


def test_restore_remaps_state_ids_between_snapshots(make_backend, tmp_path):
    """Two subtasks registered states in different orders; restoring both into one backend keeps names."""
    storage = CheckpointStorage(str(tmp_path / "c"))
    handles = []
    for i, order in enumerate((["x", "y"], ["y", "x"])):
        b = make_backend(range(i * 64, (i + 1) * 64), name=f"src{i}")
        states = {n: b.get_state(ValueStateDescriptor(n)) for n in order}
        for k in range(200):
            try:
                b.set_current_key(k)
            except ValueError:
                continue
            states["x"].update(("x", k))
            states["y"].update(("y", k))
        handles.append(write_keyed_snapshot(b, WholeFileWriter(storage, "s", ".kg")))
    merged = make_backend(name="merged")
    for h in handles:
        restore_keyed_snapshot(merged, storage, h)
    x, y = merged.get_state(ValueStateDescriptor("x")), merged.get_state(ValueStateDescriptor("y"))
    for k in range(200):
        merged.set_current_key(k)
        assert x.value() == ("x", k) and y.value() == ("y", k)


def test_lmdb_consistent_view_does_not_see_later_writes(tmp_path):
    table = LmdbTable(str(tmp_path / "view"))
    b = KeyedStateBackend(table, MAXP, range(MAXP))
    v = b.get_state(ValueStateDescriptor("v"))
    b.set_current_key("k")
    v.update(1)
    kg = b.current_key_group
    with table.consistent_view() as view:
        v.update(2)
        b.set_current_key("other")
        v.update(3)
        table.commit()
        seen = view.key_group_flat(kg)
    assert len(seen) == 2 and seen[1] == b"\x01", "the view shows the table as of its opening"
    table.close()


def test_snapshot_removes_expired_state_from_the_live_table(make_backend, tmp_path):
    b = make_backend()
    v = b.get_state(ValueStateDescriptor("v", ttl_ms=100))
    lst = b.get_state(ListStateDescriptor("l", ttl_ms=100))
    mp = b.get_state(MapStateDescriptor("m", ttl_ms=100))
    b.now_ms = 0
    for k in ("a", "b"):
        b.set_current_key(k)
        v.update(1)
        lst.add("old")
        mp.put("x", 1)
    b.now_ms = 50
    b.set_current_key("b")
    lst.add("new")
    mp.put("y", 2)
    b.now_ms = 120
    before = b.table.approx_bytes()
    write_keyed_snapshot(b, WholeFileWriter(CheckpointStorage(str(tmp_path / "c")), "s", ".kg"))
    b.table.commit()
    b.now_ms = 0  # read as if nothing had expired: only what the purge kept is still there
    b.set_current_key("a")
    assert v.value() is None and lst.get() == [] and mp.items() == []
    b.set_current_key("b")
    assert v.value() is None and lst.get() == ["new"] and mp.items() == [("y", 2)]
    if b.table.kind == "heap":
        assert b.table.approx_bytes() < before


def test_lmdb_state_handed_between_processes(tmp_path):
    """Spark's Python workers are not sticky: one process unlocks a subtask's lmdb state between batches (its
    environment stays open), another opens it, writes enough to grow the map and closes; the first locks it
    again and sees every write."""
    path = str(tmp_path / "t")
    a = LmdbTable(path)
    a.put(1, b"\x00\x00first", b"1")
    a.unlock()
    assert "in use by another process" in _open_elsewhere_while_locked(path, a)
    code = ("from spate.state.lmdb_table import LmdbTable\n"
            f"t = LmdbTable({path!r})\n"
            "for i in range(30000): t.put(i % 128, b'\\x00\\x00k%d' % i, b'v' * 400)\n"
            "t.put(1, b'\\x00\\x00second', b'2'); t.close()\n")
    subprocess.run([sys.executable, "-c", code], check=True)  # the venv's python: spate is installed there
    a.lock()
    assert a.get(1, b"\x00\x00second") == b"2" and a.get(1, b"\x00\x00first") == b"1"
    a.put(2, b"\x00\x00third", b"3")
    a.commit()
    assert len(a.key_group_flat(5)) > 0
    a.close()


def _open_elsewhere_while_locked(path, holder) -> str:
    """What another process gets when it opens the table while ``holder`` has the lock (its stderr)."""
    holder.lock()
    try:
        code = ("from spate.state.lmdb_table import LmdbTable\n"
                f"LmdbTable({path!r})")
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stderr
    finally:
        holder.unlock()


def test_lmdb_restores_keep_the_digest_current_without_rereading_the_table(tmp_path, monkeypatch):
    """A restore replays many change sets into lmdb: each bulk write updates the table's digest from the values
    it replaces instead of re-reading the whole table at the next commit, and the digest stays right."""
    from spate.state import lmdb_writer

    table = LmdbTable(str(tmp_path / "t"))
    table.put(3, b"k1", b"v1")
    table.put(3, b"k2", b"v2")
    table.commit()
    full_scans = []
    original = lmdb_writer.table_digest
    monkeypatch.setattr(lmdb_writer, "table_digest", lambda txn: full_scans.append(1) or original(txn))
    for n in range(5):
        table.restore_key_group(3, [b"k1", f"new{n}".encode(), f"k{n + 3}".encode(), b"x"], frozenset())
        table.put(4, f"other{n}".encode(), b"y")
        table.commit()
    assert full_scans == []
    assert table.verify() is None  # the stored digest equals a re-read of every entry
    table.close()


_op = st.tuples(st.sampled_from(["put", "append", "delete", "map_put", "map_delete", "commit"]),
                st.integers(0, 3), st.sampled_from([b"a", b"b", b"c"]), st.sampled_from([b"x", b"y"]))


@settings(max_examples=60, deadline=None)
@given(ops=st.lists(_op, max_size=40))
def test_entry_count_is_the_number_of_entries_a_model_holds(tmp_path_factory, ops):
    """What the query's progress reports as state rows (``numRowsTotal``): values and map entries, not metadata,
    uncommitted writes included."""
    model: dict[tuple, bytes] = {}
    for table in (HeapTable(), LmdbTable(str(tmp_path_factory.mktemp("lmdb")))):
        model.clear()
        table.put_meta("tag", b"1")
        for op, kg, primary, user_key in ops:
            if op == "put":
                table.put(kg, primary + b"v", b"1")
                model[(kg, primary + b"v")] = b"1"
            elif op == "append":
                table.append(kg, primary + b"l", b"2")
                model[(kg, primary + b"l")] = b"2"
            elif op == "delete":
                table.delete(kg, primary + b"v")
                model.pop((kg, primary + b"v"), None)
            elif op == "map_put":
                table.map_put(kg, primary + b"m", user_key, b"3")
                model[(kg, primary + b"m", user_key)] = b"3"
            elif op == "map_delete":
                table.map_delete(kg, primary + b"m", user_key)
                model.pop((kg, primary + b"m", user_key), None)
            else:
                table.commit()
            assert table.entry_count() == len(model), (type(table).__name__, op)
        table.close()
