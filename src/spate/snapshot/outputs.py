"""Staged outputs: a batch's output rows written as part of its checkpoint (write-ahead), so the sink can be
given them again with the same batch id after a crash between checkpoint completion and delivery.

They are staged either framed (an Arrow IPC stream, or a list of rows with the output serializer) as a logical
file that may share a physical file with others, or as a Parquet file of their own, which Spark reads in the
JVM (no Python worker reads them back for the sink)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from spate.errors import CorruptFileError
from spate.frames import FrameKind, RangeReader, frame, read_single_frame
from spate.segments import FileRef, SegmentWriter
from spate.serde import Serializer, encode, serializer_by_name

ARROW = "arrow"  # the serializer name of outputs staged as an Arrow IPC stream
PARQUET = "parquet"  # the serializer name of outputs staged as a Parquet file of their own (no frame)


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


def write_outputs_parquet(rows: pa.Table, out: SegmentWriter) -> OutputsHandle | None:
    """Stage ``rows`` as a Parquet file of their own (``out`` writes whole files), with page checksums so a
    corrupt file is detected when read; None when there are no rows."""
    if not rows.num_rows:
        return None
    sink = pa.BufferOutputStream()
    pq.write_table(rows, sink, write_page_checksum=True)
    data = sink.getvalue().to_pybytes()
    ref = out.write(data)
    if ref.offset:
        raise ValueError(f"{ref.path}: staged Parquet outputs must be a file of their own, not a segment")
    return OutputsHandle(ref.path, len(data), rows.num_rows, PARQUET)


def read_outputs(storage: RangeReader, handle: OutputsHandle, allow_pickle: bool = False,
                 decode: bool = True) -> list[Any]:
    """The staged rows of ``handle``, verified (``decode=False``: only verified, nothing returned)."""
    if handle.serializer == PARQUET:
        table = _parquet_table(storage, handle)
        return table.to_pylist() if decode else []
    payload = _payload(storage, handle)
    if not decode:
        return []
    if handle.serializer == ARROW:
        return _ipc_table(payload).to_pylist()
    return serializer_by_name(handle.serializer, allow_pickle, f"staged outputs {handle.path}").loads(payload)


def read_outputs_table(storage: RangeReader, handle: OutputsHandle, schema: pa.Schema,
                       allow_pickle: bool = False) -> pa.Table:
    """The staged rows of ``handle`` as an Arrow table of ``schema``, verified."""
    if handle.serializer == PARQUET:
        table = _parquet_table(storage, handle)
    elif handle.serializer != ARROW:
        return pa.Table.from_pylist(read_outputs(storage, handle, allow_pickle), schema=schema)
    else:
        table = _ipc_table(_payload(storage, handle))
    if table.schema != schema:
        table = table.cast(schema)
    return table


def _payload(storage: RangeReader, handle: OutputsHandle) -> bytes:
    data = storage.read_range(handle.path, handle.file_offset, handle.size, "staged outputs")
    return read_single_frame(data, f"{storage.path(handle.path)} at offset {handle.file_offset}",
                             FrameKind.STAGED_OUTPUTS)


def _ipc_table(payload: bytes) -> pa.Table:
    with pa.ipc.open_stream(pa.py_buffer(payload)) as reader:
        return reader.read_all()


def _parquet_table(storage: RangeReader, handle: OutputsHandle) -> pa.Table:
    """The rows of a staged Parquet file, its size and page checksums verified."""
    where = storage.path(handle.path)
    data = storage.read_range(handle.path, 0, handle.size, "staged outputs")  # raises if truncated
    try:
        table = pq.read_table(pa.BufferReader(data), page_checksum_verification=True)
    except (pa.ArrowInvalid, OSError) as e:
        raise CorruptFileError(f"{where}: staged outputs are not a readable Parquet file ({e})") from e
    if table.num_rows != handle.count:
        raise CorruptFileError(f"{where}: {table.num_rows} staged rows, the checkpoint names {handle.count}")
    return table
