"""What the client of a stream on Spark Connect sees of its batches: the figures the driver side would have
kept (it runs in the server's ``foreachBatch`` process), read from the checkpoint root instead.

The client polls the query for Spark's progress (:class:`ProgressPoller`, about twice a second: Connect's own
client-side listener bus can deadlock when a listener is removed while an event arrives, pyspark's
``StreamingQueryListenerBus.remove`` joining its event thread while holding the lock that thread needs). When
Spark's progress of batch n is new, :class:`RootBatches` reads checkpoint n's metadata from the root and records
the batch in the stream's :class:`~spate.spark.stream_metrics.StreamFigures`, so ``stream.metrics``,
``summary()``, ``last_progress`` and the stream's listeners get what they get in classic mode: rows, where each
subtask found its state (``local_reuse``, ``restored``), restore bytes and times, state size, the new bytes of
the checkpoint. The batch's duration is Spark's ``addBatch`` (the whole ``foreachBatch``: job, checkpoint and
sink); the split into job, checkpoint and sink time, and the count of Spark jobs, are known only on the server,
and are 0 here. The stream's listeners get the progress events (with spate's entry), and the query's start and
end as the client sees them: started once ``start()`` returned, terminated at the first poll that finds the
query inactive (after its last progress), with the query's exception, if any.
"""

from __future__ import annotations

import logging
import threading
from datetime import UTC, datetime
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


class ProgressPoller:
    """Polls ``query`` (Spark Connect's ``StreamingQuery``) every ``interval_s`` for its recent progress and passes
    each new one to ``listener`` (:meth:`~spate.spark.progress.ProgressListener.deliver_progress`), on a thread of
    its own until :meth:`stop`, which polls once more. The query's start is passed on when polling starts, its
    end at the first poll that finds it inactive, after the progress it reported last."""

    def __init__(self, query: Any, listener: Any, interval_s: float = 0.5) -> None:
        self.query, self.listener, self.interval_s = query, listener, interval_s
        self._seen: set[tuple[Any, Any]] = set()  # (batch id, timestamp) of the progress passed on
        self._ended = False  # the query's end passed on
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="spate-connect-progress", daemon=True)
        self._polling = threading.Lock()

    def start(self) -> None:
        self.listener.deliver_event("onQueryStarted", started_event(self.query))
        self._thread.start()

    def _run(self) -> None:
        while not self._stopped.wait(self.interval_s):
            self.poll()

    def poll(self) -> None:
        """Pass on the progress the query reported since the last poll, then its end if it ended before."""
        with self._polling:
            try:
                ended = not self._ended and not self.query.isActive  # asked first: no progress can come after
                reported = self.query.recentProgress
            except Exception as e:  # noqa: BLE001 - the session is gone: nothing more to read
                log.debug("recent progress not read: %s", e)
                return
            for progress in reported:
                key = (_field(progress, "batchId"), _field(progress, "timestamp"))
                if key not in self._seen:
                    self._seen.add(key)
                    self.listener.deliver_progress(progress)
            if ended:
                self._ended = True
                self.listener.deliver_event("onQueryTerminated", terminated_event(self.query))

    def stop(self) -> None:
        self._stopped.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(10)
        self.poll()


def started_event(query: Any) -> Any:
    """Spark's ``QueryStartedEvent`` of ``query``, as the client saw it start (now)."""
    from pyspark.sql.streaming.listener import QueryStartedEvent

    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"  # Spark's form of the timestamp
    return QueryStartedEvent.fromJson({"id": str(query.id), "runId": str(query.runId), "name": query.name,
                                       "timestamp": now})


def terminated_event(query: Any) -> Any:
    """Spark's ``QueryTerminatedEvent`` of ``query``, which is no longer active: its exception's message and
    error class, if it failed."""
    from pyspark.sql.streaming.listener import QueryTerminatedEvent

    try:
        error = query.exception()
    except Exception as e:  # noqa: BLE001 - the session is gone: the end is all there is to tell
        log.debug("the query's exception not read: %s", e)
        error = None
    condition = getattr(error, "getCondition", None) or getattr(error, "getErrorClass", None)
    return QueryTerminatedEvent.fromJson({"id": str(query.id), "runId": str(query.runId),
                                          "exception": None if error is None else str(error),
                                          "errorClassOnException": condition() if condition else None})
