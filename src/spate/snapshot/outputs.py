"""Staged outputs: a batch's output rows written as part of its checkpoint (write-ahead), so the sink can be
given them again with the same batch id after a crash between checkpoint completion and delivery."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from spate.frames import FrameKind, frame, read_single_frame
from spate.fs import CheckpointStorage
from spate.segments import FileRef, SegmentWriter
from spate.serde import Serializer, encode, serializer_by_name

ARROW = "arrow"  # the serializer name of outputs staged as an Arrow IPC stream


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


def write_outputs(rows: list[Any] | pa.Table, out: SegmentWriter, serializer: Serializer) -> OutputsHandle | None:
    """Stage ``rows`` as one logical file; None when there are no rows. An Arrow table (rows of the output
    schema) is staged as an Arrow IPC stream (serializer ``"arrow"``), a list of rows with ``serializer``."""
    if not len(rows):
        return None
    if isinstance(rows, pa.Table):
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, rows.schema) as writer:
            writer.write_table(rows)
        payload, name = sink.getvalue().to_pybytes(), ARROW
    else:
        payload, name = encode(serializer, rows, "output rows to stage"), serializer.name
    data = frame(FrameKind.STAGED_OUTPUTS, payload)
    ref = out.write(data)
    return OutputsHandle(ref.path, len(data), len(rows), name, ref.offset)


def read_outputs(storage: CheckpointStorage, handle: OutputsHandle, allow_pickle: bool = False,
                 decode: bool = True) -> list[Any]:
    """The staged rows of ``handle``, verified (``decode=False``: only verified, nothing returned)."""
    payload = _payload(storage, handle)
    if not decode:
        return []
    if handle.serializer == ARROW:
        return _ipc_table(payload).to_pylist()
    return serializer_by_name(handle.serializer, allow_pickle, f"staged outputs {handle.path}").loads(payload)


def read_outputs_table(storage: CheckpointStorage, handle: OutputsHandle, schema: pa.Schema,
                       allow_pickle: bool = False) -> pa.Table:
    """The staged rows of ``handle`` as an Arrow table of ``schema``, verified."""
    if handle.serializer != ARROW:
        return pa.Table.from_pylist(read_outputs(storage, handle, allow_pickle), schema=schema)
    table = _ipc_table(_payload(storage, handle))
    if table.schema != schema:
        table = table.cast(schema)
    return table


def _payload(storage: CheckpointStorage, handle: OutputsHandle) -> bytes:
    data = storage.read_range(handle.path, handle.file_offset, handle.size, "staged outputs")
    return read_single_frame(data, f"{storage.path(handle.path)} at offset {handle.file_offset}",
                             FrameKind.STAGED_OUTPUTS)


def _ipc_table(payload: bytes) -> pa.Table:
    with pa.ipc.open_stream(pa.py_buffer(payload)) as reader:
        return reader.read_all()
