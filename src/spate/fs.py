"""Checkpoint storage I/O on ``pyarrow.fs`` URIs, and the checksummed frame every spate file is made of.

Paths handed to :class:`CheckpointStorage` are relative to its root and validated so that nothing read from
metadata can point outside the root.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import posixpath
import stat
import struct
import threading
import uuid
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow.fs as pafs
import zstandard

from spate.errors import CheckpointError, CorruptFileError, MissingFileError
from spate.layout import is_marker, is_spate_dir, is_spate_file
from spate.objectstore import put_if_absent

log = logging.getLogger(__name__)

FRAME_MAGIC = b"SPTF"
FRAME_FORMAT_VERSION = 2  # 2: the crc32 covers the header fields too; 1 (still read): the payload only
_HEADER = struct.Struct(">4sHBBQI")  # magic, format version, kind, flags, payload length, crc32
_FIELDS = struct.Struct(">4sHBBQ")  # the header without its crc32: what a version-2 crc covers before the payload
_CRC = struct.Struct(">I")
FRAME_HEADER_SIZE = _HEADER.size
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


def frame(kind: int, payload: bytes, compress: bool = False) -> bytes:
    """Wrap ``payload`` in a frame: header (magic, version, kind, flags, length, crc32) + payload; the crc32
    covers the header fields before it and the payload."""
    flags = 0
    if compress:
        payload = zstandard.ZstdCompressor(level=1).compress(payload)
        flags |= _FLAG_ZSTD
    fields = _FIELDS.pack(FRAME_MAGIC, FRAME_FORMAT_VERSION, kind, flags, len(payload))
    return fields + _CRC.pack(zlib.crc32(payload, zlib.crc32(fields))) + payload


@dataclass(frozen=True)
class Frame:
    kind: int
    payload: bytes
    offset: int
    length: int


def iter_frames(data: bytes, where: str, base_offset: int = 0) -> Iterator[Frame]:
    """Yield every frame of ``data``, verifying each; ``where`` names the file in error messages."""
    view = memoryview(data)
    pos = 0
    while pos < len(data):
        yield _read_frame(view, pos, where, base_offset)
        pos += FRAME_HEADER_SIZE + _HEADER.unpack_from(view, pos)[4]


def read_span_frames(storage: CheckpointStorage, path: str, offsets: dict[int, tuple[int, int]], kind: int,
                     context: str = "", file_offset: int = 0) -> tuple[str, Iterator[Frame]]:
    """The frames between the first and last of ``offsets`` (key group → (offset, length) within the logical
    file at ``file_offset`` of ``path``), fetched with one ranged read, each verified and of ``kind``.
    Frame offsets are relative to the logical file. Returns (where, frames)."""
    first, last = offsets[min(offsets)], offsets[max(offsets)]
    offset, length = first[0], last[0] + last[1] - first[0]
    data = storage.read_range(path, file_offset + offset, length, context)
    segment = f" segment at {file_offset}" if file_offset else ""
    where = f"{storage.path(path)}{segment}{f' ({context})' if context else ''}"

    def frames() -> Iterator[Frame]:
        for fr in iter_frames(data, where, offset):
            if fr.kind != kind:
                raise CorruptFileError(f"{where}: frame at offset {fr.offset} has kind {fr.kind}, expected {kind}")
            yield fr

    return where, frames()


def read_single_frame(data: bytes, where: str, expected_kind: int | None = None) -> bytes:
    """Verify that ``data`` is exactly one frame (of ``expected_kind``) and return its payload."""
    if len(data) < FRAME_HEADER_SIZE:
        raise CorruptFileError(f"{where}: truncated ({len(data)} bytes, not a spate file)")
    fr = _read_frame(memoryview(data), 0, where, 0)
    if fr.length != len(data):
        raise CorruptFileError(f"{where}: {len(data) - fr.length} unexpected trailing bytes")
    if expected_kind is not None and fr.kind != expected_kind:
        raise CorruptFileError(f"{where}: frame kind {fr.kind}, expected {expected_kind}")
    return fr.payload


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
    payload = bytes(view[start:start + length])
    covered = zlib.crc32(view[pos:pos + _FIELDS.size]) if version >= 2 else 0  # version 1: the payload only
    if zlib.crc32(payload, covered) != crc:
        raise CorruptFileError(f"{at}: checksum mismatch; the file is corrupt, restore from an older "
                               "checkpoint or a savepoint")
    if flags & _FLAG_ZSTD:
        payload = _decompress(payload, at)
    return Frame(kind, payload, base_offset + pos, FRAME_HEADER_SIZE + length)


def _decompress(stored: bytes, at: str) -> bytes:
    try:
        return zstandard.ZstdDecompressor().decompress(stored)
    except zstandard.ZstdError as e:
        raise CorruptFileError(f"{at}: the zstd-compressed payload cannot be decompressed ({e}); the file is "
                               "corrupt, restore from an older checkpoint or a savepoint") from e


def validate_relative_path(rel: str) -> str:
    """Return ``rel`` normalised, or raise ``ValueError`` if it could escape the storage root."""
    if not isinstance(rel, str) or not rel:
        raise ValueError(f"invalid storage path {rel!r}: must be a non-empty relative path")
    if rel.startswith("/") or "\\" in rel or "://" in rel:
        raise ValueError(f"invalid storage path {rel!r}: must be relative to the checkpoint root")
    norm = posixpath.normpath(rel)
    if norm == "." or norm.startswith("../") or norm == ".." or "/../" in f"/{norm}/":
        raise ValueError(f"invalid storage path {rel!r}: escapes the checkpoint root")
    return norm


def join_uri(uri: str, rel: str) -> str:
    """``uri`` + ``/rel``, keeping a query string (``s3://b/p?endpoint_override=...``) at the end."""
    base, sep, query = uri.partition("?")
    return f"{base.rstrip('/')}/{validate_relative_path(rel)}{sep}{query}"


def random_name(suffix: str = "") -> str:
    """An attempt-unique file name (never reused, so a late write cannot clobber another file)."""
    return uuid.uuid4().hex + suffix


class CheckpointStorage:
    """Files under one root URI: a local path, ``file://``, ``s3://``, ``gs://`` or ``hdfs://``."""

    def __init__(self, uri: str, filesystem: pafs.FileSystem | None = None) -> None:
        self.uri = uri
        if filesystem is not None:
            self.fs, self.root = filesystem, uri.rstrip("/")
        elif "://" in uri:
            self.fs, self.root = pafs.FileSystem.from_uri(uri)
        else:
            self.fs, self.root = pafs.LocalFileSystem(), os.path.abspath(uri)
        self.root = self.root.rstrip("/") or "/"
        self.is_local = isinstance(self.fs, pafs.LocalFileSystem)
        self.real_root = os.path.realpath(self.root) if self.is_local else self.root
        self._linkless_dirs: set[str] = set()
        self.counts = FileCounts()

    def __repr__(self) -> str:
        return f"CheckpointStorage({self.uri!r})"

    def path(self, rel: str) -> str:
        return f"{self.root}/{validate_relative_path(rel)}"

    def sub(self, rel: str) -> CheckpointStorage:
        """A storage rooted at ``rel`` below this one, on the same file system."""
        sub = CheckpointStorage.__new__(CheckpointStorage)
        sub.uri = join_uri(self.uri, rel)
        sub.fs, sub.root, sub.is_local = self.fs, self.path(rel), self.is_local
        sub.real_root = os.path.realpath(sub.root) if self.is_local else sub.root
        sub._linkless_dirs = set()
        sub.counts = FileCounts()
        return sub

    def write(self, rel: str, data: bytes) -> None:
        """Write a new file (callers use random names; no atomicity needed)."""
        with self.open_new(rel) as out:
            out.write(data)
        self.counts.add(rel, written=len(data))

    def open_new(self, rel: str) -> Any:
        """A stream writing the new file ``rel``: local files are created exclusively (never overwriting) and
        written unbuffered, so what was written is readable at once; object-store files when closed."""
        full = self.path(rel)
        self.counts.add(rel, created=1)
        if self.is_local:  # object stores have no directories; creating markers costs requests
            self._refuse_writing_through_links(rel)
            os.makedirs(posixpath.dirname(full), exist_ok=True)
            return open(full, "xb", buffering=0)  # noqa: SIM115 - the caller closes it
        return self.fs.open_output_stream(full)

    def create_exclusive(self, rel: str, data: bytes) -> None:
        """Atomically create ``rel`` with ``data``; raise ``FileExistsError`` if it exists (put-if-absent).

        Local file systems: write a temporary file and hard-link it into place (atomic, no overwrite). S3: a
        conditional PUT (``If-None-Match: *``). Other object stores have no conditional write that
        ``pyarrow.fs`` can send: a single PUT is atomic in visibility, the existence check before it is best
        effort.
        """
        full = self.path(rel)
        if not self.is_local:
            if not put_if_absent(self.uri, full, data):
                _warn_no_conditional_write(self.uri)
                if self.exists(rel):
                    raise FileExistsError(full)
                self.write(rel, data)
            return
        self._refuse_writing_through_links(rel)
        tmp = _write_synced_temp(full, data)
        try:
            os.link(tmp, full)
        finally:
            os.unlink(tmp)

    def replace(self, rel: str, data: bytes) -> None:
        """Atomically write or overwrite ``rel`` (rename on local file systems, one PUT elsewhere)."""
        full = self.path(rel)
        if not self.is_local:
            self.write(rel, data)
            return
        self._refuse_writing_through_links(rel)
        os.replace(_write_synced_temp(full, data), full)

    def read(self, rel: str, context: str = "") -> bytes:
        self._refuse_links(rel, context)
        try:
            with self.fs.open_input_stream(self.path(rel)) as f:
                return f.read()
        except FileNotFoundError as e:
            raise self._missing(rel, context) from e

    def read_range(self, rel: str, offset: int, length: int, context: str = "") -> bytes:
        self._refuse_links(rel, context)
        try:
            with self.fs.open_input_file(self.path(rel)) as f:
                data = f.read_at(length, offset)
        except FileNotFoundError as e:
            raise self._missing(rel, context) from e
        if len(data) != length:
            raise CorruptFileError(f"{self.path(rel)}{_ctx(context)}: truncated, wanted {length} bytes at "
                                   f"offset {offset}, got {len(data)}")
        return data

    def through_link(self, rel: str) -> bool:
        """Whether the local path ``rel`` passes through a symbolic link (a file or directory below the root
        that is a link): spate never reads, writes or deletes through one. A directory found free of links is
        remembered, so a hot read costs one ``lstat``."""
        if not self.is_local:
            return False
        norm = validate_relative_path(rel)
        parent = posixpath.dirname(norm)
        if parent and parent not in self._linkless_dirs:
            if os.path.realpath(f"{self.root}/{parent}") != f"{self.real_root.rstrip('/')}/{parent}":
                return True
            if os.path.isdir(f"{self.root}/{parent}"):
                self._linkless_dirs.add(parent)
        return os.path.islink(f"{self.root}/{norm}")

    def _refuse_writing_through_links(self, rel: str) -> None:
        if self.through_link(rel):
            raise CheckpointError(f"{self.path(rel)}: the path passes through a symbolic link inside the "
                                  "checkpoint root; spate never writes through links there. Remove the link")

    def _refuse_links(self, rel: str, context: str) -> None:
        if self.through_link(rel):
            raise CorruptFileError(f"{self.path(rel)}{_ctx(context)}: the path passes through a symbolic link "
                                   "inside the checkpoint root; spate never follows links there (the file may "
                                   "resolve outside the root). Replace the link with the real file")

    def _missing(self, rel: str, context: str) -> MissingFileError:
        return MissingFileError(f"{self.path(rel)}{_ctx(context)}: file is missing; it was deleted outside "
                                "spate or the storage is incomplete; restore from an older checkpoint or a "
                                "savepoint")

    def exists(self, rel: str) -> bool:
        return self.fs.get_file_info(self.path(rel)).type != pafs.FileType.NotFound

    def size(self, rel: str) -> int:
        info = self.fs.get_file_info(self.path(rel))
        if info.type == pafs.FileType.NotFound:
            raise self._missing(rel, "")
        return info.size

    def mtime_ns(self, rel: str) -> int:
        """Modification time of ``rel`` in nanoseconds (as the storage's clock tells it)."""
        info = self.fs.get_file_info(self.path(rel))
        if info.type == pafs.FileType.NotFound:
            raise self._missing(rel, "")
        return info.mtime_ns or 0

    def delete(self, rel: str) -> bool:
        """Delete a file; return False if it did not exist. A path through a symbolic link is never deleted
        (logged instead). Callers that take names from listings or metadata check them against spate's
        layout first (:func:`spate.layout.is_spate_file`)."""
        if self.through_link(rel):
            log.warning("not deleting %s: it passes through a symbolic link", self.path(rel))
            return False
        try:
            self.fs.delete_file(self.path(rel))
        except FileNotFoundError:
            return False
        self.counts.add(rel, deleted=1)
        return True

    def delete_dir(self, rel: str) -> None:
        """Delete the files spate wrote below ``rel``, then (on local disks) the directories this leaves empty.
        Other files, and the directories holding them, stay; links are never followed."""
        for path, _size in self.list_files(rel):
            if is_spate_file(path):
                self.delete(path)
        if self.is_local:
            self.remove_empty_dirs(rel)

    def remove_empty_dirs(self, rel: str = "") -> None:
        """Local disks: remove the empty directories of spate's layout below ``rel`` (and ``rel``), deepest
        first. Links are not followed; a directory holding anything else stays."""
        if rel and self.through_link(rel):
            return
        top = self.path(rel) if rel else self.root
        prefix = len(self.root.rstrip("/")) + 1
        for directory, _dirs, _files in os.walk(top, topdown=False, followlinks=False):
            if is_spate_dir(directory[prefix:]) and not os.path.islink(directory):
                with contextlib.suppress(OSError):  # not empty: it holds files that are not spate's
                    os.rmdir(directory)

    def list_files(self, rel: str = "") -> list[tuple[str, int]]:
        """Every file below ``rel`` (recursive) as (path relative to the root, size). Links are not followed
        and not listed."""
        return [(f.path, f.size) for f in self.stat_files(rel)]

    def stat_files(self, rel: str = "") -> list[FileStat]:
        """Every file below ``rel`` (recursive) with size and modification time; links are not followed."""
        if self.is_local:
            return self._walk_local(rel)
        base = self.path(rel) if rel else self.root
        infos = self.fs.get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True))
        prefix = self.root.rstrip("/") + "/"
        return sorted(FileStat(i.path[len(prefix):], i.size, i.mtime_ns or 0)
                      for i in infos if i.type == pafs.FileType.File)

    def _walk_local(self, rel: str) -> list[FileStat]:
        if rel and self.through_link(rel):
            return []
        base = self.path(rel) if rel else self.root
        prefix = len(self.root.rstrip("/")) + 1
        out = []
        for directory, _dirs, files in os.walk(base, followlinks=False):
            for name in files:
                full = os.path.join(directory, name)
                try:
                    st = os.lstat(full)
                except FileNotFoundError:  # deleted while listing
                    continue
                if stat.S_ISREG(st.st_mode):  # not a link, not a socket
                    out.append(FileStat(full[prefix:], st.st_size, st.st_mtime_ns))
        return sorted(out)

    def list_dirs(self, rel: str = "") -> list[str]:
        """Immediate sub-directories of ``rel`` (names only); links to directories are not listed."""
        if self.is_local:
            if rel and self.through_link(rel):
                return []
            try:
                with os.scandir(self.path(rel) if rel else self.root) as entries:
                    return sorted(e.name for e in entries if e.is_dir(follow_symlinks=False))
            except (FileNotFoundError, NotADirectoryError):
                return []
        base = self.path(rel) if rel else self.root
        infos = self.fs.get_file_info(pafs.FileSelector(base, recursive=False, allow_not_found=True))
        return sorted(i.base_name for i in infos if i.type == pafs.FileType.Directory)

    def list_entries(self) -> list[str]:
        """Names directly under the root (files and directories; links too)."""
        if self.is_local:
            try:
                return sorted(os.listdir(self.root))
            except (FileNotFoundError, NotADirectoryError):
                return []
        infos = self.fs.get_file_info(pafs.FileSelector(self.root, recursive=False, allow_not_found=True))
        return sorted(i.base_name for i in infos)


@dataclass(frozen=True, order=True)
class FileStat:
    """A file under a checkpoint root: path relative to the root, size, modification time (ns)."""

    path: str
    size: int
    mtime_ns: int


class FileCounts:
    """Data files (not ``_``-prefixed markers such as ``_metadata``) created and deleted through a storage,
    and the bytes written to them."""

    def __init__(self) -> None:
        self.created = 0
        self.deleted = 0
        self.bytes_written = 0
        self._lock = threading.Lock()

    def add(self, rel: str, created: int = 0, deleted: int = 0, written: int = 0) -> None:
        if is_marker(rel):
            return
        with self._lock:
            self.created += created
            self.deleted += deleted
            self.bytes_written += written


@functools.lru_cache(maxsize=32)
def storage_for(uri: str) -> CheckpointStorage:
    """One storage object per URI and process: file-system clients (S3, GCS) are costly to create, and a
    subtask needs its checkpoint storage every batch."""
    return CheckpointStorage(uri)


@functools.lru_cache(maxsize=32)
def _warn_no_conditional_write(uri: str) -> None:
    log.warning("%s: this store has no conditional write that spate can send, so creating a file only if it "
                "does not exist is best effort there; two drivers started at the same moment on this root may "
                "not be told apart. Use a local file system or S3 for exclusive take-over", uri)


def _write_synced_temp(full: str, data: bytes) -> str:
    """Write ``data`` to a fresh temporary file next to ``full``, fsynced; return its path."""
    os.makedirs(os.path.dirname(full), exist_ok=True)
    tmp = f"{full}.{random_name('.tmp')}"
    with open(tmp, "wb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())
    return tmp


def _ctx(context: str) -> str:
    return f" ({context})" if context else ""
