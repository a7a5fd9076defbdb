"""spate's figures of each micro-batch where Spark users look: the query's progress and its listeners.

To Spark, spate's query is a ``foreachBatch`` sink without state, so Spark's own progress has no
``stateOperators`` entry and no figures about spate's state or checkpoints, and a sink cannot add any (Spark
takes observed metrics from the batch's own plan, evaluated before spate's checkpoint exists). So spate adds them
on the driver: a listener of Spark's (:class:`ProgressListener`) takes each progress event of the stream's
query, adds spate's figures of that batch (:class:`SpateProgress`) as a ``stateOperators``-shaped entry named
``spate`` and as ``observedMetrics["spate"]``, keeps the result for ``StatefulStream.last_progress`` /
``recent_progress``, and passes the events on to the stream's own listeners (``StatefulStream.add_listener``),
which get Spark's ``QueryProgressEvent`` with those figures in it. Listeners registered with Spark directly
(``spark.streams.addListener``) see Spark's progress unchanged.
"""

from __future__ import annotations

import collections
import json
import logging
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, cast

from pyspark.sql.streaming import StreamingQueryListener
from pyspark.sql.streaming.listener import JStreamingQueryListener, QueryProgressEvent, StreamingQueryProgress

from spate.checkpoint.ackinfo import CAUGHT_UP, RESCALED, RESTORED, REUSED
from spate.checkpoint.metadata import CheckpointMetadata

log = logging.getLogger(__name__)

OPERATOR_NAME = "spate"
"""The ``operatorName`` of spate's ``stateOperators`` entry, and the key of its ``observedMetrics``."""


@dataclass(frozen=True)
class SpateProgress:
    """spate's figures of one micro-batch (from its checkpoint's metadata and the driver's timings).

    Attributes:
        batch_id: Spark's batch id (spate's checkpoint id).
        input_rows: rows the subtasks processed (ticks and heartbeats not counted).
        state_rows: state entries after the batch, over all subtasks (values, list values, map entries,
            timers), None when a subtask could not count them cheaply (one built over another's state at an
            online rescale, until it is folded).
        state_rows_changed: entries written or removed since the previous checkpoint, each once (the change
            log's records), None without the change log.
        state_bytes: bytes of the checkpoint's state in checkpoint storage (every file it references).
        checkpoint_new_bytes: bytes this checkpoint added to checkpoint storage.
        files: physical files the checkpoint references.
        checkpoint_ms: from the acks collected to the metadata written.
        job_ms: spate's Spark job: routing the rows, running the subtasks, collecting the acks.
        deliver_ms: the sink's call.
        batch_ms: the whole batch on the driver (job, checkpoint and sink).
        parallelism: subtasks the batch ran on.
        local_reuse: subtasks that ran on their local state (live or caught up from a local copy).
        restored: subtasks that read their state from checkpoint storage.
        rescaled: subtasks built from local copies at an online rescale.
        restore_bytes: bytes read from checkpoint storage to get state to the base checkpoint.
        restore_ms: the slowest subtask's restore.
        replayed: Spark ran the batch again after its checkpoint had completed: only re-delivered.
    """

    batch_id: int
    input_rows: int = 0
    state_rows: int | None = None
    state_rows_changed: int | None = None
    state_bytes: int = 0
    checkpoint_new_bytes: int = 0
    files: int = 0
    checkpoint_ms: float = 0.0
    job_ms: float = 0.0
    deliver_ms: float = 0.0
    batch_ms: float = 0.0
    parallelism: int = 0
    local_reuse: int = 0
    restored: int = 0
    rescaled: int = 0
    restore_bytes: int = 0
    restore_ms: float = 0.0
    replayed: bool = False

    @staticmethod
    def of(meta: CheckpointMetadata, new_bytes: int, **timings: float) -> SpateProgress:
        """The figures of the batch whose checkpoint is ``meta`` (``timings``: the ``..._ms`` fields)."""
        subtasks = meta.subtasks
        counts: list[int | None] = [st.stats.get("state_rows") for st in subtasks]
        changed: list[int | None] = [st.stats.get("changelog_records") for st in subtasks]
        rounded: dict[str, Any] = {name: round(ms, 3) for name, ms in timings.items()}
        return SpateProgress(
            batch_id=meta.checkpoint_id, input_rows=sum(st.rows for st in subtasks),
            state_rows=sum(cast("list[int]", counts)) if all(c is not None for c in counts) else None,
            state_rows_changed=sum(cast("list[int]", changed)) if all(c is not None for c in changed) else None,
            state_bytes=meta.state_bytes, checkpoint_new_bytes=new_bytes, files=len(meta.files()),
            **rounded, parallelism=meta.parallelism,
            local_reuse=sum(st.recovery in (REUSED, CAUGHT_UP) for st in subtasks),
            restored=sum(st.recovery == RESTORED for st in subtasks),
            rescaled=sum(st.recovery == RESCALED for st in subtasks),
            restore_bytes=sum(st.restore_bytes for st in subtasks),
            restore_ms=max((st.restore_ms for st in subtasks), default=0.0))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def state_operator(self) -> dict[str, Any]:
        """An entry of Spark's ``stateOperators`` (the JSON of ``StateOperatorProgress``). A count spate does
        not know is -1; spate's other figures are its ``customMetrics``."""
        custom = {k: int(round(v)) for k, v in self.to_dict().items()
                  if k not in ("batch_id", "state_rows", "state_rows_changed") and v is not None}
        return {"operatorName": OPERATOR_NAME, "numRowsTotal": _or_unknown(self.state_rows),
                "numRowsUpdated": _or_unknown(self.state_rows_changed), "numRowsRemoved": -1,
                "allUpdatesTimeMs": int(round(self.job_ms)), "allRemovalsTimeMs": 0,
                "commitTimeMs": int(round(self.checkpoint_ms)), "memoryUsedBytes": self.state_bytes,
                "numRowsDroppedByWatermark": 0, "numShufflePartitions": self.parallelism,
                "numStateStoreInstances": self.parallelism, "customMetrics": custom}


def _or_unknown(count: int | None) -> int:
    return -1 if count is None else count


def _drain_listener_bus(spark: Any, timeout_s: float) -> None:
    """Wait until Spark's listener bus delivered the events queued so far (bounded by ``timeout_s``)."""
    try:
        spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty(int(timeout_s * 1000))  # noqa: SLF001
    except Exception as e:  # noqa: BLE001 - the session stopped, a timeout, or another Spark version
        log.debug("Spark's listener bus not drained: %s", e)


class BatchFigures:
    """The figures of a stream's latest ``keep`` batches, by batch id (what the progress listener looks up)."""

    def __init__(self, keep: int = 100) -> None:
        self._by_batch: collections.OrderedDict[int, SpateProgress] = collections.OrderedDict()
        self._keep = keep
        self._segments: set[tuple[str, int]] = set()  # the previous checkpoint's, to tell what is new
        self._lock = threading.Lock()

    def start_from(self, latest: CheckpointMetadata | None) -> None:
        """The checkpoint a (re)started query continues from: what its first batch adds is counted against it."""
        self._segments = {ref.key for ref in latest.segments()} if latest is not None else set()

    def record(self, meta: CheckpointMetadata, **timings: float) -> SpateProgress:
        """The figures of the batch whose checkpoint is ``meta`` (``timings``: ``SpateProgress``'s ``..._ms``)."""
        segments = {ref.key: ref.length for ref in meta.segments()}
        new_bytes = sum(length for key, length in segments.items() if key not in self._segments)
        self._segments = set(segments)
        return self.add(SpateProgress.of(meta, new_bytes, **timings))

    def add(self, figures: SpateProgress) -> SpateProgress:
        with self._lock:
            self._by_batch[figures.batch_id] = figures
            while len(self._by_batch) > self._keep:
                self._by_batch.popitem(last=False)
        return figures

    def __call__(self, batch_id: int) -> SpateProgress | None:
        with self._lock:
            return self._by_batch.get(batch_id)


def with_spate(progress: StreamingQueryProgress, figures: SpateProgress | None) -> StreamingQueryProgress:
    """``progress`` with spate's entry in ``stateOperators`` and ``observedMetrics["spate"]`` (unchanged
    without figures: a progress event of a trigger that ran no batch)."""
    if figures is None:
        return progress
    data = json.loads(progress.json)
    data["stateOperators"] = [*data.get("stateOperators", []), figures.state_operator()]
    data["observedMetrics"] = {**data.get("observedMetrics", {}),
                               OPERATOR_NAME: {k: v for k, v in figures.to_dict().items() if k != "batch_id"}}
    return StreamingQueryProgress.fromJson(data)


class _ProgressFromJson(JStreamingQueryListener):
    """pyspark's bridge from the JVM's listener bus to a Python listener, but a progress event taken from its JSON,
    in one py4j call. pyspark's own reads it field by field, and each Java map it turns into a dict ends in a
    Java exception (py4j's iterators stop on ``NoSuchElementException``), which pyspark converts by asking the JVM
    whether it is one of 15 exception classes, each question resolving py4j's classes by failed class lookups
    through every jar of Spark's class path: about 5 such exceptions per event, about a quarter of the driver JVM's
    CPU in a run of many short queries (profiled on Spark's own transformWithState tests, ported)."""

    def onQueryProgress(self, jevent: Any) -> None:  # noqa: N802
        self.pylistener.onQueryProgress(QueryProgressEvent.fromJson(json.loads(jevent.json())))


class ProgressListener(StreamingQueryListener):
    """Spark's listener for one stream: its query's progress with spate's figures, kept and passed on.

    ``figures(batch_id)`` gives the figures of a batch (None if unknown). The query's id is known only once
    ``start`` returned, and Spark posts the query's start event before (from ``start`` itself): events that
    come before :meth:`attach` wait in a list and are passed on then, if they are the query's, before any event
    that arrives meanwhile (Spark's listener thread waits for them: listeners see the query's events in order)."""

    def __init__(self, figures: Any, keep: int = 100) -> None:
        self._figures = figures
        self.listeners: list[StreamingQueryListener] = []
        self.recent: collections.deque[StreamingQueryProgress] = collections.deque(maxlen=keep)
        self._query_id: str | None = None
        self._attached = False
        self._early: list[tuple[str, Any, Any]] = []  # (method, query id, event) before attach
        self._lock = threading.Lock()
        self._passing = threading.RLock()  # held while events are passed on: one at a time, in order
        self._spark: Any = None
        self._session: Any = None
        self._unregistering: threading.Thread | None = None  # started from Spark's listener thread, joined on close
        # told each progress of the query before its figures are looked up (on Spark Connect: read from the root)
        self.on_progress: Callable[[StreamingQueryProgress], None] | None = None
        self._bridge: Any = None

    @property
    def _jlistener(self) -> Any:
        """The JVM's side of this listener (what pyspark's ``addListener`` registers): :class:`_ProgressFromJson`."""
        if self._bridge is None:
            from pyspark import SparkContext

            self._bridge = SparkContext._jvm.PythonStreamingQueryListenerWrapper(  # type: ignore[union-attr]  # noqa: SLF001
                _ProgressFromJson(self))
        return self._bridge

    def register(self, spark: Any) -> None:
        """Listen to ``spark``'s streaming queries (before the query starts, so its first events come)."""
        with self._lock:
            self._spark, self._query_id, self._attached, self._early = spark, None, False, []
        self._session = spark  # kept after unregistering, to drain Spark's listener bus on close
        spark.streams.addListener(self)

    def attach(self, query_id: Any) -> None:
        """The query started (``None``: it failed to): from now on only its events count."""
        with self._passing:
            with self._lock:
                self._query_id = None if query_id is None else str(query_id)
                self._attached, early, self._early = True, self._early, []
            for method, event_id, event in early:
                self._on(method, event_id, event)

    def unregister(self) -> None:
        with self._lock:
            spark, self._spark = self._spark, None
            self._attached, self._early = True, []
        if spark is not None:
            try:
                spark.streams.removeListener(self)
            except Exception as e:  # the session stopped first: its listeners went with it
                log.debug("progress listener not removed: %s", e)

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop listening, wait for an unregistration the query's end started, and for the events Spark had
        already queued: one the JVM sends this listener once the script's Python has exited is a py4j error
        trace on the user's terminal. What Spark had queued when the stream is closed is passed on first (a
        query's end, which Spark's listener thread may deliver after ``awaitTermination()`` returned: unregistering
        first would drop it, and a listener would never see the query terminate)."""
        spark = self._session
        if spark is not None:  # what Spark queued before (a query's end) reaches the listeners before they go
            _drain_listener_bus(spark, timeout_s)
        self.unregister()
        thread = self._unregistering
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)
        if spark is not None:
            _drain_listener_bus(spark, timeout_s)

    def onQueryStarted(self, event: Any) -> None:  # noqa: N802
        self._on("onQueryStarted", event.id, event)

    def onQueryProgress(self, event: Any) -> None:  # noqa: N802
        self._on("onQueryProgress", event.progress.id, event)

    def onQueryIdle(self, event: Any) -> None:  # noqa: N802
        self._on("onQueryIdle", event.id, event)

    def onQueryTerminated(self, event: Any) -> None:  # noqa: N802
        if self._on("onQueryTerminated", event.id, event):
            # not from Spark's listener thread itself: it is delivering this very event
            thread = threading.Thread(target=self.unregister, name="spate-progress-unregister", daemon=True)
            thread.start()
            self._unregistering = thread  # only once started: close() may join it from another thread any time

    def _on(self, method: str, query_id: Any, event: Any) -> bool:
        """Pass the event on if it is the query's (or keep it until :meth:`attach`); whether it was passed."""
        with self._passing:
            return self._pass_on(method, query_id, event)

    def _pass_on(self, method: str, query_id: Any, event: Any) -> bool:
        with self._lock:
            if not self._attached:
                self._early.append((method, query_id, event))
                return False
            if self._query_id is None or str(query_id) != self._query_id:
                return False
        if method == "onQueryProgress":
            self._pass_progress(event.progress)
        else:
            self._tell_listeners(method, event)
        return True

    def deliver_progress(self, progress: StreamingQueryProgress) -> None:
        """Pass on a progress of the query that did not come through Spark's listener bus (on Spark Connect the
        stream polls the query for it), as :meth:`onQueryProgress` passes on the query's own."""
        with self._passing:
            self._pass_progress(progress)

    def deliver_event(self, method: str, event: Any) -> None:
        """Pass on another event of the query that did not come through Spark's listener bus (on Spark Connect:
        its start and end, as the client sees them); ``method`` is the listener method that takes it."""
        with self._passing:
            self._tell_listeners(method, event)

    def _pass_progress(self, progress: StreamingQueryProgress) -> None:
        if self.on_progress is not None:
            self.on_progress(progress)
        progress = with_spate(progress, self._figures(progress.batchId))
        self._tell_listeners("onQueryProgress", QueryProgressEvent(progress))
        self.recent.append(progress)  # after the listeners: whoever sees it there knows they have run

    def _tell_listeners(self, method: str, event: Any) -> None:
        for listener in list(self.listeners):
            try:
                getattr(listener, method)(event)
            except Exception:  # a listener's failure must not stop the others (Spark's bus logs and goes on)
                log.exception("listener %r failed in %s", listener, method)


__all__ = ["OPERATOR_NAME", "BatchFigures", "ProgressListener", "SpateProgress", "with_spate"]
