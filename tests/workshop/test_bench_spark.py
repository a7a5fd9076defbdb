"""``spate bench spark --quick``: every variant of the benchmark's contract, on its quick cases (high and low
cardinality; the table sinks on high), with figures that are there. The quick cases run at a tenth of their rows
or less (same batches, both branches of the input: every row a new key, keys drawn from a few): a variant's cost
here is its Spark context, query and restart, and the figures' sizes are the benchmark's to measure, not this
test's (``spate bench spark --quick`` as a command runs the quick cases themselves)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.spark


# the command as a user runs it, in its own process (the bench starts and stops Spark contexts of its own), with
# the quick cases made smaller
RUN_SMALLER = """
import sys
from spate_tools import cli
from spate_tools.bench import spark
from spate_tools.bench.spark import Case
quick = spark.cases(True)
spark.cases = lambda quick_: (Case("high", 2, 200, None, 2), Case("low", 2, 400, 20, 2))
assert [(c.name, c.batches, c.keys is None) for c in spark.cases(True)] == [
    (c.name, c.batches, c.keys is None) for c in quick], "the same cases as --quick, smaller"
sys.exit(cli.main(sys.argv[1:]))
"""


def test_bench_spark_quick_json_shape(tmp_path):
    done = subprocess.run([sys.executable, "-c", RUN_SMALLER, "bench", "spark", "--quick", "--json", "--out",
                           str(tmp_path)], capture_output=True, text=True, timeout=1200, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    data = json.loads(done.stdout)
    finished = [json.loads(line) for line in (tmp_path / "spark-results.jsonl").read_text().splitlines()]
    assert [(r["variant"], r["cardinality"]) for r in finished] == [
        (r["variant"], r["cardinality"]) for r in data["results"]]  # each kept as it finished, in order
    by = {(r["variant"], r["cardinality"]) for r in data["results"]}
    assert by == {(v, c) for v in ("floor", "spate", "spate-empty", "spate-batch", "spate-adapter",
                                   "spate-adapter-row", "transformWithState", "transformWithStateInPandas",
                                   "applyInPandasWithState") for c in ("high", "low")} | {
        (v, "high") for v in ("spate-parquet", "spate-delta", "spate-iceberg", "transformWithState-parquet",
                              "spate-readback")}
    for r in data["results"]:
        assert r["rows_per_s"] > 0 and r["recovery_s"] > 0 and r["worker_peak_rss_mb"] > 0
        assert (r["files_per_batch"] == 0) == (r["variant"] in ("floor",)), r
        if r["variant"].endswith(("-parquet", "-delta", "-iceberg")):
            assert r["table_rows_ok"] and r["table_rows"] > 0 and r["table_files_per_batch"] > 0, r
            assert r["vs_noop_sink"] is not None, r
        if r["variant"] == "spate-readback":
            assert r["vs_jvm_read"] is not None, r
