"""A pace (spate.pacing): the bytes moved kept to a rate, with a burst of one second after an idle spell, on a
clock of the test's own."""

import pytest

from spate.errors import SettingError
from spate.pacing import BURST_S, Pace


class Clock:
    """A clock that moves only when the pace sleeps, or when the test lets time pass."""

    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.now += s


def _pace(rate: float | None) -> tuple[Pace, Clock]:
    clock = Clock()
    return Pace(rate, clock=lambda: clock.now, sleep=clock.sleep), clock


def test_bytes_are_kept_to_the_rate():
    pace, clock = _pace(100.0)
    for _ in range(4):
        pace.moved(50)
    assert clock.slept == pytest.approx([0.5] * 4) and clock.now == pytest.approx(102.0)


def test_time_spent_elsewhere_counts_toward_the_rate():
    pace, clock = _pace(100.0)
    pace.moved(100)  # 1 s
    clock.now += 0.6  # the caller's own work
    pace.moved(100)
    assert clock.slept == pytest.approx([1.0, 0.4])


def test_an_idle_spell_saves_up_one_second_at_most():
    pace, clock = _pace(100.0)
    pace.moved(100)
    clock.now += 60.0
    pace.moved(int(100 * BURST_S))  # within the burst: at once
    assert clock.slept == pytest.approx([1.0])
    pace.moved(300)  # beyond it: paced again
    assert clock.slept == pytest.approx([1.0, 3.0])


def test_without_a_rate_nothing_waits():
    pace, clock = _pace(None)
    pace.moved(10 ** 12)
    assert clock.slept == []


@pytest.mark.parametrize("rate", [0, -5.0, float("nan")])
def test_a_rate_that_is_not_positive_is_refused(rate):
    with pytest.raises(SettingError, match="a pace must be a positive number of bytes a second"):
        Pace(rate)
