"""The state-table contract (:class:`spate.state.table.StateTable`), run against a dict model over every kind of
table a subtask uses: heap, lmdb (also one that commits every 3 writes, so bulk writes straddle transactions), the
overlay (an lmdb table over a read-only base of another subtask's state) and a table wrapped by the changelog. Every
kind must read what the model holds after any sequence of writes, and its key groups must round-trip through a
snapshot's flat form into another table."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers.overlay import table_over_base
from spate.changelog.table import ChangelogTable
from spate.changelog.upload import BatchingUploadScheduler, UploadConfig, change_files
from spate.changelog.writer import ChangelogWriter
from spate.fs import CheckpointStorage
from spate.state.heap import HeapTable
from spate.state.layout import U16, length_prefixed
from spate.state.lmdb_table import LmdbTable
from spate.state.overlay import OverlayTable
from spate.state.table import StateTable

KGS = range(0, 4)
BASE_RANGE = range(2, 4)  # the overlay's base owns these key groups (it starts empty: the model starts empty)
VALUE_SIDS, MAP_SIDS = (0, 1), (2, 3)
KEYS = range(3)  # few keys: operations meet the same entries often
MAP_SID_PREFIXES = frozenset(U16.pack(sid) for sid in MAP_SIDS)
KINDS = ("heap", "lmdb", "lmdb-small-transactions", "overlay", "changelog", "changelog-lmdb")


def primary(sid: int, key: int) -> bytes:
    return U16.pack(sid) + length_prefixed(key.to_bytes(2, "big")) + length_prefixed(b"")


@pytest.fixture(params=KINDS)
def make_table(request, tmp_path_factory) -> Iterator[Callable[[], StateTable]]:
    """A factory of empty tables of one kind; every table it made is closed afterwards."""
    made: list[StateTable] = []
    closers: list[Callable[[], None]] = []

    def make() -> StateTable:
        tmp = tmp_path_factory.mktemp(request.param)
        table = _new_table(request.param, tmp, closers)
        made.append(table)
        return table

    yield make
    for table in made:
        table.close()
    for close in closers:
        close()


def _new_table(kind: str, tmp, closers: list[Callable[[], None]]) -> StateTable:
    if kind == "heap":
        return HeapTable()
    if kind == "lmdb":
        return LmdbTable(str(tmp / "t"))
    if kind == "lmdb-small-transactions":  # commits every 3 writes: bulk writes straddle transactions
        return LmdbTable(str(tmp / "t"), commit_every=3)
    if kind == "overlay":
        table, _readers = table_over_base(tmp, [], BASE_RANGE)
        return table
    storage = CheckpointStorage(str(tmp))
    scheduler = BatchingUploadScheduler(storage, UploadConfig(), change_files(storage))
    closers.append(scheduler.close)
    inner = LmdbTable(str(tmp / "t")) if kind == "changelog-lmdb" else HeapTable()
    return ChangelogTable(inner, ChangelogWriter("contract", scheduler, preemptive_threshold=1 << 30))


value_entry = st.tuples(st.sampled_from(KGS), st.sampled_from(VALUE_SIDS), st.sampled_from(KEYS))
map_entry = st.tuples(st.sampled_from(KGS), st.sampled_from(MAP_SIDS), st.sampled_from(KEYS),
                      st.sampled_from([b"u1", b"u2"]))
data = st.binary(min_size=1, max_size=6)
ops = st.lists(st.one_of(
    st.tuples(st.just("put"), value_entry, data),
    st.tuples(st.just("put_existed"), value_entry, data),
    st.tuples(st.just("map_put_existed"), map_entry, data),
    st.tuples(st.just("append"), value_entry, data),
    st.tuples(st.just("delete"), value_entry, st.none()),
    st.tuples(st.just("put_many"), st.lists(st.tuples(value_entry, data), max_size=4), st.none()),
    st.tuples(st.just("put_many_existed"), st.lists(st.tuples(value_entry, data), max_size=4), st.none()),
    st.tuples(st.just("map_put"), map_entry, data),
    st.tuples(st.just("map_delete"), map_entry, st.none()),
    st.tuples(st.just("delete_map"), map_entry, st.none()),
    st.tuples(st.just("commit"), st.none(), st.none()),
), max_size=40)

Model = dict[tuple[int, bytes, bytes], bytes]  # (key group, primary, user key: b"" for values) -> value


def _apply(table: StateTable, model: Model, op: str, arg, value) -> None:
    if op in ("put", "put_existed", "append", "delete"):
        kg, sid, key = arg
        p = primary(sid, key)
        if op == "put_existed":
            assert table.put_existed(kg, p, value) == ((kg, p, b"") in model)
            model[(kg, p, b"")] = value
        elif op == "put":
            table.put(kg, p, value)
            model[(kg, p, b"")] = value
        elif op == "append":
            table.append(kg, p, value)
            model[(kg, p, b"")] = model.get((kg, p, b""), b"") + value
        else:
            table.delete(kg, p)
            model.pop((kg, p, b""), None)
    elif op == "put_many":
        entries = [(kg, primary(sid, key), v) for (kg, sid, key), v in arg]
        table.put_many(entries)
        model.update({(kg, p, b""): v for kg, p, v in entries})
    elif op == "put_many_existed":
        entries = [(kg, primary(sid, key), v) for (kg, sid, key), v in arg]
        existed = []
        for kg, p, v in entries:  # each as it stands just before its own put (a key twice: then it exists)
            existed.append((kg, p, b"") in model)
            model[(kg, p, b"")] = v
        assert table.put_many_existed(entries) == existed
    elif op in ("map_put", "map_put_existed", "map_delete", "delete_map"):
        kg, sid, key, user_key = arg
        p = primary(sid, key)
        if op == "map_put_existed":
            assert table.map_put_existed(kg, p, user_key, value) == ((kg, p, user_key) in model)
            model[(kg, p, user_key)] = value
        elif op == "map_put":
            table.map_put(kg, p, user_key, value)
            model[(kg, p, user_key)] = value
        elif op == "map_delete":
            table.map_delete(kg, p, user_key)
            model.pop((kg, p, user_key), None)
        else:
            table.delete(kg, p)
            for k in [k for k in model if k[:2] == (kg, p)]:
                del model[k]
    else:
        table.commit()


def _check(table: StateTable, model: Model) -> None:
    for kg in KGS:
        want = sorted((p + uk, v) for (g, p, uk), v in model.items() if g == kg)
        flat = table.key_group_flat(kg)
        assert sorted(zip(flat[::2], flat[1::2], strict=True)) == want, f"key group {kg}"
        for sid in VALUE_SIDS:
            for key in KEYS:
                p = primary(sid, key)
                assert table.get(kg, p) == model.get((kg, p, b"")), (kg, sid, key)
        for sid in MAP_SIDS:
            for key in KEYS:
                p = primary(sid, key)
                items = sorted((uk, v) for (g, q, uk), v in model.items() if (g, q) == (kg, p))
                assert sorted(table.map_items(kg, p)) == items, (kg, sid, key)
                for uk, v in items:
                    assert table.map_get(kg, p, uk) == v
            entries = sorted(table.state_entries(kg, U16.pack(sid)))
            assert entries == sorted((p, uk, v) for (g, p, uk), v in model.items()
                                     if g == kg and p[:2] == U16.pack(sid))
    keys = [(kg, primary(sid, key)) for kg in KGS for sid in VALUE_SIDS for key in KEYS]
    assert table.get_many([k for k, _ in keys], [p for _, p in keys]) == [model.get((k, p, b"")) for k, p in keys]
    count = table.entry_count()
    assert count is None or count == len(model)


@settings(max_examples=int(os.environ.get("SPATE_TABLE_EXAMPLES", "40")), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=ops)
def test_a_table_reads_what_the_model_holds(make_table, ops):
    table, model = make_table(), {}
    for op, arg, value in ops:
        _apply(table, model, op, arg, value)
    _check(table, model)
    table.commit()
    _check(table, model)


@settings(max_examples=int(os.environ.get("SPATE_TABLE_EXAMPLES", "40")), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=ops)
def test_key_groups_round_trip_through_their_flat_form(make_table, ops):
    """A snapshot writes ``key_group_flat``; a restore gives it to ``restore_key_group`` of a new table."""
    table, model = make_table(), {}
    for op, arg, value in ops:
        _apply(table, model, op, arg, value)
    restored = make_table()
    for kg in KGS:
        restored.restore_key_group(kg, table.key_group_flat(kg), MAP_SID_PREFIXES)
    _check(restored, model)


def test_heap_lmdb_and_changelog_tables_count_their_entries(make_table):
    table = make_table()
    table.put(0, primary(0, 1), b"v")
    table.map_put(1, primary(2, 1), b"u1", b"w")
    table.put_meta("tag", b"metadata is not state")
    count = table.entry_count()
    if isinstance(table, OverlayTable):
        assert count is None, "the overlay cannot count its bases' entries cheaply: it says so"
    else:
        assert count == 2
