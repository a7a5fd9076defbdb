"""The metadata a checkpoint completes with: its subtasks' acknowledged state, the event time and watermark
carried forward from its base, and the history of rescales."""

from __future__ import annotations

from typing import Any

from spate.checkpoint.metadata import RESCALE_HISTORY, CheckpointMetadata, QueryInfo, SubtaskState
from spate.checkpoint.protocol import SubtaskAck


def completed_metadata(checkpoint_id: int, acks: list[SubtaskAck], processing_time_ms: int, query: QueryInfo,
                       base: CheckpointMetadata | None, watermark_delay_ms: int | None,
                       rescale_reason: str | None) -> CheckpointMetadata:
    """The metadata of checkpoint ``checkpoint_id`` of ``query``, planned from ``base``, with ``acks`` (one per
    subtask, in subtask order). ``rescale_reason``: why the parallelism changed while running (None: at the
    start)."""
    events = [a.max_event_time_ms for a in acks if a.max_event_time_ms is not None]
    prev = base.max_event_time_ms if base else None
    max_event = max([*events, *([prev] if prev is not None else [])], default=None)
    watermark = base.watermark_ms if base else None
    if max_event is not None and watermark_delay_ms is not None:
        watermark = max(watermark if watermark is not None else max_event - watermark_delay_ms,
                        max_event - watermark_delay_ms)
    return CheckpointMetadata(
        checkpoint_id, query.query_id, query.epoch, len(acks), query.max_parallelism, processing_time_ms,
        [SubtaskState(a.keyed, a.operator, a.outputs, a.stats, a.changelog, sink_file=a.sink_file, **a.ack_info())
         for a in acks],
        max_event, watermark, batch_watermark_ms=base.watermark_ms if base else None,
        **_rescale_record(checkpoint_id, len(acks), base, rescale_reason))


def _rescale_record(checkpoint_id: int, parallelism: int, base: CheckpointMetadata | None,
                    reason: str | None) -> dict[str, Any]:
    """``rescaled_from`` and ``rescale_reason`` of a checkpoint whose base had another parallelism, and the
    history of rescales it carries forward from its base."""
    if base is None:
        return {}
    history = list(base.rescales)
    if base.parallelism == parallelism:
        return {"rescales": history}
    reason = reason or "started at another parallelism"
    history.append({"checkpoint_id": checkpoint_id, "from": base.parallelism, "to": parallelism, "reason": reason})
    return {"rescaled_from": base.parallelism, "rescale_reason": reason, "rescales": history[-RESCALE_HISTORY:]}
