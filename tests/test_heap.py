"""The heap around a bulk phase (``spate.heap``): the cyclic GC paused inside and as it was after, the free heap
returned to the operating system before the phase and when it ends (even when it raises), garbage cycles collected
before a restore. That a materialization and a restore hand it back: tests/changelog/test_changelog_restore.py."""

from __future__ import annotations

import gc
import platform
import sys

import pytest

from spate import heap


@pytest.fixture
def trims(monkeypatch) -> list[int]:
    calls: list[int] = []
    monkeypatch.setattr(heap, "MALLOC_TRIM", lambda pad: calls.append(pad) or 1)
    return calls


def test_malloc_trim_is_found_where_the_c_library_is_glibc():
    glibc = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"
    assert (heap.MALLOC_TRIM is not None) == glibc
    heap.return_free_heap()  # a trim on glibc, nothing elsewhere: no error either way


def test_a_bulk_phase_returns_the_heap_before_and_after_and_pauses_the_gc(trims):
    assert gc.isenabled()
    with heap.bulk_phase():
        assert not gc.isenabled() and trims == [0]
    assert gc.isenabled() and trims == [0, 0]


def test_a_phase_that_raises_still_returns_the_heap_and_a_disabled_gc_stays_disabled(trims):
    gc.disable()
    try:
        with pytest.raises(ValueError), heap.bulk_phase():
            raise ValueError("in the phase")
        assert not gc.isenabled() and trims == [0, 0]
    finally:
        gc.enable()



def test_a_restore_phase_collects_the_garbage_cycles_left_before_it(trims):
    import weakref

    class Node:
        pass

    def a_cycle() -> weakref.ref:
        node = Node()
        node.me = node  # type: ignore[attr-defined]
        return weakref.ref(node)

    gc.disable()  # no automatic collection between making the garbage and the phase
    try:
        left = a_cycle()
        with heap.bulk_phase():
            assert left() is not None, "a snapshot's phase does not collect: the cycle waits for the GC"
        kept = a_cycle()
        with heap.bulk_phase(collect=True):
            assert kept() is None and left() is None
    finally:
        gc.enable()
