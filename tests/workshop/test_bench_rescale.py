"""``spate bench rescale --quick --json``: online rescale 4 → 8 → 4 of 10 MB of lmdb state vs a normal batch and
vs stop + restart, through the CLI entry: the JSON's contract names and relations that hold whatever the timings."""

from __future__ import annotations

import json
import os

import pytest

from spate.checkpoint.ackinfo import RECOVERY_KINDS

CONTRACT = ("state_mb", "direction", "online_ms", "normal_batch_ms", "restart_ms", "bytes_read")


def test_moved_key_groups():
    from spate_tools.bench.rescale import inherited, moved_key_groups

    # 4 → 8: new 2k keeps old k's local state, new 2k+1's half of old k's range moves
    assert inherited(128, 4, 8) == [0, None, 1, None, 2, None, 3, None]
    assert moved_key_groups(128, 4, 8) == {kg for k in range(4) for kg in range(32 * k + 16, 32 * k + 32)}
    # 8 → 4: new j keeps old 2j's, old 2j+1's key groups move
    assert inherited(128, 8, 4) == [0, 2, 4, 6]
    assert moved_key_groups(128, 8, 4) == moved_key_groups(128, 4, 8)
    assert moved_key_groups(128, 4, 4) == set()
    assert len(moved_key_groups(128, 3, 5)) < 128


def test_bench_rescale_quick_json(tmp_path, capsys):
    from spate_tools.cli import main

    assert main(["bench", "rescale", "--quick", "--json", "--out", str(tmp_path)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["bench"] == "rescale"
    rows = data["results"]
    assert sorted((r["state_mb"], r["direction"]) for r in rows) == [(10, "4->8"), (10, "8->4")]
    for r in rows:
        assert all(k in r for k in CONTRACT), r
        assert all(isinstance(r[k], (int, float)) and r[k] > 0 for k in CONTRACT if k != "direction"
                   and k != "bytes_read"), r
        # the state is the pre-filled 10 MB (plus the batches' new keys), and a rescale reads at most all of it
        assert r["state_bytes"] >= 10 * 1_000_000 * 0.95
        assert 0 <= r["bytes_read"] <= r["state_bytes"]
        assert 0 < r["moved_bytes"] < r["state_bytes"]
        assert r["moved_share"] == pytest.approx(r["moved_bytes"] / r["state_bytes"], abs=1e-3)
        # every subtask of the rescaling batch says how it got its state; some built it from local copies
        new_p = int(r["direction"].split("->")[1])
        assert sum(r["recovery"].values()) == new_p
        assert set(r["recovery"]) <= set(RECOVERY_KINDS), r["recovery"]
        assert r["recovery"].get("rescaled", 0) >= 1, r["recovery"]
        assert r["bytes_read"] + r["local_copy_bytes"] + r["local_moved_bytes"] > 0  # the state came from somewhere
        # stop + restart at another parallelism cannot use the local copies: it reads from storage
        assert r["restart_bytes_read"] >= r["moved_bytes"]
    for name in ("rescale.png", "rescale-times.png"):
        assert os.path.getsize(tmp_path / name) > 0
