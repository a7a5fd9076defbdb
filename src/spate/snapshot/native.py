"""Native snapshots of an lmdb table: the table's own file, as Flink's native RocksDB snapshots are its SST files.

A materialization of a large lmdb table (the changelog's base) is written as an lmdb data file of its own: the
reader process that reads the table's key groups for the materialization puts them, in key order, into a new
file in lmdb's append mode (:class:`NativeFileBuilder`), which the subtask then places in checkpoint storage with
its CRC-32 (:func:`write_native_file`: hard-linked where the root is a local directory on the same file system,
else copied). Why: a keyed snapshot in spate's key-group
frames is restored entry by entry (decoded, then put into a new table), at about the cost of a full snapshot's
restore; this file is taken as it is, as the read-only base of the restored table
(:mod:`spate.runtime.recovery.download`: hard-linked from a local root, else downloaded, :func:`download_native`),
so that a restore from a materialization and its log costs getting the file plus the log. Its digest, the sum of
its key groups', is stored in it and in the handle.

Where the file cannot be a table's base (key groups from several files; a heap table; reading state for
inspection; a savepoint's or a rescaled subtask's re-write as key-group frames, :func:`write_as_key_groups`), it is
read key group by key group (:class:`NativeSource`: in place from a local root, else downloaded once), the same
``[key, value, ...]`` a key-group frame holds.
"""

from __future__ import annotations

import collections
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
from spate.state.lmdb_digest import DIGEST_KEY, MASK64, key_group_digest
from spate.state.lmdb_readonly import ReadOnlyTable
from spate.state.lmdb_scan import KG_PREFIXES
from spate.state.overlay import SharedReaders
from spate.write_behind import start_write_back

CHUNK_BYTES = 16 << 20  # a native snapshot is read from storage in ranged reads of this size
READ_THREADS = 3
READ_AHEAD_BYTES = 64 << 20
COMMIT_BYTES = 64 << 20  # a native snapshot being built is committed every this many bytes of entries


class NativeFileBuilder:
    """A native snapshot's lmdb data file at ``path``, built from the table's key groups read in order (by a
    materialization's reader process): each key group put in lmdb's append mode (pages filled, no search per
    entry), committed every :data:`COMMIT_BYTES`; the table digest summed key group by key group.

    Why not lmdb's own copy of the table: a consistent copy holds one read transaction for as long as it runs, and
    lmdb reuses no page the batches free meanwhile; at 10 GB the live file grew to 3.3x the state. Built from the
    key groups the materialization reads anyway, from a view moved forward at every boundary, the file pins no
    more than the frames it replaces, and compacts as it goes."""

    def __init__(self, path: str, map_size: int) -> None:
        self.path = path
        self.env = lmdb.open(path, subdir=False, lock=False, map_size=map_size, sync=False, metasync=False,
                             readahead=False, max_dbs=0)
        self._fd = os.open(path, os.O_RDONLY)  # to start each commit's write-back (write_behind)
        self.groups: list[int] = []
        self._digest = 0
        self._txn: lmdb.Transaction | None = None
        self._pending = 0

    def add(self, kg: int, flat: list[bytes]) -> int:
        """Append key group ``kg`` (``[key, value, ...]``, keys without the prefix; after every key group added
        before it); returns the bytes of its keys and values."""
        prefix = KG_PREFIXES[kg]
        keys, values = flat[0::2], flat[1::2]
        self._digest += key_group_digest(prefix, keys, values)
        if self._txn is None:
            self._txn = self.env.begin(write=True)
        self._txn.cursor().putmulti(zip(map(prefix.__add__, keys), values, strict=True), append=True)
        size = sum(map(len, flat))
        self._pending += size
        if self._pending >= COMMIT_BYTES:
            self._txn.commit()
            self._txn, self._pending = None, 0
            start_write_back(self._fd)
        self.groups.append(kg)
        return size

    def _close(self) -> None:
        self.env.close()
        os.close(self._fd)

    @property
    def digest(self) -> int:
        return self._digest & MASK64

    def finish(self, metadata: dict[bytes, bytes]) -> None:
        """Add the table ``metadata`` (full keys, which sort after every key group) and the digest, and commit.
        The file is then whole for every process (as a checkpoint file written unbuffered is); the OS writes it
        back to disk as it grew, so no checkpoint's ``fsync`` later waits behind gigabytes of it."""
        metadata = {**metadata, DIGEST_KEY: str(self.digest).encode()}
        txn = self._txn if self._txn is not None else self.env.begin(write=True)
        self._txn = None
        txn.cursor().putmulti(sorted(metadata.items()), append=True)
        txn.commit()
        start_write_back(self._fd)
        self._close()

    def abort(self) -> None:
        """Drop what was built (the file deleted)."""
        if self._txn is not None:
            self._txn.abort()
            self._txn = None
        self._close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


def write_native_file(path: str, built: tuple[tuple[int, ...], int], scope: SnapshotScope,
                      out: SegmentWriter) -> NativeSnapshotHandle | None:
    """The native snapshot file at ``path`` (``built``: the key groups it holds and its digest, from
    :class:`NativeFileBuilder`) as one logical file of ``out``, with its CRC-32 (None: no key group of ``scope``
    holds data): linked into place where ``out`` can (the file is then written to disk once), else copied."""
    groups, digest = built
    if not groups:
        return None
    crc = 0

    def parts() -> Iterator[bytes]:
        nonlocal crc
        with open(path, "rb", buffering=0) as f:
            while data := f.read(CHUNK_BYTES):
                crc = crc32(data, crc)
                yield data

    ref = out.link_in(path)  # a local root on the same disk: the file itself, written once
    if ref is None:
        ref = out.write_parts(parts())
    else:
        try:
            collections.deque(parts(), maxlen=0)
        except BaseException:
            out.discard(ref)
            raise
    kgs = scope.key_groups
    return NativeSnapshotHandle(ref.path, kgs.start, kgs.stop - 1, kgs.start, kgs.stop - 1, groups, ref.length,
                                crc, digest, tuple(m.to_dict() for m in scope.metas), ref.offset)


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
        with open(dest, "xb", buffering=0) as f:
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
