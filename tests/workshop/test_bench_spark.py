"""``spate bench spark``: the benchmark's contract (its variants, cases and JSON keys) and a small shape check.

The check runs the command as a user does, in its own process, on a few variants that cover its code paths: the
floor (no state), spate's per-key processor, one of Spark's own APIs and a table sink, on the quick run's first
case made smaller (every row a new key; the other case's input, keys drawn from a few, is checked without
Spark below: the bench runs both cases alike). Every variant on both cases is the benchmark's own run (``spate
bench spark --quick``, a command, about four minutes: docs/benchmarks.md), not this test's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from spate_tools import cli
from spate_tools.bench import spark
from spate_tools.bench.spark import Case

# the command as a user runs it, in its own process (the bench starts and stops Spark contexts of its own), on
# the quick run's first case made smaller
RUN_SMALLER = """
import sys
from spate_tools import cli
from spate_tools.bench import spark
from spate_tools.bench.spark import Case
quick = spark.cases(True)
spark.cases = lambda quick_: (Case("high", 2, 200, None, 2),)
assert [(c.name, c.batches, c.keys is None) for c in spark.cases(True)] == [
    (c.name, c.batches, c.keys is None) for c in quick[:1]], "the first case of --quick, smaller"
sys.exit(cli.main(sys.argv[1:]))
"""
SHAPED = ("floor", "spate", "transformWithStateInPandas", "spate-delta")


def test_the_variants_and_cases_are_the_contract():
    assert spark.VARIANTS == ("floor", "spate", "spate-empty", "spate-batch", "spate-adapter", "spate-adapter-row",
                              "spate-readback", "transformWithState", "transformWithStateInPandas",
                              "applyInPandasWithState", "spate-parquet", "spate-delta", "spate-iceberg",
                              "transformWithState-parquet")
    assert [c.name for c in spark.cases(True)] == ["high", "low"] == [c.name for c in spark.cases(False)][:2]


def test_an_unknown_variant_is_refused_with_the_choices(capsys):
    assert cli.main(["bench", "spark", "--quick", "--variants", "spate,nope"]) == 2
    err = capsys.readouterr().err
    assert "unknown bench spark variants ['nope']" in err and "transformWithStateInPandas" in err


@pytest.mark.spark
def test_bench_spark_quick_json_shape(tmp_path):
    done = subprocess.run([sys.executable, "-c", RUN_SMALLER, "bench", "spark", "--quick", "--json", "--out",
                           str(tmp_path), "--variants", ",".join(SHAPED)],
                          capture_output=True, text=True, timeout=1200, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    data = json.loads(done.stdout)
    finished = [json.loads(line) for line in (tmp_path / "spark-results.jsonl").read_text().splitlines()]
    assert [(r["variant"], r["cardinality"]) for r in finished] == [
        (r["variant"], r["cardinality"]) for r in data["results"]]  # each kept as it finished, in order
    by = {(r["variant"], r["cardinality"]) for r in data["results"]}
    assert by == {(v, "high") for v in SHAPED}
    for r in data["results"]:
        assert r["rows_per_s"] > 0 and r["recovery_s"] > 0 and r["worker_peak_rss_mb"] > 0
        assert (r["files_per_batch"] == 0) == (r["variant"] in ("floor",)), r
        assert r["vs_floor"] is not None, r
        if r["variant"].endswith(("-parquet", "-delta", "-iceberg")):
            assert r["table_rows_ok"] and r["table_rows"] > 0 and r["table_files_per_batch"] > 0, r
            assert r["vs_noop_sink"] is not None, r
        if r["variant"] == "spate":
            assert r["spark_best"] == "transformWithStateInPandas" and r["vs_spark_best"] is not None, r


def test_a_ratio_whose_base_did_not_run_is_empty():
    def ran(variant: str, rows_per_s: int) -> dict:
        return {"variant": variant, "cardinality": "high", "rows_per_s": rows_per_s, "batch_ms_p50": 10.0,
                "files_per_batch": 1.0, "steady_files_per_batch": 1.0}

    results = [ran("floor", 0), ran("spate-adapter-row", 300), ran("transformWithStateInPandas", 100)]
    spark.add_ratios(results)
    adapter = results[1]
    assert adapter["vs_same_api_on_spark"] is None, "its base (transformWithState) did not run"
    assert adapter["spark_best"] == "transformWithStateInPandas" and adapter["vs_spark_best"] == 3.0
    results = [*results[:2], ran("transformWithState", 150)]
    spark.add_ratios(results)
    assert results[1]["vs_same_api_on_spark"] == 2.0


def test_the_inputs_of_both_cases(tmp_path):
    """Every row a new key, or keys drawn from a few; Spark's own variants read the first batches only (hard
    links), and one more batch waits aside for the restart."""
    high, low = spark.write_inputs(Case("high", 2, 200, None, 2), str(tmp_path)), \
        spark.write_inputs(Case("low", 3, 400, 20, 1), str(tmp_path))
    assert high.distinct_keys == (200, 200) and high.source(spark.cases(True)[0], "floor") == high.all
    assert all(0 < n <= 20 for n in low.distinct_keys) and len(low.distinct_keys) == 3
    assert len(os.listdir(low.all)) == 3 and len(os.listdir(low.spark)) == 1 and os.path.isfile(low.extra)
    assert low.source(Case("low", 3, 400, 20, 1), "transformWithState") == low.spark
    rows = [json.loads(line) for name in sorted(os.listdir(low.all))
            for line in Path(low.all, name).read_text().splitlines()]
    assert len(rows) == 1200 and {r["k"] for r in rows} <= {f"key-{i}" for i in range(20)}
