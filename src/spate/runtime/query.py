"""``QueryDriver``: one running query on its driver, the same for every transport.

It owns what a query is beyond one batch: its settings (the parallelism among them: one place, never stale;
the coordinator is given it with each plan), the coordinator, the protocol each batch runs in, online rescaling
(requested from any thread, applied before the next batch is planned), the autoscaler, the history of rescales,
the delivery of outputs the sink did not confirm and when a batch without input is due. A transport
(:class:`~spate.runtime.local.LocalRunner`, :class:`~spate.spark.stream.StatefulStream`) supplies only how
subtasks run and how outputs reach the sink.

One micro-batch, written once for every transport: begin (plan checkpoint n) → run the subtasks (in-process, or
as Spark tasks) → acknowledge each ack → complete, or abort on any failure → give the sink the batch's outputs →
mark them delivered. Before a batch, the transport has the staged outputs of complete checkpoints the sink did
not confirm (the driver died between checkpoint and sink) delivered again (:meth:`QueryDriver.redeliver`), with
their batch ids. A batch a complete checkpoint already covers (Spark replays the last batch after a driver
restart) is not processed again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from spate.checkpoint.coordinator import Coordinator
from spate.checkpoint.metadata import CheckpointMetadata
from spate.checkpoint.protocol import SubtaskAck, SubtaskPlan
from spate.errors import FencedError
from spate.keygroups import check_parallelism
from spate.runtime.autoscale import AutoscalePolicy, Autoscaler, Observation, ScalingDecision
from spate.runtime.idle import IdleBatches
from spate.runtime.recovery_progress import RecoveryProgress
from spate.runtime.settings import SpateSettings
from spate.runtime.table_commit import TableCommitter
from spate.sinks.table_sink import TableSink

log = logging.getLogger(__name__)
RESCALES_KEPT = 100  # online rescales remembered for summaries (each checkpoint's metadata records its own)

RunSubtasks = Callable[[list[SubtaskPlan]], Iterable[SubtaskAck]]  # the transport's: plans in, acks out
Deliver = Callable[[CheckpointMetadata], None]  # give the sink checkpoint n's outputs (batch id n)
FaultInjector = Callable[[str, int], None]  # (protocol step, batch id); may raise, as a crash there would


@dataclass(frozen=True)
class Rescale:
    """An online rescale: from the batch ``batch_id`` on, ``to`` subtasks instead of ``from_``."""

    batch_id: int
    from_: int
    to: int
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"batch_id": self.batch_id, "from": self.from_, "to": self.to, "reason": self.reason}


@dataclass
class CompletedBatch:
    """A batch whose checkpoint completed (and whose outputs the sink confirmed, if there is a sink)."""

    checkpoint: CheckpointMetadata
    acks: list[SubtaskAck]
    acked_at: float  # ``time.perf_counter()`` when the last ack arrived
    commit_ms: float  # from the last ack to the metadata written


class QueryDriver:
    """The driver side of one query: started on construction (take-over of the root, recovery of the latest
    checkpoint), closed with :meth:`close`.

    Args:
        settings: the query's settings; :attr:`settings` follows every rescale.
        idle: when a batch without input is due, for the query's processor.
        autoscale: a policy that rescales the query after a batch; None for a fixed parallelism.
        deliver_staged: the transport's delivery of a complete checkpoint's outputs from where its subtasks
            staged them (every batch's unless :meth:`run_batch` is given the outputs, and :meth:`redeliver`'s);
            None without a sink.
        table_sink: an exactly-once table sink instead (:mod:`spate.sinks`), opened here for ``output_schema``:
            delivering a checkpoint commits its data files to the table.
        fault_injector: test hook called at each protocol step of a batch (``"after_begin"``,
            ``"after_subtask_<i>"``, ``"after_acks"``, ``"after_complete"``, ``"after_sink_before_mark"``,
            ``"after_sink"``); may raise.
        progress: say on standard error when a batch restores or rescales state (:class:`RecoveryProgress`);
            None: only on a terminal.
    """

    def __init__(self, settings: SpateSettings, *, idle: IdleBatches | None = None,
                 autoscale: AutoscalePolicy | None = None, deliver_staged: Deliver | None = None,
                 table_sink: TableSink | None = None, output_schema: pa.Schema | None = None,
                 fault_injector: FaultInjector | None = None, progress: bool | None = None) -> None:
        self._settings = settings
        self._recovery = RecoveryProgress(progress)
        self.coordinator: Coordinator = settings.coordinator()
        self.coordinator.start(settings.parallelism)
        self._idle = idle or IdleBatches()
        self.committer = TableCommitter(table_sink, self.coordinator, output_schema) if table_sink else None
        self._deliver_staged = self.committer.deliver if self.committer is not None else deliver_staged
        self._fault = fault_injector or (lambda step, batch_id: None)
        self.autoscaler = Autoscaler(autoscale, self.max_parallelism) if autoscale is not None else None
        self._lock = threading.Lock()
        self._requested: tuple[int, str] | None = None  # (parallelism, reason) for the next batch
        self.rescales: deque[Rescale] = deque(maxlen=RESCALES_KEPT)
        self._swept = False  # the table sink's staging directory swept since the start or the last failure

    # -- what the query is ----------------------------------------------------------------------------
    @property
    def settings(self) -> SpateSettings:
        return self._settings

    @property
    def parallelism(self) -> int:
        """The subtasks the next batch runs on (after a rescale applied)."""
        return self._settings.parallelism

    @property
    def max_parallelism(self) -> int:
        return self.coordinator.max_parallelism

    @property
    def latest(self) -> CheckpointMetadata | None:
        return self.coordinator.latest

    @property
    def next_batch_id(self) -> int:
        return self.coordinator.next_checkpoint_id

    @property
    def idle_batch_due_at(self) -> int | None:
        """When (processing time, epoch ms) the next batch is due without input; None: not before input."""
        return self._idle.due_at(self.coordinator.latest)

    # -- rescaling ------------------------------------------------------------------------------------
    def request_rescale(self, parallelism: int, reason: str = "requested") -> None:
        """Run at ``parallelism`` subtasks from the next batch on. Callable from any thread; refused beyond
        the max parallelism."""
        check_parallelism(parallelism, self.max_parallelism)
        with self._lock:
            self._requested = (parallelism, reason)

    @property
    def requested_rescale(self) -> tuple[int, str] | None:
        """The (parallelism, reason) requested for the next batch and not applied yet."""
        with self._lock:
            return self._requested

    def apply_rescale(self, batch_id: int) -> Rescale | None:
        """Before batch ``batch_id`` is planned: the requested rescale, if any changes the parallelism."""
        with self._lock:
            requested, self._requested = self._requested, None
        if requested is None or requested[0] == self.parallelism:
            return None
        parallelism, reason = requested
        done = Rescale(batch_id, self.parallelism, parallelism, reason)
        self.rescales.append(done)
        log.info("rescaling online at batch %d: %d → %d (%s)", batch_id, done.from_, parallelism, reason)
        self._settings = self._settings.replace(parallelism=parallelism)
        if self.autoscaler is not None:
            self.autoscaler.note_rescaled(batch_id - 1, time.time())
        return done

    def autoscale(self, batch_id: int, batch_ms: float, rows: int, backlog_rows: int | None = None) -> None:
        """Feed a batch to the autoscaler; a decision is requested for the next batch."""
        if self.autoscaler is None:
            return
        decision = self.autoscaler.observe(Observation(batch_id, self.parallelism, batch_ms, rows, backlog_rows,
                                                       at_s=time.time()))
        if decision is not None:
            self.request_rescale(decision.to_parallelism, decision.reason)

    @property
    def decisions(self) -> list[ScalingDecision]:
        """What the autoscaling policy decided (the latest ones; empty without a policy)."""
        return self.autoscaler.decisions if self.autoscaler is not None else []

    # -- batches --------------------------------------------------------------------------------------
    def covered(self, batch_id: int) -> bool:
        """Whether a complete checkpoint already covers batch ``batch_id`` (it is not processed again)."""
        latest = self.coordinator.latest
        return latest is not None and batch_id <= latest.checkpoint_id

    def redeliver(self) -> list[int]:
        """Deliver, oldest first, the staged outputs of complete checkpoints the sink did not confirm, and mark
        each delivered; with a table sink, then sweep what attempts that never completed staged (on the first
        call). Returns their batch ids."""
        done = []
        if self._deliver_staged is not None:
            for meta in self.coordinator.undelivered():
                self._deliver_staged(meta)
                self.coordinator.mark_delivered(meta.checkpoint_id)
                done.append(meta.checkpoint_id)
        if self.committer is not None and not self._swept:
            self.committer.clean()
            self._swept = True
        return done

    def run_batch(self, batch_id: int, run_subtasks: RunSubtasks, *, processing_time_ms: int | None = None,
                  deliver: Deliver | None = None,
                  on_complete: Callable[[CompletedBatch], None] | None = None) -> CompletedBatch:
        """Batch ``batch_id`` = checkpoint ``batch_id``, at the parallelism after :meth:`apply_rescale`, in
        protocol order: begin, run the subtasks, acknowledge each ack, complete, sink, mark. If running a subtask
        or the checkpoint fails, the checkpoint is aborted (a take-over by another driver raises
        :class:`FencedError`) and the error raised; with a table sink, the failed batch's staged data files are
        deleted (before its retry). If the sink fails, the checkpoint stays complete and its outputs are
        delivered again before the next batch. ``deliver`` gives the sink this batch's outputs instead of
        ``deliver_staged`` (outputs the transport has in memory); ``on_complete`` runs right after the
        checkpoint completed, before the sink."""
        coord, sink = self.coordinator, deliver or self._deliver_staged
        reason = self.rescales[-1].reason if self.rescales else None  # of the latest online rescale, if any
        try:
            plans = coord.begin(batch_id, self.parallelism, processing_time_ms, reason)
            self._fault("after_begin", batch_id)
            try:
                self._recovery.before(batch_id, plans)
                acks = []
                for ack in run_subtasks(plans):
                    self._fault(f"after_subtask_{ack.index}", batch_id)
                    coord.acknowledge(ack)
                    acks.append(ack)
                self._fault("after_acks", batch_id)
                acked = time.perf_counter()
                meta = coord.complete(batch_id)
            except BaseException as e:
                coord.fail(batch_id, e)
                raise
            done = CompletedBatch(meta, acks, acked, (time.perf_counter() - acked) * 1000)
            if on_complete is not None:
                on_complete(done)
            self._fault("after_complete", batch_id)
            if sink is not None:
                sink(meta)
                self._fault("after_sink_before_mark", batch_id)
                coord.mark_delivered(batch_id)
            self._fault("after_sink", batch_id)
        except FencedError:
            raise  # another driver owns the root now: its files are not ours to sweep
        except BaseException:
            if self.committer is not None:
                self._swept = False  # swept before the next batch, once the failure is behind (a sink may be down)
            raise
        self._recovery.after(meta)
        return done

    def savepoint(self, target_uri: str | None = None) -> str:
        """A self-contained copy of the latest checkpoint; see :meth:`Coordinator.savepoint`."""
        return self.coordinator.savepoint(target_uri)

    def close(self) -> None:
        """Delete what retried attempts of committed batches left in a table sink's staging directory; let
        background deletions finish."""
        try:
            if self.committer is not None:
                self.committer.clean(committed_only=True)
        except Exception as e:  # the table's store may be down: the next start sweeps them
            log.warning("could not sweep the table sink's staged files of committed batches: %s", e)
        finally:
            self.coordinator.close()


__all__ = ["CompletedBatch", "Deliver", "FaultInjector", "QueryDriver", "Rescale", "RunSubtasks"]
