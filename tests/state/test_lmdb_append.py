"""Bulk writes in lmdb's append mode (``spate.state.lmdb_append``): the same table as an ordinary write, whatever
the keys, the table's metadata kept; appended only where that is exact; a restore in append mode writes fewer
pages."""

from __future__ import annotations

import os

import lmdb
from hypothesis import given, settings
from hypothesis import strategies as st

from spate.state.layout import META_PREFIX, TOMBSTONE_PREFIX
from spate.state.lmdb_append import put_sorted
from spate.state.lmdb_digest import DIGEST_KEY, digest_problem
from spate.state.lmdb_table import LmdbTable

state_keys = st.binary(min_size=3, max_size=6).map(lambda b: bytes([b[0] & 0x7F]) + b[1:])  # key groups < 0x8000
tables = st.dictionaries(st.one_of(state_keys, st.sampled_from([META_PREFIX + b"tag", DIGEST_KEY,
                                                                TOMBSTONE_PREFIX + b"\x00\x01x"])),
                         st.binary(max_size=8), max_size=12)


def _write(path: str, before: dict[bytes, bytes], keys: list[bytes], values: list[bytes], bulk: bool) -> tuple[
        list[tuple[bytes, bytes]], bool]:
    env = lmdb.open(path, map_size=1 << 24)
    try:
        with env.begin(write=True) as txn:
            txn.cursor().putmulti(sorted(before.items()))
        with env.begin(write=True) as txn:
            if bulk:
                appended = put_sorted(txn, keys, values)
            else:
                appended = False
                txn.cursor().putmulti(zip(keys, values, strict=True))
        with env.begin() as txn:
            return [(bytes(k), bytes(v)) for k, v in txn.cursor()], appended
    finally:
        env.close()


@settings(max_examples=200, deadline=None)
@given(before=tables, entries=st.lists(st.tuples(state_keys, st.binary(max_size=8)), max_size=10),
       shuffle=st.booleans())
def test_the_table_is_an_ordinary_writes_whatever_the_keys(tmp_path_factory, before, entries, shuffle):
    keys = [k for k, _v in entries] if shuffle else sorted(k for k, _v in entries)
    values = [v for _k, v in entries]
    ordinary, _ = _write(str(tmp_path_factory.mktemp("ordinary")), before, keys, values, bulk=False)
    bulk, appended = _write(str(tmp_path_factory.mktemp("bulk")), before, keys, values, bulk=True)
    assert bulk == ordinary
    state = [k for k in before if k < TOMBSTONE_PREFIX]
    after_all = not state or min(keys, default=b"") > max(state)
    tombstones = any(k.startswith(TOMBSTONE_PREFIX) for k in before)
    ascending = all(a < b for a, b in zip(keys, keys[1:], strict=False))
    assert appended == bool(keys and after_all and ascending and not tombstones)


def test_metadata_are_lifted_for_the_append_and_back_in_the_same_transaction(tmp_path):
    env = lmdb.open(str(tmp_path), map_size=1 << 24)
    with env.begin(write=True) as txn:
        txn.put(b"\x00\x01a", b"1")
        txn.put(META_PREFIX + b"tag", b"7")
        txn.put(DIGEST_KEY, b"9")
    with env.begin(write=True) as txn:
        assert put_sorted(txn, [b"\x00\x02a", b"\x00\x02b"], [b"x", b"y"])
    with env.begin() as txn:
        assert [bytes(k) for k in txn.cursor().iternext(values=False)] == [
            b"\x00\x01a", b"\x00\x02a", b"\x00\x02b", DIGEST_KEY, META_PREFIX + b"tag"]
    env.close()


def _restored_pages(path: str, append: bool) -> int:
    table = LmdbTable(path)
    try:
        for kg in range(4) if append else reversed(range(4)):  # the ordinary write: before what the table holds
            flat = []
            for i in range(3000):
                flat += [b"\x00\x01" + i.to_bytes(4, "big"), bytes(200)]
            table.restore_key_group(kg, flat, frozenset())
        with table.env.begin() as txn:
            assert digest_problem(txn) is None
        assert table.entry_count() == 12000
        return table.env.info()["last_pgno"]
    finally:
        table.close()


def test_a_restore_in_key_order_appends_and_writes_fewer_pages(tmp_path):
    appended = _restored_pages(os.path.join(tmp_path, "appended"), append=True)
    ordinary = _restored_pages(os.path.join(tmp_path, "ordinary"), append=False)
    assert appended < 0.8 * ordinary
