"""Sink delivery bookkeeping: which completed checkpoints' staged outputs the sink has received.

The sink gets batches in order, after their checkpoints complete, so one watermark says it all: ``_delivered``
holds the newest checkpoint the sink received.
"""

from __future__ import annotations

from typing import Any

from spate.checkpoint.metadata import CheckpointMetadata, read_delivered
from spate.checkpoint.takeover import TakeOver
from spate.errors import naming_disk_full
from spate.frames import FrameKind, frame
from spate.fs import CheckpointStorage
from spate.layout import DELIVERED_FILE, delivered_path
from spate.snapshot.outputs import read_outputs


class SinkDelivery:
    """The delivery watermark of one checkpoint root, and the staged outputs it has yet to cover."""

    def __init__(self, storage: CheckpointStorage, take_over: TakeOver) -> None:
        self.storage = storage
        self.take_over = take_over
        self._delivered_upto: int | None = None  # the sink received every checkpoint up to this one

    def delivered_upto(self) -> int:
        """The newest checkpoint the sink received (-1: none)."""
        if self._delivered_upto is None:
            self._delivered_upto = read_delivered(self.storage)
        return self._delivered_upto

    def undelivered(self, completed: list[CheckpointMetadata]) -> list[CheckpointMetadata]:
        """Those of ``completed`` with staged outputs the sink has not confirmed, oldest first."""
        upto = self.delivered_upto()
        out = []
        for m in completed:
            if m.checkpoint_id <= upto or not any(st.staged for st in m.subtasks):
                continue
            if self.storage.exists(delivered_path(m.checkpoint_id)):  # a marker of an older spate
                continue
            out.append(m)
        return out

    def staged_outputs(self, meta: CheckpointMetadata, allow_pickle: bool = False) -> list[Any]:
        """The output rows checkpoint ``meta``'s subtasks staged for the sink, in subtask order."""
        return [r for st in meta.subtasks if st.outputs for r in read_outputs(self.storage, st.outputs, allow_pickle)]

    def mark_delivered(self, checkpoint_id: int) -> None:
        """Record that the sink received checkpoint ``checkpoint_id``'s outputs (and every earlier one's)."""
        upto = max(self.delivered_upto(), checkpoint_id)
        with self.take_over.fenced_on_failure(), naming_disk_full(self.storage.path(DELIVERED_FILE), checkpoint_id):
            self.storage.replace(DELIVERED_FILE, frame(FrameKind.DELIVERED, str(upto).encode()))
        self._delivered_upto = upto
