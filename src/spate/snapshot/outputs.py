"""Staged outputs: a batch's output rows written as part of its checkpoint (write-ahead), so the sink can be
given them again with the same batch id after a crash between checkpoint completion and delivery."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from spate.fs import CheckpointStorage, FrameKind, frame, read_single_frame
from spate.serde import Serializer, encode, serializer_by_name


@dataclass(frozen=True)
class OutputsHandle:
    """A file of staged output rows of one subtask and batch."""

    path: str
    size: int
    count: int
    serializer: str

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "size": self.size, "count": self.count, "serializer": self.serializer}

    @staticmethod
    def from_dict(data: dict[str, Any]) -> OutputsHandle:
        return OutputsHandle(**data)


def write_outputs(rows: list[Any], storage: CheckpointStorage, path: str,
                  serializer: Serializer) -> OutputsHandle | None:
    """Stage ``rows`` at ``path``; None when there are no rows."""
    if not rows:
        return None
    data = frame(FrameKind.STAGED_OUTPUTS, encode(serializer, rows, f"output rows staged at {path}"))
    storage.write(path, data)
    return OutputsHandle(path, len(data), len(rows), serializer.name)


def read_outputs(storage: CheckpointStorage, handle: OutputsHandle, allow_pickle: bool = False) -> list[Any]:
    """The staged rows of ``handle``, verified."""
    data = storage.read(handle.path, "staged outputs")
    payload = read_single_frame(data, storage.path(handle.path), FrameKind.STAGED_OUTPUTS)
    return serializer_by_name(handle.serializer, allow_pickle, f"staged outputs {handle.path}").loads(payload)
