"""The driver protocol of one micro-batch, written once for every transport.

begin (plan checkpoint n) → run the subtasks (in-process, or as Spark tasks) → acknowledge each ack →
complete, or abort on any failure → give the sink the batch's outputs → mark them delivered. Before a batch,
the staged outputs of complete checkpoints the sink did not confirm (the driver died between checkpoint and
sink) are delivered again, with their batch ids. A batch a complete checkpoint already covers (Spark replays
the last batch after a driver restart) is not processed again.

The transport supplies how subtasks run (``run_subtasks``: plans in, acks out) and how outputs reach the sink
(``deliver``); :class:`DriverLoop` owns the order of the steps and what happens when one fails.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from spate.checkpoint.coordinator import Coordinator
from spate.checkpoint.metadata import CheckpointMetadata
from spate.checkpoint.protocol import SubtaskAck, SubtaskPlan

RunSubtasks = Callable[[list[SubtaskPlan]], Iterable[SubtaskAck]]
Deliver = Callable[[CheckpointMetadata], None]  # give the sink checkpoint n's outputs (batch id n)
FaultInjector = Callable[[str, int], None]


@dataclass
class CompletedBatch:
    """A batch whose checkpoint completed (and whose outputs the sink confirmed, if there is a sink)."""

    checkpoint: CheckpointMetadata
    acks: list[SubtaskAck]
    acked_at: float  # ``time.perf_counter()`` when the last ack arrived
    commit_ms: float  # from the last ack to the metadata written


class DriverLoop:
    """Runs micro-batches against ``coordinator`` (started), in protocol order.

    Args:
        coordinator: the query's coordinator, already started.
        deliver: gives the sink a complete checkpoint's outputs; None without a sink.
        fault_injector: test hook called at each protocol step (``"after_begin"``, ``"after_subtask_<i>"``,
            ``"after_acks"``, ``"after_complete"``, ``"after_sink_before_mark"``, ``"after_sink"``); may raise.
    """

    def __init__(self, coordinator: Coordinator, deliver: Deliver | None = None,
                 fault_injector: FaultInjector | None = None) -> None:
        self.coordinator, self.deliver = coordinator, deliver
        self._fault = fault_injector or (lambda step, batch_id: None)

    def covered(self, batch_id: int) -> bool:
        """Whether a complete checkpoint already covers batch ``batch_id`` (it is not processed again)."""
        latest = self.coordinator.latest
        return latest is not None and batch_id <= latest.checkpoint_id

    def redeliver(self) -> list[int]:
        """Deliver, oldest first, the staged outputs of complete checkpoints the sink did not confirm."""
        if self.deliver is None:
            return []
        done = []
        for meta in self.coordinator.undelivered():
            self.deliver(meta)
            self.coordinator.mark_delivered(meta.checkpoint_id)
            done.append(meta.checkpoint_id)
        return done

    def run_batch(self, batch_id: int, run_subtasks: RunSubtasks, processing_time_ms: int | None = None,
                  deliver: Deliver | None = None,
                  on_complete: Callable[[CompletedBatch], None] | None = None) -> CompletedBatch:
        """Run batch ``batch_id`` = checkpoint ``batch_id``. If running a subtask or the checkpoint fails, the
        checkpoint is aborted (a take-over by another driver raises :class:`FencedError`) and the error raised.
        If the sink fails, the checkpoint stays complete and its outputs are delivered again before the next
        batch. ``deliver`` overrides the loop's for this batch (e.g. outputs the transport has in memory);
        ``on_complete`` runs right after the checkpoint completed, before the sink."""
        coord = self.coordinator
        plans = coord.begin(batch_id, processing_time_ms)
        self._fault("after_begin", batch_id)
        try:
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
        sink = deliver or self.deliver
        if sink is not None:
            sink(meta)
            self._fault("after_sink_before_mark", batch_id)
            coord.mark_delivered(batch_id)
        self._fault("after_sink", batch_id)
        return done


__all__ = ["CompletedBatch", "DriverLoop"]
