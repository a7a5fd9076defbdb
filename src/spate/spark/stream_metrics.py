"""What each micro-batch of a stream cost on the driver (:class:`BatchMetrics`), and the summary over the latest
batches that :meth:`StatefulStream.summary <spate.spark.stream.StatefulStream.summary>` and the benchmarks
report."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from spate.checkpoint.ackinfo import CAUGHT_UP, RESCALED, RESTORED, REUSED, AckInfo
from spate.checkpoint.metadata import CheckpointMetadata
from spate.report import percentile


@dataclass
class BatchMetrics:
    """What one micro-batch cost on the driver."""

    batch_id: int
    rows: int
    batch_ms: float
    checkpoint_ms: float  # from the acks being collected to the metadata written
    restored_subtasks: list[int] = field(default_factory=list)
    replayed: bool = False  # a batch Spark ran again after spate's checkpoint completed: only re-delivered
    spark_jobs: int = 0  # Spark jobs spate ran for the batch (the sink's own jobs not counted)
    spark_tasks: int = 0  # tasks of the stage that ran the subtasks
    plan_bytes_max: int = 0  # the largest plan a task received
    subtasks: list[AckInfo] = field(default_factory=list)  # per subtask: executor, recovery, restore bytes and ms
    job_ms: float = 0.0  # spate's Spark job: routing the rows, running the subtasks, collecting the acks
    deliver_ms: float = 0.0  # the sink's call
    worker_peak_rss_bytes: int = 0  # the largest peak RSS of the Python workers that ran the subtasks
    profile: dict[str, float] = field(default_factory=dict)  # settings.profile: per phase, the slowest subtask's ms
    parallelism: int = 0  # the subtasks the batch ran on

    @staticmethod
    def of(meta: CheckpointMetadata, batch_ms: float, commit_ms: float, spark: dict[str, int], plans: list[bytes],
           deliver_ms: float) -> BatchMetrics:
        """The metrics of the batch that completed ``meta``: ``spark`` holds the job's ``jobs``, ``tasks`` and
        ``job_us``, ``plans`` the encoded plans the tasks received."""
        subtasks = meta.subtasks
        return BatchMetrics(meta.checkpoint_id, sum(st.rows for st in subtasks), batch_ms, commit_ms,
                            [i for i, st in enumerate(subtasks) if st.recovery == RESTORED],
                            spark_jobs=spark["jobs"], spark_tasks=spark["tasks"],
                            plan_bytes_max=max(map(len, plans)),
                            subtasks=[AckInfo(**st.ack_info()) for st in subtasks],
                            job_ms=spark["job_us"] / 1000, deliver_ms=deliver_ms,
                            worker_peak_rss_bytes=max(st.stats.get("peak_rss_bytes", 0) for st in subtasks),
                            profile=_slowest_phases([st.stats.get("profile", {}) for st in subtasks]),
                            parallelism=meta.parallelism)


def summarize(metrics: Iterable[BatchMetrics]) -> dict[str, Any]:
    """Rows/s, batch and checkpoint durations and where subtasks found their state (``local_reuse``: the fraction
    of subtask-batches that ran on their local state, live or caught up; ``rescaled``: those that built it from
    local copies at an online rescale), over the batches processed (not the replayed ones)."""
    done = [m for m in metrics if not m.replayed]
    total_ms = sum(m.batch_ms for m in done)
    runs = [r for m in done for r in m.subtasks]
    return {"batches": len(done), "rows": sum(m.rows for m in done),
            "local_reuse": round(sum(r.recovery in (REUSED, CAUGHT_UP) for r in runs) / len(runs), 3)
            if runs else None,
            "caught_up": sum(r.recovery == CAUGHT_UP for r in runs),
            "restored": sum(r.recovery == RESTORED for r in runs),
            "rescaled": sum(r.recovery == RESCALED for r in runs),
            "restore_bytes": sum(r.restore_bytes for r in runs),
            "rows_per_s": round(sum(m.rows for m in done) / (total_ms / 1000)) if total_ms else 0,
            "batch_ms_p50": percentile([m.batch_ms for m in done], 50),
            "batch_ms_p99": percentile([m.batch_ms for m in done], 99),
            "checkpoint_ms_p50": percentile([m.checkpoint_ms for m in done], 50),
            "checkpoint_ms_p99": percentile([m.checkpoint_ms for m in done], 99)}


def _slowest_phases(profiles: list[dict[str, float]]) -> dict[str, float]:
    """Per phase, the largest time among the subtasks' profiles."""
    out: dict[str, float] = {}
    for profile in profiles:
        for phase, ms in profile.items():
            out[phase] = max(out.get(phase, 0.0), ms)
    return out


__all__ = ["BatchMetrics", "summarize"]
