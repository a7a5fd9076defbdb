"""The checksummed frame every spate file is made of: header (magic, format version, kind, flags, payload length,
crc32) and payload, optionally zstd-compressed. Frames know nothing of where their bytes are stored; a ranged read
of several frames goes through any :class:`RangeReader` (a checkpoint storage)."""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Protocol

import zstandard

from spate.crc import crc32
from spate.errors import RESTORE_ADVICE, CorruptFileError


class RangeReader(Protocol):
    """What a ranged read of frames needs from a storage."""

    def read_range(self, rel: str, offset: int, length: int, context: str = "") -> bytes: ...

    def path(self, rel: str) -> str: ...


FRAME_MAGIC = b"SPTF"
FRAME_FORMAT_VERSION = 2  # 2: the crc32 covers the header fields too; 1 (still read): the payload only
_HEADER = struct.Struct(">4sHBBQI")  # magic, format version, kind, flags, payload length, crc32
_FIELDS = struct.Struct(">4sHBBQ")  # the header without its crc32: what a version-2 crc covers before the payload
_CRC = struct.Struct(">I")
FRAME_HEADER_SIZE = _HEADER.size
SPAN_READ_BYTES = 16 << 20  # bytes of frames fetched by one ranged read (object stores: few requests)
_FLAG_ZSTD = 1


class FrameKind:
    """The kind byte of a frame: what its payload holds."""

    QUERY = 1
    METADATA = 2
    KEY_GROUP = 3
    OPERATOR_STATE = 4
    STAGED_OUTPUTS = 5
    DELIVERED = 6
    CHANGE_SET = 7
    EPOCH = 8
    CHANGE_LIST = 9


def frame(kind: int, payload: bytes, compress: bool = False) -> bytes:
    """Wrap ``payload`` in a frame: header (magic, version, kind, flags, length, crc32) + payload; the crc32
    covers the header fields before it and the payload."""
    header, body = frame_parts(kind, payload, compress)
    return header + body


def frame_parts(kind: int, payload: bytes, compress: bool = False) -> tuple[bytes, bytes]:
    """:func:`frame` as (header, payload), to be written one after the other: a large payload (a key group of
    a large state) is not copied once more to be framed."""
    flags = 0
    if compress:
        payload = zstandard.ZstdCompressor(level=1).compress(payload)
        flags |= _FLAG_ZSTD
    fields = _FIELDS.pack(FRAME_MAGIC, FRAME_FORMAT_VERSION, kind, flags, len(payload))
    return fields + _CRC.pack(crc32(payload, crc32(fields))), payload


@dataclass(frozen=True)
class Frame:
    """A verified frame. ``payload`` is a view of the bytes read (no copy: a span's frames are checked and
    decoded where they lie; a large state's restore and a re-written span read every byte once), or the
    decompressed bytes."""

    kind: int
    payload: bytes | memoryview
    offset: int
    length: int


def iter_frames(data: bytes, where: str, base_offset: int = 0) -> Iterator[Frame]:
    """Yield every frame of ``data``, verifying each; ``where`` names the file in error messages."""
    view = memoryview(data)
    pos = 0
    while pos < len(data):
        yield _read_frame(view, pos, where, base_offset)
        pos += FRAME_HEADER_SIZE + _HEADER.unpack_from(view, pos)[4]


def read_span_frames(storage: RangeReader, path: str, offsets: Mapping[int, tuple[int, int]], kind: int,
                     context: str = "", file_offset: int = 0) -> tuple[str, Iterator[Frame]]:
    """The frames of ``offsets`` (key group → (offset, length) within the logical file at ``file_offset`` of
    ``path``), each verified and of ``kind``, fetched as they are consumed by ranged reads of about
    :data:`SPAN_READ_BYTES` (one frame at least): few requests, and never a large file whole in memory. A read
    covers the frames between those it was made for too. Frame offsets are relative to the logical file.
    Returns (where, frames)."""
    segment = f" segment at {file_offset}" if file_offset else ""
    where = f"{storage.path(path)}{segment}{f' ({context})' if context else ''}"

    def frames() -> Iterator[Frame]:
        for offset, length in _span_reads(offsets.values()):
            data = storage.read_range(path, file_offset + offset, length, context)
            for fr in iter_frames(data, where, offset):
                if fr.kind != kind:
                    raise CorruptFileError(f"{where}: frame at offset {fr.offset} has kind {fr.kind}, expected "
                                           f"{kind}")
                yield fr

    return where, frames()


def _span_reads(frames: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """(offset, length) of the reads that fetch ``frames`` ((offset, length) each), in file order: contiguous
    runs of about :data:`SPAN_READ_BYTES`."""
    reads: list[tuple[int, int]] = []
    start = end = -1
    for offset, length in sorted(frames):
        if start >= 0 and offset + length - start <= SPAN_READ_BYTES:
            end = max(end, offset + length)
            continue
        if start >= 0:
            reads.append((start, end - start))
        start, end = offset, offset + length
    if start >= 0:
        reads.append((start, end - start))
    return reads


def contiguous_reads(frame_starts: Iterable[int], end: int) -> list[tuple[int, int]]:
    """(offset, length) of reads that cover every byte from the first of ``frame_starts`` to ``end``, cut at
    frame starts into reads of about :data:`SPAN_READ_BYTES` (one frame at least): a span copied as it is."""
    reads: list[tuple[int, int]] = []
    start = -1
    for at in sorted(frame_starts):
        if start < 0:
            start = at
        elif at - start >= SPAN_READ_BYTES:
            reads.append((start, at - start))
            start = at
    if start >= 0:
        reads.append((start, end - start))
    return reads


def read_single_frame(data: bytes, where: str, expected_kind: int | None = None) -> bytes:
    """Verify that ``data`` is exactly one frame (of ``expected_kind``) and return its payload."""
    if len(data) < FRAME_HEADER_SIZE:
        raise CorruptFileError(f"{where}: truncated ({len(data)} bytes, not a spate file)")
    fr = _read_frame(memoryview(data), 0, where, 0)
    if fr.length != len(data):
        raise CorruptFileError(f"{where}: {len(data) - fr.length} unexpected trailing bytes")
    if expected_kind is not None and fr.kind != expected_kind:
        raise CorruptFileError(f"{where}: frame kind {fr.kind}, expected {expected_kind}")
    return bytes(fr.payload)


def _read_frame(view: memoryview, pos: int, where: str, base_offset: int) -> Frame:
    at = f"{where} at offset {base_offset + pos}"
    if len(view) - pos < FRAME_HEADER_SIZE:
        raise CorruptFileError(f"{at}: truncated frame header; the file is damaged, restore from an older "
                               "checkpoint or a savepoint")
    magic, version, kind, flags, length, crc = _HEADER.unpack_from(view, pos)
    if magic != FRAME_MAGIC:
        raise CorruptFileError(f"{at}: not a spate frame (bad magic {magic!r})")
    if version == 0 or flags & ~_FLAG_ZSTD:
        raise CorruptFileError(f"{at}: invalid frame header (version {version}, flags {flags:#x})")
    if version > FRAME_FORMAT_VERSION:
        raise CorruptFileError(f"{at}: frame format version {version} is newer than this spate "
                               f"(supports {FRAME_FORMAT_VERSION}); upgrade spate")
    start = pos + FRAME_HEADER_SIZE
    if len(view) - start < length:
        raise CorruptFileError(f"{at}: truncated (frame says {length} bytes, {len(view) - start} present)")
    payload: bytes | memoryview = view[start:start + length]
    covered = crc32(view[pos:pos + _FIELDS.size]) if version >= 2 else 0  # version 1: the payload only
    if crc32(payload, covered) != crc:
        raise CorruptFileError(f"{at}: checksum mismatch; the file is corrupt: {RESTORE_ADVICE}")
    if flags & _FLAG_ZSTD:
        payload = _decompress(payload, at)
    return Frame(kind, payload, base_offset + pos, FRAME_HEADER_SIZE + length)


def _decompress(stored: bytes | memoryview, at: str) -> bytes:
    try:
        return zstandard.ZstdDecompressor().decompress(stored)
    except zstandard.ZstdError as e:
        raise CorruptFileError(f"{at}: the zstd-compressed payload cannot be decompressed ({e}); the file is "
                               f"corrupt: {RESTORE_ADVICE}") from e
