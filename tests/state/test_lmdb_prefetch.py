"""Warming a large batch's pages (spate.state.lmdb_prefetch): only when a probe finds them on disk, never changing
what the batch reads or writes, and giving up quietly when lmdb refuses a reader."""

from __future__ import annotations

import lmdb
import pytest

import spate.state.lmdb_prefetch as prefetch
from spate.state.layout import U16, length_prefixed
from spate.state.lmdb_table import LmdbTable


def primary(key: int) -> bytes:
    return U16.pack(0) + length_prefixed(key.to_bytes(4, "big")) + length_prefixed(b"")


@pytest.fixture
def table(tmp_path):
    t = LmdbTable(str(tmp_path / "t"))
    t.put_many([(k % 8, primary(k), b"old%d" % k) for k in range(0, 6000, 2)])
    t.commit()
    yield t
    t.close()


def test_only_a_large_batch_whose_probe_is_slow_is_warmed(table, monkeypatch):
    keys = [U16.pack(k % 8) + primary(k) for k in range(6000)]
    monkeypatch.setattr(prefetch, "COLD_PROBE_S", float("inf"))  # no probe is slow: the pages are in memory
    assert not prefetch.warm(table.env, keys)
    monkeypatch.setattr(prefetch, "COLD_PROBE_S", 0.0)  # every probe is slow
    assert not prefetch.warm(table.env, keys[:prefetch.MIN_KEYS - 1])  # too few keys to be worth threads
    assert prefetch.warm(table.env, keys)


def test_a_warmed_batch_reads_and_writes_what_an_unwarmed_one_does(table, monkeypatch):
    warmed: list[bool] = []
    real = prefetch.warm

    def recorded(env, keys):
        warmed.append(real(env, keys))
        return warmed[-1]

    monkeypatch.setattr(prefetch, "COLD_PROBE_S", 0.0)  # every probe counts as cold: the threads always read
    monkeypatch.setattr("spate.state.lmdb_table.warm", recorded)
    entries = [(k % 8, primary(k), b"new%d" % k) for k in range(6000)]
    assert table.put_many_existed(entries) == [k % 2 == 0 for k in range(6000)]
    assert table.get_many([k % 8 for k in range(6001)], [primary(k) for k in range(6001)]) == \
        [b"new%d" % k for k in range(6000)] + [None]
    assert warmed == [True, True]


def test_a_reader_lmdb_refuses_gives_the_warming_up(table, monkeypatch):
    class RefusingEnv:  # a fake for fault injection: lmdb refuses every transaction
        def begin(self):
            raise lmdb.MapResizedError("the map was grown by another process")

    monkeypatch.setattr(prefetch, "COLD_PROBE_S", 0.0)
    assert not prefetch.warm(RefusingEnv(), [b"k%05d" % i for i in range(prefetch.MIN_KEYS)])
