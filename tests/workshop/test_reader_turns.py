"""``spate bench scale``'s reader turns (:mod:`spate_tools.bench.reader_turns`): a real materialization reader
process (started as the subtask starts it, waiting for its first message) is found among this process's
children, held stopped in a holding turn, let run again in the next and when the turns end; a batch during which
a reader started or ended counts as neither."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from spate.changelog.process_view import READER_MODULE
from spate_tools.bench.reader_turns import ReaderTurns, reader_pids

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the readers are found in /proc")


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    return stat[stat.rindex(b")") + 2:].split()[0].decode()


def _wait_state(pid: int, wanted: set[str]) -> str:
    deadline = time.monotonic() + 10
    while (state := _state(pid)) not in wanted and time.monotonic() < deadline:
        time.sleep(0.01)
    return state


@pytest.fixture
def reader():
    proc = subprocess.Popen([sys.executable, "-m", READER_MODULE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait(10)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_reader_is_held_stopped_in_turns_and_let_run_again(reader):
    other = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        assert reader_pids() == {reader.pid}  # a child that is not a reader is not one
    finally:
        other.communicate(b"")
    clock = Clock()
    with ReaderTurns(5.0, clock=clock) as turns:
        turn = turns.before_batch()  # the first turn lets the readers run
        assert not turn.holding and turns.after_batch(turn) == "running"
        clock.now = 5.0
        turn = turns.before_batch()
        assert turn.holding and _wait_state(reader.pid, {"T"}) == "T"
        assert turns.after_batch(turn) == "stopped"
        clock.now = 7.0  # still the holding turn: it stays stopped
        assert turns.before_batch().holding and _state(reader.pid) == "T"
        clock.now = 10.0
        turn = turns.before_batch()
        assert not turn.holding and _wait_state(reader.pid, {"S", "R"}) in {"S", "R"}
        clock.now = 15.0
        assert turns.before_batch().holding and _wait_state(reader.pid, {"T"}) == "T"
    assert _wait_state(reader.pid, {"S", "R"}) in {"S", "R"}  # leaving the turns lets every held reader run
    reader.stdin.close()  # the reader ends: no Start message came
    assert reader.wait(10) == 2
    assert reader_pids() == frozenset()


def test_a_batch_during_which_a_reader_started_or_ended_counts_as_neither():
    found = [frozenset(), frozenset({7})]  # fault injection: the readers a finder sees, one call after another

    def find() -> frozenset[int]:
        return found.pop(0) if len(found) > 1 else found[0]

    turns = ReaderTurns(60.0, find=find)
    turn = turns.before_batch()  # none
    assert turns.after_batch(turn) is None  # one started during the batch
    assert turns.after_batch(turns.before_batch()) == "running"
    none = ReaderTurns(60.0, find=frozenset)
    assert none.after_batch(none.before_batch()) == "none"
