"""Restoring changelogged keyed state folds each key group's log (a key put, deleted and put again across change
sets is written once) and merges it into the materialized frame: the result must be exactly what replaying the
change sets one by one, record by record, gives, for value, list and map state, at any parallelism, on the heap
and the lmdb table, whether the key groups come in one part or many."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spate import heap
from spate.changelog import restore as changelog_restore
from spate.changelog.changeset import DELETE, PUT, replay
from spate.changelog.format import read_change_set
from spate.changelog.restore import fold, part_count, remapped_records, restore_keyed_state
from spate.changelog.state import ChangelogConfig, ChangelogKeyedState
from spate.changelog.upload import UploadConfig
from spate.fs import CheckpointStorage
from spate.snapshot.keyed import restore_keyed_snapshot, sid_remap
from spate.state.descriptors import ListStateDescriptor, MapStateDescriptor, ValueStateDescriptor
from spate.state.heap import HeapTable
from spate.state.keyed import KeyedStateBackend
from spate.state.lmdb_table import LmdbTable
from spate.state.table import StateTable

NOW = UploadConfig(persist_delay_s=0.0, timeout_s=5.0)
VALUE, LIST, MAP = ValueStateDescriptor("v"), ListStateDescriptor("l"), MapStateDescriptor("m")
# keys 0-9: value and list; 10-19: value and map; 20-39: value only; 40-49: value, often deleted; all but 30-39
# are in the materialized snapshot
LISTS, MAPS, VALUES, DELETED = range(10), range(10, 20), range(20, 40), range(40, 50)


def _checkpointed_log(root: str, coalesce: bool) -> tuple[list, list]:
    """A checkpoint's (materialized, change sets): a materialization, then 12 change sets of random changes."""
    clog = ChangelogKeyedState(HeapTable(), CheckpointStorage(root), ChangelogConfig(upload=NOW, coalesce=coalesce),
                               0, 1)
    backend = KeyedStateBackend(clog.table, 128, range(128))
    value, lst, m = backend.get_state(VALUE), backend.get_state(LIST), backend.get_state(MAP)
    rng = random.Random(23)
    for key in [*range(30), *DELETED]:
        backend.set_current_key(key)
        value.update(f"v{key}")
        if key in LISTS:
            lst.add(key)
        if key in MAPS:
            m.put(0, key)
    clog.materialize_now(backend)
    for n in range(12):
        for i in range(60):
            key, x = rng.randrange(50), f"{n}.{i}"  # every change a different value
            backend.set_current_key(key)
            roll = rng.random()
            if key in DELETED:  # put, deleted, put again, across and within change sets
                value.update(x) if roll < 0.5 else value.clear()
            elif key in LISTS and roll < 0.5:
                lst.add(x) if roll < 0.4 else lst.clear()
            elif key in MAPS and roll < 0.5:
                if roll < 0.3:
                    m.put(rng.randrange(3), x)
                else:
                    m.remove(rng.randrange(3)) if roll < 0.45 else m.clear()
            else:
                value.update(x) if roll < 0.9 else value.clear()
        clog.writer.next_sequence_number()
    materialized, changelog, _ = clog.snapshot(1, backend)
    clog.close()
    assert materialized and len(changelog) >= 12
    return materialized, changelog


def _sequential(backend: KeyedStateBackend, storage: CheckpointStorage, materialized: list, changelog: list) -> None:
    """The plain restore: the materialized snapshots, then each change set's records one by one, in order."""
    for handle in materialized:
        restore_keyed_snapshot(backend, storage, handle)
    for handle in changelog:
        remap = sid_remap(backend, handle.states)
        for kg, records in read_change_set(storage, handle):
            if kg in backend.key_groups:
                replay(backend.table, kg, records, remap)
    backend.table.commit()


def _content(table: StateTable) -> dict[int, dict[bytes, bytes]]:
    return {kg: dict(zip(flat[0::2], flat[1::2], strict=True)) for kg in range(128)
            if (flat := table.key_group_flat(kg))}


@pytest.mark.parametrize("coalesce", [True, False])
@pytest.mark.parametrize("parts", ["one", "many"])
@pytest.mark.parametrize("kind", ["heap", "lmdb"])
def test_a_folded_restore_is_a_sequential_replay(tmp_path, monkeypatch, coalesce, parts, kind):
    materialized, changelog = _checkpointed_log(str(tmp_path / "c"), coalesce)
    storage = CheckpointStorage(str(tmp_path / "c"))
    if parts == "many":  # a part per key group, a read per key group, one read ahead at a time
        monkeypatch.setattr(changelog_restore, "PART_LOG_BYTES", 1)
        monkeypatch.setattr(changelog_restore, "MAX_PARTS", 128)
        monkeypatch.setattr(changelog_restore, "MIN_READ_BYTES", 0)
        monkeypatch.setattr(changelog_restore, "CHUNK_BYTES", 1)
        monkeypatch.setattr(changelog_restore, "READ_AHEAD_BYTES", 1)
    tables: list[StateTable] = []

    def table(name: str) -> StateTable:
        tables.append(HeapTable() if kind == "heap" else LmdbTable(str(tmp_path / name)))
        return tables[-1]

    try:
        for n, ranges in enumerate([[range(128)], [range(0, 43), range(43, 86), range(86, 128)]]):
            for i, kgs in enumerate(ranges):  # at parallelism 1, then 3
                want = KeyedStateBackend(table(f"w{n}{i}"), 128, kgs)
                got = KeyedStateBackend(table(f"g{n}{i}"), 128, kgs)
                _sequential(want, storage, materialized, changelog)
                restore_keyed_state(got, storage, materialized, changelog, "test")
                assert _content(got.table) == _content(want.table)
                assert _content(want.table), "the subtask has state"
    finally:
        for t in tables:
            t.close()


def test_the_materialization_and_the_restore_each_return_the_free_heap(tmp_path, monkeypatch):
    trims: list[int] = []
    monkeypatch.setattr(heap, "MALLOC_TRIM", lambda pad: trims.append(pad) or 1)
    materialized, changelog = _checkpointed_log(str(tmp_path / "c"), True)
    assert trims == [0], "the materialization handed its free heap back"
    got = KeyedStateBackend(HeapTable(), 128, range(128))
    restore_keyed_state(got, CheckpointStorage(str(tmp_path / "c")), materialized, changelog, "test")
    assert trims == [0, 0, 0], "and so did the restore, before and after"
    assert _content(got.table)


def test_fold_keeps_each_keys_last_change_and_every_delete():
    put, delete = 1, 2
    a, b, c = b"\x00\x01a", b"\x00\x01b", b"\x00\x01c"
    other_registry = {b"\x00\x01": b"\x00\x02"}  # a change set written where the state had another id
    logged = [put, a, b"1", put, b, b"1",
              delete, a, b"", put, c, b"1",
              put, a, b"2", delete, c, b"", put, b, b"3",
              *remapped_records([put, c, b"4"], other_registry)]
    puts, deleted = fold(logged)
    assert puts == {a: b"2", b: b"3", b"\x00\x02c": b"4"}
    assert deleted == [a, c], "deleted before the puts: a is deleted, then put"
    assert fold([put, a, b"1", put, b, b"1", put, a, b"2"]) == ({a: b"2", b: b"1"}, []), "puts only: the last wins"


@given(st.lists(st.tuples(st.sampled_from([PUT, DELETE]), st.sampled_from([b"\x00\x01a", b"\x00\x01b", b"\x00\x01c"]),
                          st.binary(max_size=2)), max_size=30))
def test_fold_equals_applying_each_change_in_order(changes):
    """Deleting fold's deleted keys, then putting its puts, leaves what applying every change in order leaves."""
    model: dict[bytes, bytes] = {b"\x00\x01a": b"base", b"\x00\x01c": b"base"}
    folded = dict(model)
    for op, key, value in changes:
        if op == PUT:
            model[key] = value
        else:
            model.pop(key, None)
    puts, deleted = fold([x for change in changes for x in change])
    assert len(deleted) == len(set(deleted))
    for key in deleted:
        folded.pop(key, None)
    folded.update(puts)
    assert folded == model


def test_the_restore_holds_a_bounded_share_of_the_log_whatever_its_length():
    """A restore splits its key groups so that each part's log (decoded and held while the part is merged) is
    about PART_LOG_BYTES, so a longer log makes more parts, not a larger one; small logs stay in one part, and
    a log of many small change sets is not split into reads below MIN_READ_BYTES."""
    mb, gb = 1 << 20, 1 << 30
    assert part_count(0, 0) == part_count(10 * mb, 3) == 1
    assert part_count(300 * mb, 12) == 5  # the 1 GB bench's log: 5 parts of 60 MB
    assert part_count(1800 * mb, 160) == 29  # the 10 GB bench's: 29 parts of 62 MB (8 of 225 MB before)
    assert part_count(2 * gb, 100_000) == 1, "reads of a change set's part stay at least MIN_READ_BYTES"
    parts = part_count(4 * gb, 64)
    assert (4 * gb) / parts <= changelog_restore.PART_LOG_BYTES
