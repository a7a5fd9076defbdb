"""A stream's figures: what each micro-batch cost on the driver (:class:`BatchMetrics`), the summary over the
latest batches that :meth:`StatefulStream.summary <spate.spark.stream.StatefulStream.summary>` and the benchmarks
report, and what a stream keeps of them across its runs (:class:`StreamFigures`)."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from spate.checkpoint.ackinfo import CAUGHT_UP, RESCALED, RESTORED, REUSED, AckInfo
from spate.checkpoint.metadata import CheckpointMetadata
from spate.report import percentile
from spate.spark.progress import BatchFigures, ProgressListener, SpateProgress

METRICS_KEPT = 1000  # the latest batches' metrics a stream keeps (its summary is over these)


@dataclass(frozen=True)
class JobFigures:
    """What the Spark side of a batch cost: Spark jobs spate ran for it, tasks of the stage that ran the subtasks,
    the time of its job (routing the rows, running the subtasks, collecting the acks) and the largest plan a task
    received."""

    jobs: int
    tasks: int
    job_ms: float
    plan_bytes_max: int


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
    def of(meta: CheckpointMetadata, job: JobFigures, *, batch_ms: float, commit_ms: float,
           deliver_ms: float) -> BatchMetrics:
        """The metrics of the batch that completed ``meta``, whose Spark job cost ``job``."""
        subtasks = meta.subtasks
        return BatchMetrics(meta.checkpoint_id, sum(st.rows for st in subtasks), batch_ms, commit_ms,
                            [i for i, st in enumerate(subtasks) if st.recovery == RESTORED],
                            spark_jobs=job.jobs, spark_tasks=job.tasks, plan_bytes_max=job.plan_bytes_max,
                            subtasks=[AckInfo(**st.ack_info()) for st in subtasks],
                            job_ms=job.job_ms, deliver_ms=deliver_ms,
                            worker_peak_rss_bytes=max(st.stats.get("peak_rss_bytes", 0) for st in subtasks),
                            profile=_slowest_phases([st.stats.get("profile", {}) for st in subtasks]),
                            parallelism=meta.parallelism)


class StreamFigures:
    """What a stream keeps of its batches across its runs: the metrics of its latest :data:`METRICS_KEPT`
    batches, spate's figures of each batch for the query's progress events (:class:`BatchFigures`) and the
    listener that adds them to Spark's (:class:`ProgressListener`), and the batches whose outputs were given to
    the sink again (``redelivered``)."""

    def __init__(self) -> None:
        self.metrics: deque[BatchMetrics] = deque(maxlen=METRICS_KEPT)
        self.batches = BatchFigures()
        self.listener = ProgressListener(self.batches)
        self.redelivered: list[int] = []

    def replayed(self, batch_id: int, batch_ms: float) -> None:
        """A batch Spark ran again after spate's checkpoint of it completed: nothing was processed."""
        self.metrics.append(BatchMetrics(batch_id, 0, batch_ms, 0.0, replayed=True))
        self.batches.add(SpateProgress(batch_id, batch_ms=round(batch_ms, 3), replayed=True))

    def completed(self, meta: CheckpointMetadata, metrics: BatchMetrics) -> None:
        """The batch whose checkpoint is ``meta`` completed, at the cost ``metrics``."""
        self.metrics.append(metrics)
        self.batches.record(meta, batch_ms=metrics.batch_ms, checkpoint_ms=metrics.checkpoint_ms,
                            job_ms=metrics.job_ms, deliver_ms=metrics.deliver_ms)


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
