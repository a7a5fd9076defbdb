"""How ``spate bench scale`` (:mod:`spate_tools.bench.scale`) reads and shows its figures: the batches around a
materialization (:func:`materialization_spans`), each goal's ratio (:func:`ratios`, against :data:`GOALS`), the
table, and the chart of batch and checkpoint times over the measured phase (:func:`plot_times`)."""

from __future__ import annotations

import os
from typing import Any

from spate.report import format_table, human_bytes, percentile
from spate_tools.bench.scale_workload import VALUE_BYTES, VARIANTS, Setup

NEAR = 2  # batches before and after a materialization that count as "around" it
MIN_CHECKPOINTS_FOR_P999 = 1_000
GOALS = {"recovery / copy_s": ("≤ 2", 2.0), "rescaled recovery / copy_s": ("≤ 2.5", 2.5),
         "recovery changelog / full": ("≤ 1.0", 1.0), "batch p99 large / small": ("≤ 1.2", 1.2),
         "changelog checkpoint p99.9 large / small": ("≤ 1.2", 1.2), "anon RSS MB at the largest size": ("≤ 1,024",
                                                                                                       1024.0)}


def materialization_spans(samples: list[dict[str, Any]]) -> tuple[list[tuple[int, int]], list[float]]:
    """Batches during which a materialization ran, as (first, last) sample indexes, and the durations (ms) of
    those that completed. One starts after the batch whose ack says so (the first sample's
    ``materialization_running``: one started before it, by the warm-up batch); its result is picked up by a later
    checkpoint (which reports its duration), at the latest one batch after it finished."""
    spans: list[tuple[int, int]] = []
    done: list[float] = []
    open_at = 0 if samples and samples[0].get("materialization_running") else None
    for i, x in enumerate(samples):
        if x["materialization_ms"] is not None and open_at is not None:
            spans.append((open_at, i))
            done.append(x["materialization_ms"])
            open_at = None
        if x["materialization_started"]:
            open_at = i + 1
    if open_at is not None and open_at < len(samples):
        spans.append((open_at, len(samples) - 1))
    return spans, done


def quiet_figures(quiet_ms: list[float], measured_ms: list[float]) -> dict[str, Any]:
    """The batches with no materialization (``quiet_ms``, ms each) against as many of the measured phase's first
    (``measured_ms``, the same keys): p50 and p99 of each, and the measured over the quiet; empty without such
    batches."""
    if not quiet_ms:
        return {}
    p50, p99 = percentile(quiet_ms, 50), percentile(quiet_ms, 99)
    m50, m99 = percentile(measured_ms, 50), percentile(measured_ms, 99)
    return {"batches_no_materialization": len(quiet_ms), "batch_ms_p50_no_materialization": rounded(p50),
            "batch_ms_p99_no_materialization": rounded(p99), "batch_ms_p50_first_measured": rounded(m50),
            "batch_ms_p99_first_measured": rounded(m99), "batch_p50_vs_no_materialization": _ratio(m50, p50),
            "batch_p99_vs_no_materialization": _ratio(m99, p99)}


def rounded(x: float | None) -> float | None:
    """A figure to two decimals (None stays None)."""
    return None if x is None else round(x, 2)


def ratios(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each goal's ratio, per size and variant where it applies, with whether it is met."""
    by = {(r["state_gb"], r["variant"]): r for r in results}
    sizes = sorted({r["state_gb"] for r in results})
    out: list[dict[str, Any]] = []

    def add(goal: str, where: str, value: float | None) -> None:
        text, bound = GOALS[goal]
        out.append({"goal": goal, "where": where, "value": value, "bound": text,
                    "met": "-" if value is None else ("yes" if value <= bound else "NO")})

    for r in results:
        where = f"{r['state_gb']:g} GB {r['variant']}"
        add("recovery / copy_s", where, _ratio(r["recovery_s"], r["copy_s"]))
        add("rescaled recovery / copy_s", where, _ratio(r["recovery_rescaled_s"], r["copy_s"]))
    for gb in sizes:
        c, f = by.get((gb, "changelog")), by.get((gb, "full"))
        if c and f:
            add("recovery changelog / full", f"{gb:g} GB", _ratio(c["recovery_s"], f["recovery_s"]))
    if len(sizes) > 1:
        small, large = sizes[0], sizes[-1]
        for v in VARIANTS:
            a, b = by.get((small, v)), by.get((large, v))
            if a and b:
                add("batch p99 large / small", f"{v}: {large:g} / {small:g} GB", _ratio(b["batch_ms_p99"],
                                                                                   a["batch_ms_p99"]))
        a, b = by.get((small, "changelog")), by.get((large, "changelog"))
        if a and b:
            add("changelog checkpoint p99.9 large / small", f"{large:g} / {small:g} GB",
                _ratio(b["checkpoint_ms_p999"], a["checkpoint_ms_p999"]))
    for v in VARIANTS:
        largest = by.get((sizes[-1], v)) if sizes else None
        if largest:
            add("anon RSS MB at the largest size", f"{sizes[-1]:g} GB {v}", largest["anon_rss_mb_max"])
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a is not None and b else None


def table(results: list[dict[str, Any]], s: Setup, elapsed_s: float) -> str:
    done = [r for r in results if "error" not in r]
    rows = [{"state": f"{r['state_gb']:g} GB", "variant": r["variant"], "keys": r["keys"], "batches": r["batches"],
             "batch p50 ms": r["batch_ms_p50"], "batch p99 ms": r["batch_ms_p99"],
             "checkpoint p50 ms": r["checkpoint_ms_p50"], "checkpoint p99.9 ms": r["checkpoint_ms_p999"],
             "materialization s (n)": "-" if r["materialization_s"] is None else
             f"{r['materialization_s']:g} ({r['materializations']})",
             "batch p99 ms materializing / other": f"{_cell(r['batch_ms_p99_materializing'])} / "
                                                   f"{_cell(r['batch_ms_p99_other'])}",
             "batch p50 / p99 ms, no materialization": _quiet_cell(r),
             "checkpoint": human_bytes(r["checkpoint_bytes"]), "copy s": r["copy_s"], "recovery s": r["recovery_s"],
             "rescaled s": r["recovery_rescaled_s"],
             "restore s (1 / 2)": f"{r['restore_s']:g} / {r['restore_rescaled_s']:g}",
             "anon RSS MB": r["anon_rss_mb_max"], "load: anon MB, s": f"{r['anon_rss_mb_load']:g}, {r['load_s']:g}",
             "disk peak": f"{human_bytes(r['disk_bytes_max'])} ({r['disk_per_state']:g}×)",
             "state checked": "yes" if r["state_checked"] else "NO"} for r in done]
    title = (f"spate bench scale: one subtask, lmdb, file merging across, value state of {VALUE_BYTES}-byte values; "
             f"batches of {s.updates:,} random existing keys + {s.new_keys:,} new keys ({s.batches} at least, "
             f"{s.full_batches or s.batches} with the changelog off; with the changelog until "
             f"{s.min_materializations} materialization(s) completed, at most "
             f"{s.max_batches}; before them, {s.quiet_batches} with the changelog on and no materialization); "
             "recovery: a new runner, empty local directory, up to its first batch's acks; "
             f"{elapsed_s / 60:.1f} min in all")
    notes = [f"p99.9 is the maximum below {MIN_CHECKPOINTS_FOR_P999:,} checkpoints; materializing: the batches "
             f"while a materialization ran, ± {NEAR}"] if any(r["p999_is_max"] for r in done) else []
    notes += [f"{r['state_gb']:g} GB {r['variant']}: FAILED, {r['error']}" for r in results if "error" in r]
    return (format_table(rows, title=title) + "".join(f"\n{n}" for n in notes) + "\n\n"
            + format_table(ratios(results), title="goals (10 GB vs 1 GB in a full run; --quick: 1 GB vs 0.2 GB)"))


def _quiet_cell(r: dict[str, Any]) -> str:
    if "batches_no_materialization" not in r:
        return "-"
    return (f"{_cell(r['batch_ms_p50_no_materialization'])} / {_cell(r['batch_ms_p99_no_materialization'])} "
            f"(first measured: {r['batch_p50_vs_no_materialization']:g}× / {r['batch_p99_vs_no_materialization']:g}×)")


def _cell(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


# -- chart -------------------------------------------------------------------------------------------------------
def plot_times(series: dict[tuple[float, str], list[dict[str, Any]]], out_dir: str) -> str | None:
    """Batch and checkpoint times over the measured phase, one column per state size, one line per variant;
    the changelog's materializations shaded."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    sizes = sorted({gb for gb, _ in series})
    if not sizes:
        return None
    fig, axes = plt.subplots(2, len(sizes), figsize=(6 * len(sizes), 7), squeeze=False, sharex="col")
    for col, gb in enumerate(sizes):
        for row, (metric, ylabel) in enumerate((("batch_ms", "batch (ms)"), ("checkpoint_ms", "checkpoint (ms)"))):
            ax = axes[row][col]
            for variant in VARIANTS:
                points = series.get((gb, variant), [])
                ax.plot([p["at_s"] for p in points], [p[metric] for p in points], label=variant,
                        marker="." if len(points) < 200 else None, linewidth=0.8)
                if variant == "changelog":
                    spans, _ = materialization_spans(points)
                    for k, (a, b) in enumerate(spans):
                        ax.axvspan(points[a]["at_s"], points[b]["at_s"], color="tab:green", alpha=0.12,
                                   label="materializing" if k == 0 else None)
            ax.set_yscale("log")
            ax.set_ylabel(ylabel)
            if row == 0:
                ax.set_title(f"{gb:g} GB of state")
            else:
                ax.set_xlabel("time since the measured phase started (s)")
            ax.legend()
    fig.suptitle("spate bench scale: batch and checkpoint times, changelog vs full snapshots (lmdb, one subtask)")
    fig.tight_layout()
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "scale-times.png")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
