"""The messages between a subtask and the process that reads its lmdb table for a materialization
(:mod:`spate.changelog.materializer_process`), over that process's standard input and output.

Each message is a 4-byte big-endian length and a msgpack array whose first item names the message (a
:class:`KeyGroupRead`'s frame follows its array, raw, its length the array's last item). The subtask
sends one :class:`Start`, then an :class:`Advance` at every sequence-number boundary; the reader answers with one
:class:`KeyGroupRead` per key group (natively: with no frame, and a :class:`NativeWritten` after the last key group
of each part), then :class:`Finished` or :class:`Failed`. The pipe lives as long as the
one materialization: nothing of it is stored.
"""

from __future__ import annotations

import struct
from dataclasses import astuple, dataclass
from typing import BinaryIO

import msgpack

from spate.errors import SpateError

_LENGTH = struct.Struct(">I")


@dataclass(frozen=True)
class Start:
    """Read key groups ``first``..``last`` of the lmdb environment in ``path``, starting from the snapshot of
    ``txn_id``: the table committed at sequence number ``position``. With ``native`` (a file path), write them
    into a new lmdb data file there, a native snapshot (:mod:`spate.snapshot.native`), instead of framing them, at
    most ``bytes_per_s`` of entries a second while the disk's write-back is behind (None: as fast as the disk
    goes). With ``part_bytes`` too, the snapshot is written in parts: a file is finished once it holds that many
    bytes of entries, and the key groups after it go into a new one (None: one file)."""

    path: str
    first: int
    last: int
    position: int
    txn_id: int
    native: str = ""
    bytes_per_s: float | None = None
    part_bytes: int | None = None


@dataclass(frozen=True)
class Advance:
    """The table is committed at sequence number ``position`` as lmdb transaction ``txn_id``: read on from that
    snapshot, if it is still the newest when the reader opens it."""

    position: int
    txn_id: int


@dataclass(frozen=True)
class KeyGroupRead:
    """Key group ``kg`` read at ``position``: its snapshot frame, or empty bytes for an empty key group."""

    kg: int
    position: int
    frame: bytes


@dataclass(frozen=True)
class NativeWritten:
    """A native snapshot's file at ``path`` is complete, holding key groups up to ``last`` (from the one after the
    previous file's ``last``, or the first): the key groups that hold data, the table digest it records, and the
    file's CRC-32."""

    groups: list[int]
    digest: int
    crc: int
    path: str
    last: int


@dataclass(frozen=True)
class Finished:
    """Every key group was read."""


@dataclass(frozen=True)
class Failed:
    """The reader stopped: ``error`` says why."""

    error: str


Message = Start | Advance | KeyGroupRead | NativeWritten | Finished | Failed
_KINDS: dict[str, type[Message]] = {k.__name__: k for k in (Start, Advance, KeyGroupRead, NativeWritten, Finished,
                                                            Failed)}


class ProtocolError(SpateError):
    """The other side sent something that is not a message, or went away mid-message (a reader process that
    died: the materialization fails and is retried)."""


def send(out: BinaryIO, message: Message) -> None:
    if isinstance(message, KeyGroupRead):  # the frame follows the array raw: packing megabytes would copy them
        body = msgpack.packb([KeyGroupRead.__name__, message.kg, message.position, len(message.frame)])
        out.write(_LENGTH.pack(len(body)) + body)
        out.write(message.frame)
    else:
        body = msgpack.packb([type(message).__name__, *astuple(message)], use_bin_type=True)
        out.write(_LENGTH.pack(len(body)) + body)
    out.flush()


def receive(source: BinaryIO) -> Message | None:
    """The next message, or None at the end of the stream (the other side closed it between messages)."""
    head = source.read(_LENGTH.size)
    if not head:
        return None
    if len(head) < _LENGTH.size:
        raise ProtocolError("the stream ended inside a message's length")
    (length,) = _LENGTH.unpack(head)
    try:
        name, *fields = msgpack.unpackb(_exactly(source, length), raw=False)
        if name == KeyGroupRead.__name__:
            kg, position, frame_length = fields
            return KeyGroupRead(kg, position, _exactly(source, frame_length))
        return _KINDS[name](*fields)
    except (ValueError, TypeError, KeyError, msgpack.UnpackException) as e:
        raise ProtocolError(f"not a materializer message: {e}") from e


def _exactly(source: BinaryIO, length: int) -> bytes:
    data = source.read(length)
    if len(data) < length:
        raise ProtocolError(f"the stream ended inside a message ({len(data)} of {length} bytes)")
    return data
