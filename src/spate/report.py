"""Plain-text tables, byte sizes, percentiles and a progress bar for the CLI and benchmarks."""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, TypeVar

T = TypeVar("T")


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.3g}"
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}"
    if isinstance(v, (list, tuple)):
        return ", ".join(map(str, v))
    return str(v)


def format_table(rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None, title: str = "") -> str:
    """Rows of dicts as an aligned text table (numbers right-aligned)."""
    if not rows:
        return f"{title}\n(none)" if title else "(none)"
    cols = list(columns or dict.fromkeys(k for r in rows for k in r))
    cells = [[_cell(r.get(c)) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    numeric = [all(isinstance(r.get(c), (int, float)) or r.get(c) is None for r in rows) for c in cols]

    def line(vals: Sequence[str]) -> str:
        return "  ".join(v.rjust(w) if num else v.ljust(w) for v, w, num in zip(vals, widths, numeric, strict=True))

    out = [title] if title else []
    out += [line(cols), "  ".join("-" * w for w in widths), *(line(r) for r in cells)]
    return "\n".join(s.rstrip() for s in out)


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def progress(items: Iterable[T], total: int, label: str, enabled: bool | None = None) -> Iterator[T]:
    """Yield ``items`` while drawing a progress bar on stderr (only when stderr is a terminal by default)."""
    show = sys.stderr.isatty() if enabled is None else enabled
    started = time.perf_counter()
    for i, item in enumerate(items, 1):
        yield item
        if show:
            frac = i / total if total else 1.0
            bar = "#" * int(frac * 30)
            sys.stderr.write(f"\r{label} [{bar:<30}] {i}/{total} {time.perf_counter() - started:.1f}s")
            sys.stderr.flush()
    if show:
        sys.stderr.write("\n")
