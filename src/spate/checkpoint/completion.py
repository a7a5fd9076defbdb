"""What a completed checkpoint's metadata records (its subtasks' acknowledged state, the event time and
watermark carried forward from its base, the history of rescales, the change-set lists of each subtask's log)
and how it is written: ``chk-<n>/_metadata`` with put-if-absent, conditional on the driver's epoch."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from spate.checkpoint.changelists import extend_lists, reused_lists
from spate.checkpoint.metadata import RESCALE_HISTORY, CheckpointMetadata, QueryInfo, SubtaskState
from spate.checkpoint.protocol import SubtaskAck
from spate.checkpoint.takeover import TakeOver
from spate.errors import FencedError, naming_disk_full
from spate.fs import CheckpointStorage
from spate.layout import metadata_path

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PlannedCheckpoint:
    """What a checkpoint was planned with (:meth:`~spate.checkpoint.coordinator.Coordinator.begin`): its id
    (= the micro-batch), the subtasks it runs on, its processing time, and why the parallelism changed while
    the query ran (None: it did not, or changed at a start)."""

    checkpoint_id: int
    parallelism: int
    processing_time_ms: int
    rescale_reason: str | None = None


def completed_metadata(planned: PlannedCheckpoint, acks: list[SubtaskAck], query: QueryInfo,
                       base: CheckpointMetadata | None, watermark_delay_ms: int | None) -> CheckpointMetadata:
    """The metadata of checkpoint ``planned`` of ``query``, planned from ``base``, with ``acks`` (one per
    subtask, in subtask order)."""
    events = [a.max_event_time_ms for a in acks if a.max_event_time_ms is not None]
    prev = base.max_event_time_ms if base else None
    max_event = max([*events, *([prev] if prev is not None else [])], default=None)
    watermark = base.watermark_ms if base else None
    if max_event is not None and watermark_delay_ms is not None:
        watermark = max(watermark if watermark is not None else max_event - watermark_delay_ms,
                        max_event - watermark_delay_ms)
    checkpoint_id = planned.checkpoint_id
    return CheckpointMetadata(
        checkpoint_id, query.query_id, query.epoch, len(acks), query.max_parallelism, planned.processing_time_ms,
        [SubtaskState(a.keyed, a.operator, a.outputs, a.stats, a.changelog, sink_file=a.sink_file, **a.ack_info())
         for a in acks],
        max_event, watermark, batch_watermark_ms=base.watermark_ms if base else None,
        **_rescale_record(checkpoint_id, len(acks), base, planned.rescale_reason))


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


def list_change_sets(storage: CheckpointStorage, meta: CheckpointMetadata, base: CheckpointMetadata | None) -> None:
    """Write each subtask's log since its materialization down in change-set lists, re-using ``base``'s (a
    checkpoint of this root at the same parallelism, else None) while the log still starts with them, so the
    metadata stays the same size as the log grows."""
    with naming_disk_full(storage.path(metadata_path(meta.checkpoint_id)), meta.checkpoint_id):
        for i, st in enumerate(meta.subtasks):
            kept = reused_lists(st.changelog, base.subtasks[i].changelog_lists, base.subtasks[i].changelog) \
                if base is not None else []
            st.changelog_lists = extend_lists(storage, st.changelog, kept)


def write_metadata(storage: CheckpointStorage, take_over: TakeOver, meta: CheckpointMetadata) -> None:
    """Create ``chk-<n>/_metadata`` with put-if-absent. One left there by a driver fenced before this one
    looked (an older epoch, above this epoch's seal) never counts, and is replaced."""
    rel = metadata_path(meta.checkpoint_id)
    for _attempt in range(2):
        try:
            with take_over.fenced_on_failure(), naming_disk_full(storage.path(rel), meta.checkpoint_id):
                storage.create_exclusive(rel, meta.to_bytes())
            return
        except FileExistsError:
            if not take_over.fenced_commit(meta.checkpoint_id):
                break
            log.warning("replacing %s, written by a fenced driver", storage.path(rel))
            take_over.check()  # a newer driver may have replaced it with its own
            storage.delete(rel)
    raise FencedError(f"{storage.path(rel)} already exists: another driver completed this checkpoint; "
                      "stop this query")
