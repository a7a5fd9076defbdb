"""Benchmarks: ``spate bench NAME [--quick] [--json]``. Each prints a table, writes PNG plots and, with
``--json``, one object ``{"bench": NAME, "results": [{"variant": ..., <parameters>, <metrics>}, ...]}``."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from typing import Any

BenchFn = Callable[[bool], tuple[list[dict[str, Any]], str]]


def _benches() -> dict[str, BenchFn]:
    from spate_tools.bench.bigstate import bench_bigstate
    from spate_tools.bench.changelog import bench_changelog
    from spate_tools.bench.filemerging import bench_filemerging
    from spate_tools.bench.state import bench_state

    return {"state": bench_state, "changelog": bench_changelog, "filemerging": bench_filemerging,
            "bigstate": bench_bigstate}


def run_bench(name: str, quick: bool = False, as_json: bool = False, out_dir: str = "bench-out",
              bench: BenchFn | None = None) -> int:
    """Run benchmark ``name`` (or the given ``bench`` under that name); print its table (or JSON) and write
    its plot to ``out_dir``."""
    benches = _benches()
    if bench is None and name not in benches:
        raise ValueError(f"unknown benchmark {name!r}; available: {sorted(benches)}")
    results, table = (bench or benches[name])(quick)
    os.makedirs(out_dir, exist_ok=True)
    from spate_tools.bench.plot import plot_results

    png = plot_results(name, results, os.path.join(out_dir, f"{name}.png"))
    if as_json:
        print(json.dumps({"bench": name, "results": results}))
    else:
        print(table)
        print(f"\nplot: {png}" if png else "\nplot: skipped (matplotlib is not installed)")
    sys.stdout.flush()
    return 0
