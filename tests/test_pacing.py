"""A pace (spate.pacing): the bytes moved kept to a rate, with a burst of one second after an idle spell, on a
clock of the test's own."""

import pytest

from spate.errors import SettingError
from spate.pacing import BURST_S, Pace, write_back_behind


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


def test_while_the_disk_keeps_up_bytes_go_at_full_speed_and_save_up_nothing():
    clock, behind = Clock(), [False]
    pace = Pace(100.0, busy=lambda: behind[0], clock=lambda: clock.now, sleep=clock.sleep)
    pace.moved(10_000)
    assert clock.slept == []
    behind[0] = True
    pace.moved(100)
    assert clock.slept == pytest.approx([1.0]), "the bytes moved at full speed are not owed"


def _proc(tmp_path, dirty_kb: int, writeback_kb: int, *, background_bytes: int = 0, ratio: int = 10):
    (tmp_path / "sys" / "vm").mkdir(parents=True)
    (tmp_path / "meminfo").write_text(f"MemTotal:       24000000 kB\nMemAvailable:   20000000 kB\n"
                                      f"Dirty:          {dirty_kb} kB\nWriteback:      {writeback_kb} kB\n")
    (tmp_path / "sys" / "vm" / "dirty_background_bytes").write_text(f"{background_bytes}\n")
    (tmp_path / "sys" / "vm" / "dirty_background_ratio").write_text(f"{ratio}\n")
    return str(tmp_path)


@pytest.mark.parametrize(("dirty_kb", "writeback_kb", "background_bytes", "behind"), [
    (1_000_000, 500_000, 0, False),  # 1.5 GB against 10 % of 20 GB
    (1_900_000, 200_000, 0, True),
    (600, 0, 1 << 20, False),
    (600, 600, 1 << 20, True),  # the bytes threshold, when set, rules
])
def test_the_write_back_is_behind_past_the_kernels_background_threshold(tmp_path, dirty_kb, writeback_kb,
                                                                         background_bytes, behind):
    proc = _proc(tmp_path, dirty_kb, writeback_kb, background_bytes=background_bytes)
    assert write_back_behind(proc) is behind


def test_where_the_write_back_cannot_be_read_a_pace_always_holds(tmp_path):
    assert write_back_behind(str(tmp_path / "no-proc")) is True
