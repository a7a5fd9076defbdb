"""What the client of a stream on Spark Connect sees of its batches: the figures the driver side would have
kept (it runs in the server's ``foreachBatch`` process), read from the checkpoint root instead.

Spark Connect passes the query's events to listeners on the client. When Spark's progress of batch n arrives,
:class:`RootBatches` reads checkpoint n's metadata from the root and records the batch in the stream's
:class:`~spate.spark.stream_metrics.StreamFigures`, so ``stream.metrics``, ``summary()``, ``last_progress`` and
the stream's listeners get what they get in classic mode: rows, where each subtask found its state (``local_reuse``,
``restored``), restore bytes and times, state size, the new bytes of the checkpoint. The batch's duration is
Spark's ``addBatch`` (the whole ``foreachBatch``: job, checkpoint and sink); the split into job, checkpoint and
sink time, and the count of Spark jobs, are known only on the server, and are 0 here.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from spate.checkpoint.discovery import list_complete_checkpoints
from spate.checkpoint.inspect import load_checkpoint
from spate.checkpoint.metadata import CheckpointMetadata
from spate.errors import SpateError
from spate.fs import CheckpointStorage
from spate.spark.stream_metrics import BatchMetrics, JobFigures, StreamFigures

log = logging.getLogger(__name__)
UNKNOWN_JOB = JobFigures(jobs=0, tasks=0, job_ms=0.0, plan_bytes_max=0)  # known on the server only


def latest_checkpoint(storage: CheckpointStorage) -> CheckpointMetadata | None:
    """The root's latest complete checkpoint, None for a new root (or one spate cannot read yet)."""
    try:
        return load_checkpoint(storage) if list_complete_checkpoints(storage) else None
    except (FileNotFoundError, SpateError):
        return None


class RootBatches:
    """Records each batch of a run in ``figures`` from checkpoint storage, when Spark's progress of it reaches the
    client. ``after``: the latest complete checkpoint when the run started (batches up to it are not this run's)."""

    def __init__(self, storage: CheckpointStorage, figures: StreamFigures, after: int | None) -> None:
        self.storage, self.figures = storage, figures
        self._after = -1 if after is None else after
        self.latest: CheckpointMetadata | None = None  # of the latest batch recorded
        self._lock = threading.Lock()  # Connect's listener thread and the client's own (catching up) call it

    def __call__(self, progress: Any) -> None:
        with self._lock:
            self._record(progress)

    def _record(self, progress: Any) -> None:
        batch_id = int(_field(progress, "batchId"))
        if batch_id <= self._after or self.figures.batches(batch_id) is not None:
            return
        try:
            meta = load_checkpoint(self.storage, batch_id)
        except (FileNotFoundError, SpateError) as e:  # a trigger that ran no batch, or one that failed
            log.debug("no checkpoint %d for the progress event: %s", batch_id, e)
            return
        added_ms = float((_field(progress, "durationMs") or {}).get("addBatch", 0))
        self.figures.completed(meta, BatchMetrics.of(meta, UNKNOWN_JOB, batch_ms=added_ms, commit_ms=0.0,
                                                     deliver_ms=0.0))
        self._after, self.latest = batch_id, meta


def _field(progress: Any, name: str) -> Any:
    """A field of Spark's progress: an object (whose dict form may hold other names) or, in some pyspark
    versions' ``recentProgress``, a plain dict."""
    return getattr(progress, name) if hasattr(progress, name) else progress[name]
