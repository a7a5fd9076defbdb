"""Drivers racing on one root, in real processes (issue 9: simultaneous, staggered, three drivers, and a
frozen driver waking up stale)."""

from __future__ import annotations

import json

from spate_tools.campaigns.driver_races import DriverReport, RaceResult
from spate_tools.cli import main


def test_short_race_campaign_loses_nothing(capsys):
    code = main(["fuzz", "--drivers", "1", "--seed", "7", "--json"])
    result = json.loads(capsys.readouterr().out)
    assert result["campaign"] == "drivers" and result["races"] == 4
    assert result["by_kind"] == {"simultaneous": 1, "staggered": 1, "three": 1, "paused": 1}
    assert code == 0 and result["findings"] == []
    assert result["shared_epochs"] == result["double_commits"] == result["lost_checkpoints"] == 0
    assert result["fenced_drivers"] >= 2, "the simultaneous and the three-driver race fence a driver each"


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
    rolled_back = RaceResult("paused", 4, [DriverReport(epoch=2, resumed_from=5), DriverReport(epoch=3)], 4)
    assert rolled_back.lost, "a later driver resumed from less than an earlier driver saw"
    three = RaceResult("three", 5, [DriverReport(epoch=2, committed=[3]), DriverReport(epoch=3, committed=[4]),
                                    DriverReport(epoch=4, committed=[3, 5])], 5)
    assert three.double_commits == 1 and not three.shared_epoch
