"""The overlay table (a subtask's own lmdb table over read-only bases, :mod:`spate.state.overlay`) against a dict:
random writes, deletions (value and map entries), restored key groups, folds and consistent views, then a reopen
from disk; its entry count is the dict's whenever its base holds only the key groups it serves and no key group of
it was restored into the table, or since the table was told its count (as a restore learns it from the checkpoint);
else unknown until the base is folded in."""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers.overlay import table_over_base
from spate.errors import CorruptFileError
from spate.state.layout import U16, length_prefixed
from spate.state.overlay import OverlayTable, open_local_table

BASE_RANGE = range(2, 6)  # the key groups the base is read for; it holds others too, never to be seen
KGS = range(0, 8)


def primary(sid: int, key: int) -> bytes:
    return U16.pack(sid) + length_prefixed(key.to_bytes(2, "big")) + length_prefixed(b"")


entry = st.tuples(st.sampled_from(KGS), st.integers(0, 1), st.integers(0, 5), st.sampled_from([b"", b"u1", b"u2"]))
op = st.one_of(
    st.tuples(st.just("put"), entry, st.binary(min_size=1, max_size=8)),
    st.tuples(st.just("delete"), entry, st.none()),
    st.tuples(st.just("delete_primary"), entry, st.none()),
    st.tuples(st.just("fold"), st.integers(1, 6), st.none()),
    st.tuples(st.just("view"), st.none(), st.none()),
    st.tuples(st.just("learn"), st.none(), st.none()),
    st.tuples(st.just("restore"), st.sampled_from(KGS),
              st.dictionaries(st.tuples(st.integers(0, 1), st.integers(0, 5), st.sampled_from([b"", b"u1"])),
                              st.binary(min_size=1, max_size=8), max_size=4)),
)


def _key(e: tuple) -> tuple[int, bytes]:
    kg, sid, k, uk = e
    return kg, primary(sid, k) + uk


def _flat_model(model: dict[tuple[int, bytes], bytes], kg: int) -> list[bytes]:
    return [x for (g, k), v in sorted(model.items()) if g == kg for x in (k, v)]


@settings(max_examples=int(os.environ.get("SPATE_OVERLAY_EXAMPLES", "150")), deadline=None)
@given(st.lists(st.tuples(entry, st.binary(min_size=1, max_size=8)), max_size=30), st.lists(op, max_size=40),
       st.booleans())
def test_overlay_reads_what_a_dict_holds(tmp_path_factory, base_entries, ops, whole):
    """``whole``: the base holds only the key groups it serves (a native snapshot's file; an old table taken over
    whole), so the table knows its entry count; else it holds others too and the count is not known."""
    tmp = tmp_path_factory.mktemp("overlay")
    if whole:
        base_entries = [(e, v) for e, v in base_entries if e[0] in BASE_RANGE]
    table, readers = table_over_base(tmp, [(*_key(e), value) for e, value in base_entries], BASE_RANGE, whole)
    model = {_key(e): v for e, v in base_entries if e[0] in BASE_RANGE}
    views = []
    known = whole  # restoring a key group of the base makes its count unknown (until it is folded in)
    for name, arg, value in ops:
        if name == "put" and value[0] % 2:
            kg, key = _key(arg)
            assert table.put_existed(kg, key, value) == ((kg, key) in model)
            model[(kg, key)] = value
        elif name == "put":
            kg, key = _key(arg)
            table.put(kg, key, value)
            model[(kg, key)] = value
        elif name == "delete" and arg[3]:  # one map entry
            kg, key = _key(arg)
            table.map_delete(kg, key, b"")
            model.pop((kg, key), None)
        elif name in ("delete", "delete_primary"):  # a value entry, or every map entry under the primary
            kg, key = _key((*arg[:3], b""))
            table.delete(kg, key)
            if (kg, key) in model:
                del model[(kg, key)]
            else:
                for k in [k for k in model if k[0] == kg and k[1].startswith(key)]:
                    del model[k]
        elif name == "fold":
            table.fold(arg)
        elif name == "learn":  # told its count, as a restore is by the checkpoint's
            table.learn_entry_count(len(model))
            known = True
        elif name == "restore":
            entries = {primary(sid, k) + uk: v for (sid, k, uk), v in value.items()}
            known = known and not (entries and any(b.owns(arg) for b in table.bases))
            table.restore_key_group(arg, [x for k, v in sorted(entries.items()) for x in (k, v)], frozenset())
            model.update({(arg, k): v for k, v in entries.items()})
        else:
            opened = table.consistent_view()
            views.append(({kg: _flat_model(model, kg) for kg in KGS}, opened, opened.__enter__()))
        for kg in KGS:
            assert table.key_group_flat(kg) == _flat_model(model, kg)
        assert table.entry_count() == (len(model) if known or not table.bases else None)
    for e, _ in base_entries:
        kg, key = _key(e)
        assert table.get(kg, key) == model.get((kg, key))
    for want, opened, view in views:  # a view reads the state of when it was opened, whatever happened since
        assert {kg: view.key_group_flat(kg) for kg in KGS} == want
        opened.__exit__(None, None, None)
    table.commit()
    table.close()
    again = open_local_table(str(tmp / "new"), readers)
    for kg in KGS:
        assert again.key_group_flat(kg) == _flat_model(model, kg)
    assert again.entry_count() == (len(model) if known or not isinstance(again, OverlayTable) else None)
    while isinstance(again, OverlayTable) and again.bases:
        again.fold(100)
    for kg in KGS:
        assert again.key_group_flat(kg) == _flat_model(model, kg)
    assert again.entry_count() == len(model)
    plain = again.inner if isinstance(again, OverlayTable) else again
    assert not plain.scan(b"\xff\xfe"), "no tombstone outlives the last base"
    assert not os.path.exists(tmp / "new" / "base-0.mdb")
    again.close()


def test_a_count_the_table_cannot_hold_is_not_learned(tmp_path):
    """Told fewer entries than the delta holds (not this table's count): the base's stay unknown."""
    table, _readers = table_over_base(tmp_path, [(2, primary(0, 1), b"v")], range(2, 6))
    for k in range(3):
        table.put(3, primary(0, k), b"w")
    table.learn_entry_count(2)
    assert table.entry_count() is None
    table.learn_entry_count(4)
    assert table.entry_count() == 4
    table.close()


def test_a_base_still_being_placed_is_waited_for_only_by_what_reads_it(tmp_path):
    """A restore replays its log while the base's file is placed: writing the delta does not wait for the file; the
    first read of the base (a delete, which must know whether the base holds the key) waits for it."""
    table, readers = table_over_base(tmp_path, [(2, primary(0, 1), b"old")], range(2, 6))
    (base,) = table.bases
    reader, placing = base.table, Future()
    base.opened = placing
    table.restore_key_group(3, [primary(0, 7), b"new"], frozenset())
    table.put(4, primary(0, 8), b"put")
    assert base.opened is placing, "written without the base"
    waiting = threading.Timer(0.05, placing.set_result, (reader,))
    waiting.start()
    table.delete(2, primary(0, 1))
    assert base.opened is reader
    assert table.get(2, primary(0, 1)) is None and table.get(3, primary(0, 7)) == b"new"
    table.close()
    waiting.join()
    assert readers._open == {}, "the base's reader let go of"


def test_a_base_that_could_not_be_placed_fails_its_reads_and_the_table_still_closes(tmp_path):
    table, readers = table_over_base(tmp_path, [(2, primary(0, 1), b"old")], range(2, 6))
    (base,) = table.bases
    reader, failed = base.table, Future()
    failed.set_exception(CorruptFileError("base-0.mdb: CRC-32 (a fault injected)"))
    base.opened = failed
    readers.release(reader)  # what placing it would have opened, had it not failed
    table.put(3, primary(0, 2), b"v")
    with pytest.raises(CorruptFileError, match="base-0.mdb"):
        table.get(2, primary(0, 1))
    table.destroy()
    assert not os.path.exists(tmp_path / "new") and readers._open == {}
