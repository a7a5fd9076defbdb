"""Batches without input: when the next micro-batch must run even if no row arrives.

Spark runs a batch with no new input for its own stateful operators when a processing-time timer is due or the
watermark moved; spate decides the same from the checkpoint it just completed, for any transport: each
subtask's ack says its earliest processing-time and event-time timer (:class:`~spate.checkpoint.ackinfo.AckInfo`),
the metadata says the watermark the batch ran with and the one the next batch will run with. When nothing is
due the answer is None and no batch runs: an idle query costs nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from spate.checkpoint.metadata import CheckpointMetadata

NOW = 0  # due at once (any processing time is at or after it)


@dataclass(frozen=True)
class IdleBatches:
    """What makes a batch without input due, for one processor.

    Args:
        watermark_floor_ms: the processor's watermark before any event time and floor under it (Spark's
            transformWithState: 0), as :class:`~spate.runtime.processor.Processor` defines it.
        on_watermark_move: run one whenever the watermark moved (Spark's rule for transformWithState in event
            time: the batch also moves the late-row bound), not only when an event-time timer is due.
    """

    watermark_floor_ms: int | None = None
    on_watermark_move: bool = False

    @staticmethod
    def of(processor: Any) -> IdleBatches:
        """The policy a processor (instance or class) declares with its class attributes."""
        return IdleBatches(getattr(processor, "watermark_floor_ms", None),
                           bool(getattr(processor, "idle_batch_on_watermark_move", False)))

    def due_at(self, meta: CheckpointMetadata | None) -> int | None:
        """When (epoch ms, processing time) the batch after ``meta`` is due without input; None: not before
        input arrives."""
        if meta is None:
            return None
        due = [t for t in (st.next_processing_timer_ms for st in meta.subtasks) if t is not None]
        upcoming, ran = self._floored(meta.watermark_ms), self._floored(meta.batch_watermark_ms)
        if upcoming is not None and (ran is None or upcoming > ran):  # the next batch moves the watermark
            events = [t for t in (st.next_event_timer_ms for st in meta.subtasks) if t is not None]
            if self.on_watermark_move or any(t <= upcoming for t in events):
                due.append(NOW)
        return min(due) if due else None

    def _floored(self, watermark_ms: int | None) -> int | None:
        if self.watermark_floor_ms is None:
            return watermark_ms
        return self.watermark_floor_ms if watermark_ms is None else max(watermark_ms, self.watermark_floor_ms)


__all__ = ["NOW", "IdleBatches"]
