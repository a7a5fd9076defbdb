"""``spate bench blog --quick --json``: the blog's two workloads, changelog on vs off, as a subprocess (the
CI smoke run): the JSON's contract names and sane figures."""

from __future__ import annotations

import json
import os
import subprocess
import sys

METRICS = ("checkpoint_ms_p50", "checkpoint_ms_p90", "checkpoint_ms_p99", "checkpoint_ms_p999")


def test_bench_blog_quick_json(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "spate_tools.cli", "bench", "blog", "--quick", "--json", "--out",
                           str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["bench"] == "blog"
    by = {(r["workload"], r["variant"]): r for r in data["results"]}
    assert set(by) == {(w, v) for w in ("value", "window") for v in ("changelog", "full")}
    for r in by.values():
        _check_sane(r)
    # the changelog's checkpoints upload only what changed: less than a full snapshot of the value state
    assert by[("value", "changelog")]["checkpointed_bytes_p50"] < by[("value", "full")]["checkpointed_bytes_p50"]
    # both variants saw the same input and hold the same state
    assert by[("value", "changelog")]["rows"] == by[("value", "full")]["rows"]
    for name in ("blog.png", "blog-durations.png", "blog-sizes.png"):
        assert os.path.getsize(tmp_path / name) > 0


def _check_sane(r: dict) -> None:
    values = [r[m] for m in METRICS]
    assert all(isinstance(v, (int, float)) and v > 0 for v in values), r
    assert values == sorted(values), r  # p50 ≤ p90 ≤ p99 ≤ p99.9
    assert r["checkpoint_ms_p999"] <= r["checkpoint_ms_max"]
    assert r["checkpoints_made"] >= 10 and r["p999_is_max"] == (r["checkpoints_made"] < 1_000)
    assert r["full_checkpoint_bytes"] > 0 and r["live_state_bytes"] > 0
    assert 0 < r["recovery_s"] < 30
    if r["workload"] == "value":  # everything the checkpoint references covers the pre-filled state
        assert r["full_checkpoint_bytes"] >= r["prefilled_keys"] * 500
