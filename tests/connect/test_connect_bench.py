"""``spate bench connect --quick``'s shape: its variants and JSON keys, every batch of the source run by each
variant. Figures are measured by the command, not asserted here."""

from __future__ import annotations

import pytest

from spate_tools.bench.connect import VARIANTS, bench_connect
from spate_tools.standalone import QUICK_JVM_OPTIONS

pytestmark = pytest.mark.spark
KEYS = {"variant", "executors", "rounds", "batches", "batch_ms_p50", "batch_ms_p90", "local_reuse", "restored",
        "caught_up", "vs_classic"}


def test_bench_connect_quick_shape():
    rows, table = bench_connect(quick=True, jvm_options=QUICK_JVM_OPTIONS)
    assert [r["variant"] for r in rows] == list(VARIANTS) == ["classic", "connect", "connect-local"]
    for row in rows:
        assert set(row) == KEYS, row
        assert row["batches"] == 6 and row["batch_ms_p50"] > 0 and 0 <= row["local_reuse"] <= 1
    assert rows[0]["vs_classic"] == 1.0 and rows[0]["executors"] == 2 and rows[2]["executors"] == 1
    assert "vs_classic" in table
