"""Snapshots of operator state: one frame per state name, elements serialized one by one."""

from __future__ import annotations

import msgpack

from spate.errors import CorruptFileError
from spate.frames import FrameKind, RangeReader, frame, read_single_frame
from spate.segments import SegmentWriter
from spate.snapshot.handles import OperatorStateEntry, OperatorStateHandle, OperatorStatePiece
from spate.state.operator import OperatorStateBackend


def write_operator_snapshot(backend: OperatorStateBackend, out: SegmentWriter) -> OperatorStateHandle | None:
    """Write every operator state of ``backend`` as one logical file; None if it has none."""
    frames, entries, pos = [], {}, 0
    for name, mode, serializer, encoded in backend.snapshot_states():
        fr = frame(FrameKind.OPERATOR_STATE, msgpack.packb([name, mode, serializer, encoded], use_bin_type=True))
        count = len(encoded) // 2 if mode == "broadcast" else len(encoded)
        entries[name] = OperatorStateEntry(mode, serializer, pos, len(fr), count)
        frames.append(fr)
        pos += len(fr)
    if not frames:
        return None
    ref = out.write(b"".join(frames))
    return OperatorStateHandle(ref.path, pos, entries, ref.offset)


def read_operator_piece(storage: RangeReader, piece: OperatorStatePiece, context: str = "") -> list[bytes]:
    """The encoded elements ``piece`` designates (all key/value pairs for broadcast state)."""
    data = storage.read_range(piece.path, piece.offset, piece.length, context)
    where = f"{storage.path(piece.path)} at offset {piece.offset}{f' ({context})' if context else ''}"
    name, mode, _serializer, encoded = msgpack.unpackb(read_single_frame(data, where, FrameKind.OPERATOR_STATE),
                                                       raw=False)
    if name != piece.name or mode != piece.mode:
        raise CorruptFileError(f"{where}: holds operator state {name!r} ({mode}), metadata expects "
                               f"{piece.name!r} ({piece.mode})")
    if mode == "broadcast":
        return encoded
    return encoded[piece.start:piece.stop]
