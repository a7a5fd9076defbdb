"""``spate bench scale`` at a tiny size (two sizes of a few MB, both variants), through ``run_bench``'s JSON: the
contract's keys, sane figures, and the state restored at parallelism 1 and 2 read back value by value."""

from __future__ import annotations

import json
import os
import shutil
from functools import partial

import numpy as np
import pytest

from spate.errors import SpateError
from spate_tools.bench import run_bench, scale_report, scale_watch, scale_workload
from spate_tools.bench.scale import bench_scale, rows_log

CONTRACT = ("state_gb", "variant", "keys", "batch_ms_p50", "batch_ms_p99", "checkpoint_ms_p50", "checkpoint_ms_p999",
            "materialization_s", "checkpoint_bytes", "recovery_s", "recovery_rescaled_s", "copy_s", "anon_rss_mb_max")
SIZES = (0.002, 0.004)  # 4,000 and 8,000 keys


def test_bench_scale_tiny_json(tmp_path, capsys):
    rows_file = tmp_path / "rows" / "scale-rows.jsonl"
    rows_file.parent.mkdir()
    rows_file.write_text("a row of an earlier run\n")
    bench = partial(bench_scale, out_dir=str(tmp_path), sizes_gb=SIZES, batches=4, updates=1_000, new_keys=100,
                    max_batches=60, quiet_batches=3, verify=True, on_row=rows_log(str(rows_file)))
    assert run_bench("scale", quick=True, as_json=True, out_dir=str(tmp_path), bench=bench) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["bench"] == "scale"
    # each row was logged as its variant finished, in the order they ran; the earlier run's line is gone
    assert [json.loads(line) for line in rows_file.read_text().splitlines()] == data["results"]
    by = {(r["state_gb"], r["variant"]): r for r in data["results"]}
    assert set(by) == {(gb, v) for gb in SIZES for v in ("changelog", "full")}
    for (gb, variant), r in by.items():
        assert all(k in r for k in CONTRACT), r
        loaded = int(gb * 1e9) // 500
        assert r["keys"] == loaded + r["batches"] * 100 + 100  # the warm-up batch adds new keys too
        assert r["batches"] >= 4
        assert 0 < r["batch_ms_p50"] <= r["batch_ms_p99"]
        assert 0 < r["checkpoint_ms_p50"] <= r["checkpoint_ms_p999"]
        assert r["checkpoint_bytes"] >= r["keys"] * 500  # the last checkpoint covers every value
        assert r["recovery_s"] > 0 and r["recovery_rescaled_s"] > 0 and r["copy_s"] > 0
        assert r["restore_s"] <= r["recovery_s"]
        assert 0 < r["anon_rss_mb_max"] < 4_000
        quiet = {"no materialization"} if variant == "changelog" else set()
        assert set(r["anon_rss_mb_by_phase"]) == {"measure", "recovery", "rescaled"} | quiet
        assert max(r["anon_rss_mb_by_phase"].values()) == r["anon_rss_mb_max"]
        # both restarts restored from checkpoint storage (the local directory was empty) the state written:
        # every key, each with the value of the batch that wrote it last
        assert r["recovered"] == ["restored"] and r["recovered_rescaled"] == ["restored"]
        assert r["recovered_entries"] == r["recovered_rescaled_entries"] == r["keys"]
        assert r["state_checked"] is True
        assert r["disk_bytes_max"] > r["checkpoint_bytes"]
        if variant == "changelog":  # it runs until a materialization completed
            assert r["materialization_s"] > 0 and r["materializations"] >= 1
            # the batches with no materialization ran first, on a table of their own (removed)
            assert r["batches_no_materialization"] == 3 and r["batch_ms_p50_no_materialization"] > 0
            assert r["batch_p50_vs_no_materialization"] == round(r["batch_ms_p50_first_measured"]
                                                                 / r["batch_ms_p50_no_materialization"], 2)
        else:
            assert r["materialization_s"] is None and r["materializations"] == 0
            assert "batches_no_materialization" not in r
    # the run's files are gone; the charts are there
    assert [p for p in os.listdir(tmp_path) if p.startswith(".spate-bench-scale-")] == []
    for name in ("scale.png", "scale-times.png"):
        assert os.path.getsize(tmp_path / name) > 0


def test_no_materialization_figures():
    got = scale_report.quiet_figures([400.0, 420.0, 410.0, 480.0], [440.0, 430.0, 450.0, 520.0])
    assert got == {"batches_no_materialization": 4, "batch_ms_p50_no_materialization": 410.0,
                   "batch_ms_p99_no_materialization": 480.0, "batch_ms_p50_first_measured": 440.0,
                   "batch_ms_p99_first_measured": 520.0, "batch_p50_vs_no_materialization": 1.07,
                   "batch_p99_vs_no_materialization": 1.08}
    assert scale_report.quiet_figures([], [1.0]) == {}


def test_goals_table():
    rows = [{"state_gb": gb, "variant": v, "batch_ms_p99": 100.0 * gb, "checkpoint_ms_p999": 10.0, "recovery_s": rec,
             "recovery_rescaled_s": 3.0, "copy_s": 1.0, "anon_rss_mb_max": 500.0}
            for gb in (1, 10) for v, rec in (("changelog", 1.5), ("full", 2.0))]
    got = {(r["goal"], r["where"]): (r["value"], r["met"]) for r in scale_report.ratios(rows)}
    assert got[("recovery / copy_s", "10 GB full")] == (2.0, "yes")
    assert got[("rescaled recovery / copy_s", "1 GB changelog")] == (3.0, "NO")
    assert got[("recovery changelog / full", "10 GB")] == (0.75, "yes")
    assert got[("batch p99 large / small", "full: 10 / 1 GB")] == (10.0, "NO")
    assert got[("changelog checkpoint p99.9 large / small", "10 / 1 GB")] == (1.0, "yes")
    assert got[("anon RSS MB at the largest size", "10 GB changelog")] == (500.0, "yes")


def test_materialization_spans():
    def sample(started=False, ms=None):
        return {"materialization_started": started, "materialization_ms": ms, "batch_ms": 1.0}

    # started after batch 1's ack, picked up by batch 4's checkpoint; another started after batch 4, never done
    samples = [sample(), sample(True), sample(), sample(), sample(True, 900.0), sample(), sample()]
    assert scale_report.materialization_spans(samples) == ([(2, 4), (5, 6)], [900.0])
    # one started by the warm-up batch, before the first sample, picked up by batch 2's checkpoint
    samples = [{**sample(), "materialization_running": True}, sample(), sample(False, 700.0), sample()]
    assert scale_report.materialization_spans(samples) == ([(0, 2)], [700.0])


def test_key_groups_are_sparks():
    scale_workload.check_key_groups()  # raises if the vectorized hash differs from the library's
    keys = np.array([0, 1, 42, -7, 2**63 - 1], dtype=np.int64)
    from spate.keygroups import compile_key_hasher

    hasher = compile_key_hasher(None)
    assert scale_workload.key_groups(keys).tolist() == [hasher(int(k)) % 128 for k in keys]


def test_refuses_without_disk_space(tmp_path, monkeypatch):
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(scale_watch.shutil, "disk_usage", lambda _path: usage._replace(free=10 * scale_workload.GB))
    need_gb = scale_watch.DISK_FACTOR * 10
    with pytest.raises(SpateError, match=rf"needs about {need_gb:.1f} GB free .* has 10.0 GB free"):
        bench_scale(False, out_dir=str(tmp_path))
    assert os.listdir(tmp_path) == []  # refused before writing anything


def test_a_variant_that_would_fill_the_disk_stops_and_the_run_goes_on(tmp_path, monkeypatch):
    """The measured phase stops a variant once its disk has less than the reserve free (an lmdb table growing
    under a long materialization would otherwise fill it); its row says why and keeps the batches measured,
    every row is handed over as soon as its variant ends, and its files are gone."""
    monkeypatch.setattr(scale_watch, "DISK_RESERVE", shutil.disk_usage(tmp_path).free + 2**40)
    handed: list[dict] = []
    results, text = bench_scale(False, out_dir=str(tmp_path), sizes_gb=(0.002,), batches=3, updates=500,
                                new_keys=50, quiet_batches=0, chart=False, variants=("full", "changelog"),
                                on_row=handed.append, isolate=False)  # in this process: the patch holds there
    assert [r["variant"] for r in results] == ["full", "changelog"] and handed == results
    for r in results:
        assert r["error"].startswith("out of disk: less than") and "local lmdb table had grown to" in r["error"]
        assert r["batches"] == 1 and r["batch_ms_p50"] > 0 and r["recovery_s"] is None
    assert "out of disk" in text
    assert [p for p in os.listdir(tmp_path) if p.startswith(".spate-bench-scale-")] == []
