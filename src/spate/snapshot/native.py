"""Native snapshots of an lmdb table: the table's own file, as Flink's native RocksDB snapshots are its SST files.

A large lmdb table's keyed snapshot (the changelog's materialization, or a full snapshot) can be an lmdb data file
of its own, built from the table's key groups in key order (:mod:`spate.snapshot.native_write`). Why: a keyed
snapshot in spate's key-group frames is restored entry by entry (decoded, then put into a new table); this file is
taken as it is, as the read-only base of the restored table (:mod:`spate.runtime.recovery.download`: hard-linked
from a local root, else downloaded, :func:`download_native`), so that a restore costs getting the file (plus the
log, with the changelog). Its digest, the sum of its key groups', is stored in it and in the handle; its bytes are
checked against the handle's CRC-32 on every read.

Where the file cannot be a table's base (key groups from several files; a heap table; reading state for
inspection; a savepoint's or a rescaled subtask's re-write as key-group frames, :func:`write_as_key_groups`), it is
read key group by key group (:class:`NativeSource`: in place from a local root, else downloaded once), the same
``[key, value, ...]`` a key-group frame holds.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import lmdb

from spate.crc import crc32
from spate.errors import CorruptFileError, SpateError
from spate.frames import RangeReader
from spate.fs import CheckpointStorage, LocalStorage
from spate.segments import SegmentWriter
from spate.snapshot.handles import KeyedHandle, NativeSnapshotHandle
from spate.snapshot.keyed import SnapshotScope, key_group_frame_parts, write_frames
from spate.snapshot.read_ahead import read_ahead
from spate.state.keyed import StateMeta
from spate.state.lmdb_readonly import ReadOnlyTable
from spate.state.overlay import SharedReaders
from spate.write_behind import WriteBehindFile

CHUNK_BYTES = 16 << 20  # a native snapshot is read from storage in ranged reads of this size
READ_THREADS = 3
READ_AHEAD_BYTES = 64 << 20


# -- reading --------------------------------------------------------------------------------------------------
def native_chunks(storage: RangeReader, handle: NativeSnapshotHandle, context: str) -> Iterator[bytes]:
    """The bytes of a native snapshot's file in order, read ahead by a few threads in ranged reads; raises
    :class:`~spate.errors.CorruptFileError` after the last chunk if their CRC-32 is not the handle's."""
    spans = [(at, min(CHUNK_BYTES, handle.size - at)) for at in range(0, handle.size, CHUNK_BYTES)]
    reads = [(n, functools.partial(storage.read_range, handle.path, handle.file_offset + at, n, context))
             for at, n in spans]
    crc = 0
    with ThreadPoolExecutor(READ_THREADS, thread_name_prefix="spate-native-read") as pool:
        fetched = read_ahead(pool, reads, READ_AHEAD_BYTES)
        try:
            for data in fetched:
                crc = crc32(data, crc)
                yield data
        finally:
            fetched.close()
    if crc != handle.crc:
        raise CorruptFileError(f"{storage.path(handle.path)} at offset {handle.file_offset}{_ctx(context)}: the native "
                               f"lmdb snapshot's CRC-32 is {crc}, its checkpoint metadata says {handle.crc}: the file "
                               "is damaged")


def download_native(storage: CheckpointStorage, handle: NativeSnapshotHandle, dest: str, context: str = "") -> None:
    """Write a native snapshot's file to the new local file ``dest`` (an lmdb data file), checked against its
    CRC-32; on any failure nothing is left at ``dest``."""
    try:
        with WriteBehindFile(open(dest, "xb", buffering=0)) as f:  # noqa: SIM115 - closed by the wrapper
            for data in native_chunks(storage, handle, context):
                view = memoryview(data)
                while view:
                    view = view[f.write(view):]
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(dest)
        raise


def verify_native(storage: RangeReader, handle: NativeSnapshotHandle, context: str = "") -> None:
    """Read a native snapshot's file and check its CRC-32 (raises what :func:`native_chunks` raises)."""
    for _ in native_chunks(storage, handle, context):
        pass


def local_file(storage: CheckpointStorage, handle: NativeSnapshotHandle) -> str | None:
    """The path of a native snapshot's file on this machine's file system, if the handle is the whole file of a
    local root (not a segment of a merged file, no symbolic link on the way): it can be read, or hard-linked, in
    place. None: it must be downloaded."""
    if not isinstance(storage, LocalStorage) or handle.file_offset != 0 or storage.through_link(handle.path):
        return None
    path = storage.path(handle.path)
    try:
        return path if os.path.getsize(path) == handle.size else None
    except OSError:
        return None


class NativeSource:
    """A native snapshot read key group by key group: read in place where it is a local file (its CRC-32 checked
    first), else downloaded once, on the first read, into a directory of its own under ``scratch``, deleted by
    :meth:`close`. Thread-safe."""

    def __init__(self, storage: CheckpointStorage, handle: NativeSnapshotHandle, context: str,
                 scratch: str | None = None, readers: SharedReaders | None = None) -> None:
        self.storage, self.handle, self.context, self.scratch = storage, handle, context, scratch
        self._readers = readers  # the process's open lmdb files: a table's base may be this very file
        self._shared = False
        self._lock = threading.Lock()
        self._dir: str | None = None
        self._table: ReadOnlyTable | None = None

    def key_groups(self, kgs: list[int]) -> list[tuple[int, list[bytes], None]]:
        """(key group, its ``[key, value, ...]``, no digest) of the key groups ``kgs`` that hold data."""
        table = self._open()
        return [(kg, flat, None) for kg in kgs if (flat := table.key_group_flat(kg))]

    def _open(self) -> ReadOnlyTable:
        with self._lock:
            if self._table is None:
                self._table = self._in_place() or self._downloaded()
            return self._table

    def _in_place(self) -> ReadOnlyTable | None:
        """The local file opened read-only where it is, its CRC-32 checked; None if there is no local file, or lmdb
        has it open in this process already (as a table's base: one process opens one file once)."""
        path = local_file(self.storage, self.handle)
        if path is None:
            return None
        verify_native(self.storage, self.handle, self.context)
        try:
            if self._readers is not None:
                table = self._readers.open(path, file=True)
                self._shared = True
                return table
            return ReadOnlyTable(path, file=True)
        except (lmdb.Error, SpateError):
            return None

    def _downloaded(self) -> ReadOnlyTable:
        self._dir = tempfile.mkdtemp(prefix="spate-native-", dir=self.scratch)
        path = os.path.join(self._dir, "data.mdb")
        download_native(self.storage, self.handle, path, self.context)
        return ReadOnlyTable(path, file=True)

    def close(self) -> None:
        with self._lock:
            if self._table is not None:
                if self._shared and self._readers is not None:
                    self._readers.release(self._table)
                else:
                    self._table.close()
                self._table = None
            if self._dir is not None:
                shutil.rmtree(self._dir, ignore_errors=True)
                self._dir = None


def _ctx(context: str) -> str:
    return f" ({context})" if context else ""


def write_as_key_groups(storage: CheckpointStorage, handle: NativeSnapshotHandle, out: SegmentWriter,
                        context: str, readers: SharedReaders | None = None) -> KeyedHandle:
    """The key groups of a native snapshot's handle, read one at a time, written with ``out`` as a keyed snapshot
    file of spate's key-group frames (what a savepoint keeps, and a rescaled subtask's share of another's file);
    ``readers``: the process's open lmdb files, to read the file through if a table's base is that file."""
    native = NativeSource(storage, handle, context, readers=readers)
    scope = SnapshotScope(range(handle.start, handle.end + 1), tuple(StateMeta.from_dict(m) for m in handle.states),
                          {})
    try:
        frames = ((kg, key_group_frame_parts(kg, flat)) for kg in handle.held
                  for _kg, flat, _digest in native.key_groups([kg]))
        written = write_frames(frames, scope, out)
    finally:
        native.close()
    return handle if written is None else written
