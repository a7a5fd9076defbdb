"""PNG plots of benchmark results (matplotlib, headless): one panel per metric, one bar per variant."""

from __future__ import annotations

from typing import Any

METRICS = ("ops_per_s", "mb_per_s", "checkpoint_ms_p50", "checkpoint_ms_p99", "checkpointed_bytes_p50",
           "full_checkpoint_bytes", "recovery_s", "files_created", "files_alive", "space_amplification", "rows_per_s",
           "files_per_batch", "peak_rss_mb", "anon_rss_mb", "normal_batch_ms", "online_ms", "restart_ms")
LOG_SCALE = {"ops_per_s", "rows_per_s", "checkpoint_ms_p50", "checkpoint_ms_p99", "checkpointed_bytes_p50",
             "full_checkpoint_bytes", "normal_batch_ms", "online_ms", "restart_ms"}


def plot_results(name: str, results: list[dict[str, Any]], path: str) -> str | None:
    """Bars grouped by the results' ``op`` (or ``state_mb``), one per variant, for each metric present."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    metrics = [m for m in METRICS if any(m in r for r in results)]
    if not metrics:
        return None
    group = next((g for g in ("op", "state_mb", "cardinality", "checkpoints", "keys") if any(g in r for r in results)),
                 "variant")
    fig, axes = plt.subplots(1, len(metrics), figsize=(5 * len(metrics), 4), squeeze=False)
    for ax, metric in zip(axes[0], metrics, strict=True):
        rows = [r for r in results if metric in r]
        groups = list(dict.fromkeys(r[group] for r in rows))
        variants = list(dict.fromkeys(r["variant"] for r in rows))
        width = 0.8 / len(variants)
        for j, v in enumerate(variants):
            vals = [next((r[metric] for r in rows if r[group] == g and r["variant"] == v), 0) for g in groups]
            ax.bar([i + j * width for i in range(len(groups))], vals, width, label=v)
        ax.set_xticks([i + width * (len(variants) - 1) / 2 for i in range(len(groups))], [str(g) for g in groups],
                      rotation=20)
        ax.set_xlabel(group)
        ax.set_ylabel(metric)
        if metric in LOG_SCALE:
            ax.set_yscale("log")
        ax.legend()
    fig.suptitle(f"spate bench {name}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
