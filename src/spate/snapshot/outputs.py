"""Staged outputs: a batch's output rows written as part of its checkpoint (write-ahead), so the sink can be
given them again with the same batch id after a crash between checkpoint completion and delivery."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from spate.fs import CheckpointStorage, FrameKind, frame, read_single_frame
from spate.segments import FileRef, SegmentWriter
from spate.serde import Serializer, encode, serializer_by_name


@dataclass(frozen=True)
class OutputsHandle:
    """A file of staged output rows of one subtask and batch."""

    path: str
    size: int
    count: int
    serializer: str
    file_offset: int = 0

    @property
    def segment(self) -> FileRef:
        return FileRef(self.path, self.file_offset, self.size)

    def to_dict(self) -> dict[str, Any]:
        d = {"path": self.path, "size": self.size, "count": self.count, "serializer": self.serializer}
        return {**d, "file_offset": self.file_offset} if self.file_offset else d

    @staticmethod
    def from_dict(data: dict[str, Any]) -> OutputsHandle:
        return OutputsHandle(**data)


def write_outputs(rows: list[Any], out: SegmentWriter, serializer: Serializer) -> OutputsHandle | None:
    """Stage ``rows`` as one logical file; None when there are no rows."""
    if not rows:
        return None
    data = frame(FrameKind.STAGED_OUTPUTS, encode(serializer, rows, "output rows to stage"))
    ref = out.write(data)
    return OutputsHandle(ref.path, len(data), len(rows), serializer.name, ref.offset)


def read_outputs(storage: CheckpointStorage, handle: OutputsHandle, allow_pickle: bool = False,
                 decode: bool = True) -> list[Any]:
    """The staged rows of ``handle``, verified (``decode=False``: only verified, nothing returned)."""
    data = storage.read_range(handle.path, handle.file_offset, handle.size, "staged outputs")
    payload = read_single_frame(data, f"{storage.path(handle.path)} at offset {handle.file_offset}",
                                FrameKind.STAGED_OUTPUTS)
    if not decode:
        return []
    return serializer_by_name(handle.serializer, allow_pickle, f"staged outputs {handle.path}").loads(payload)
