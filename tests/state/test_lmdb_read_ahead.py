"""Reading key groups ahead of a scan (spate.state.lmdb_read_ahead): started only by a slow read, staying within
its window in front of the reader, never behind it, and giving up quietly when lmdb refuses a reader."""

from __future__ import annotations

import threading
import time

import lmdb
import pytest

import spate.state.lmdb_read_ahead as read_ahead
from spate.state.lmdb_read_ahead import KeyGroupReadAhead
from spate.state.lmdb_table import LmdbTable


@pytest.fixture
def table(tmp_path):
    t = LmdbTable(str(tmp_path / "t"))
    t.put_many([(k % 16, b"key-%d" % k, b"value-%d" % k) for k in range(1600)])
    t.commit()
    yield t
    t.close()


@pytest.fixture
def walked(monkeypatch) -> list[int]:
    """The key groups the threads walk, recorded."""
    seen: list[int] = []
    real = read_ahead.key_group_keys

    def recorded(cur, kg):
        seen.append(kg)
        return real(cur, kg)

    monkeypatch.setattr(read_ahead, "key_group_keys", recorded)
    return seen


def _until(condition, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "the read-ahead threads did not get there"
        time.sleep(0.01)


def test_only_slow_reads_of_enough_bytes_start_the_threads(table):
    with KeyGroupReadAhead(table.env, range(16)) as ahead:
        ahead.reading(0)
        ahead.read(read_ahead.MIN_PROBE_BYTES - 1, 3600.0)  # slow, but too small to tell
        assert not ahead.started
    with KeyGroupReadAhead(table.env, range(16)) as ahead:
        ahead.reading(0)
        ahead.read(read_ahead.MIN_PROBE_BYTES, 1e-9)  # large, and fast: in memory
        assert not ahead.started
        ahead.read(read_ahead.MIN_PROBE_BYTES, 3600.0)  # judged on its own: the fast one was judged already
        assert ahead.started


def test_small_key_groups_are_judged_together(table):
    with KeyGroupReadAhead(table.env, range(16)) as ahead:
        for kg in range(4):  # four key groups of a quarter of the bytes each, all slow
            ahead.reading(kg)
            assert not ahead.started
            ahead.read(read_ahead.MIN_PROBE_BYTES // 4, 900.0)
        assert ahead.started


def test_the_threads_stay_within_their_window_in_front_of_the_reader(table, walked, monkeypatch):
    monkeypatch.setattr(read_ahead, "AHEAD", 2)
    with KeyGroupReadAhead(table.env, range(16)) as ahead:
        ahead.reading(0)
        ahead.read(read_ahead.MIN_PROBE_BYTES, 3600.0)
        _until(lambda: len(walked) == 2)
        ahead.reading(5)  # the reader moved on: 3 and 4 are behind it now
        _until(lambda: len(walked) == 4)
        time.sleep(0.05)  # nothing more until the reader moves again
        assert sorted(walked) == [1, 2, 6, 7]
        ahead.reading(15)  # the last: nothing is left in front of it
    assert sorted(walked) == [1, 2, 6, 7]
    assert not [t for t in threading.enumerate() if t.name == "spate-read-ahead"], "leaving joined them"


def test_a_reader_lmdb_refuses_gives_the_reading_ahead_up(table):
    class RefusingEnv:  # a fake for fault injection: lmdb refuses every transaction
        def begin(self):
            raise lmdb.MapResizedError("the map was grown by another process")

    with KeyGroupReadAhead(RefusingEnv(), range(16)) as ahead:
        ahead.reading(0)
        ahead.read(read_ahead.MIN_PROBE_BYTES, 3600.0)
        assert ahead.started
        _until(lambda: not [t for t in threading.enumerate() if t.name == "spate-read-ahead"])  # all gave up
        ahead.reading(1)
