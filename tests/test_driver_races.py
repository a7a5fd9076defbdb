"""Two drivers racing on one root, in real processes (issue 9: simultaneous and staggered starts)."""

from __future__ import annotations

from spate.driver_races import DriverReport, RaceResult, campaign


def test_short_race_campaign_loses_nothing():
    result = campaign(races=2, seed=7, progress=False)
    assert result.races == 4 and result.by_kind == {"simultaneous": 2, "staggered": 2}
    assert result.clean, result.findings
    assert result.fenced_drivers >= 2, "every race fences one of the two drivers (or the first, later)"


def test_race_findings_are_counted():
    """The counters see what they are for: a shared epoch, a batch committed twice, a committed checkpoint
    the restart did not resume from, a driver that failed."""
    both = RaceResult("simultaneous", 1, [DriverReport(epoch=3, committed=[2, 3]),
                                           DriverReport(epoch=3, committed=[3])], resumed_from=2)
    assert both.shared_epoch and both.double_commits == 1 and both.lost and not both.failed
    clean = RaceResult("staggered", 2, [DriverReport(epoch=3, committed=[2], fenced="taken over"),
                                        DriverReport(epoch=4, committed=[3, 4])], resumed_from=4)
    assert not (clean.shared_epoch or clean.double_commits or clean.lost or clean.failed)
    broken = RaceResult("staggered", 3, [DriverReport(failed="FileNotFoundError"), DriverReport(epoch=2)], 1)
    assert broken.failed
