"""PNG plots of benchmark results (matplotlib, headless)."""

from __future__ import annotations

from typing import Any


def plot_results(name: str, results: list[dict[str, Any]], path: str) -> str | None:
    """One bar group per operation, one bar per variant, for every throughput metric in ``results``."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    metrics = [m for m in ("ops_per_s", "mb_per_s") if any(m in r for r in results)]
    fig, axes = plt.subplots(1, len(metrics), figsize=(6 * len(metrics), 4), squeeze=False)
    for ax, metric in zip(axes[0], metrics, strict=True):
        rows = [r for r in results if metric in r]
        ops = list(dict.fromkeys(r["op"] for r in rows))
        variants = list(dict.fromkeys(r["variant"] for r in rows))
        width = 0.8 / len(variants)
        for j, v in enumerate(variants):
            vals = [next((r[metric] for r in rows if r["op"] == op and r["variant"] == v), 0) for op in ops]
            ax.bar([i + j * width for i in range(len(ops))], vals, width, label=v)
        ax.set_xticks([i + width * (len(variants) - 1) / 2 for i in range(len(ops))], ops, rotation=20)
        ax.set_ylabel(metric)
        if metric == "ops_per_s":
            ax.set_yscale("log")
        ax.legend()
    fig.suptitle(f"spate bench {name}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
