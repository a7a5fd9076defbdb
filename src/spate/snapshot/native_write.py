"""Writing native snapshots (:mod:`spate.snapshot.native`): an lmdb table's key groups put, in key order, into an
lmdb file of their own in the table's directory (:class:`NativeFileBuilder`), which is then placed in checkpoint
storage with its CRC-32 (:func:`write_native_file`: hard-linked where the root is a local directory on the same file
system, so that it is written to disk once, else copied).

Two producers: a materialization's reader process (:mod:`spate.changelog.materializer_process`), and a full
snapshot of a large lmdb table, built in the subtask's thread as frames would be (:func:`write_native_snapshot`).
Neither takes TTL'd state: a snapshot in frames leaves expired entries out and purges them from the table; a
native file could not.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass

import lmdb

from spate.crc import crc32, crc32_combine
from spate.errors import CheckpointError
from spate.heap import bulk_phase
from spate.layout import random_name
from spate.pacing import Pace
from spate.page_cache import drop_cached
from spate.segments import SegmentWriter
from spate.snapshot.handles import NativeSnapshotHandle
from spate.snapshot.keyed import SnapshotScope
from spate.snapshot.native import CHUNK_BYTES
from spate.state.keyed import KeyedStateBackend
from spate.state.layout import META_PREFIX
from spate.state.lmdb_digest import DIGEST_KEY, MASK64, key_group_digest
from spate.state.lmdb_scan import KG_PREFIXES
from spate.state.lmdb_table import LmdbTable
from spate.state.overlay import OverlayTable
from spate.state.table import unwrapped
from spate.write_behind import start_write_back, wait_written_back

COMMIT_BYTES = 64 << 20  # a native snapshot being built is committed every this many bytes of entries
MIN_MAP_BYTES = 1 << 30
STATES_KEY = META_PREFIX + b"states"  # the table's state registry (spate.state.keyed)
BUILD_PREFIX = "native-"  # a native snapshot being built, in the table's directory
OLD_BUILD_PREFIXES = (BUILD_PREFIX, "materialization-")  # and its name before 2026-11-28
LOCK_SUFFIX = "-lock"  # lmdb's lock file beside a file opened with subdir=False


def build_path(table_dir: str) -> str:
    """Where a native snapshot of the lmdb table in ``table_dir`` is built: a new file in the table's directory (one
    snapshot of a table is built at a time; a file a process left that died is removed here, and with the
    directory)."""
    for name in os.listdir(table_dir):
        if name.startswith(OLD_BUILD_PREFIXES):
            _remove(os.path.join(table_dir, name))
    return os.path.join(table_dir, f"{BUILD_PREFIX}{random_name()[:12]}.mdb")


def part_path(path: str, index: int) -> str:
    """Where part ``index`` of a native snapshot built in parts at ``path`` (:func:`build_path`) is built: the first
    at ``path``, the others beside it (removed with it by :func:`build_path`)."""
    return path if index == 0 else f"{path.removesuffix('.mdb')}-{index}.mdb"


def table_bytes(table_dir: str) -> int:
    """The bytes of the lmdb table in ``table_dir`` with its overlay's read-only bases (``base-*.mdb``)."""
    names = [n for n in os.listdir(table_dir) if n == "data.mdb" or n.startswith("base-") and n.endswith(".mdb")]
    return sum(os.path.getsize(os.path.join(table_dir, n)) for n in names)


def map_bytes(table_dir: str) -> int:
    """The lmdb map a native snapshot of the table in ``table_dir`` is built in: room for the table and its
    overlay's bases, whose entries it holds too."""
    return max(4 * table_bytes(table_dir), MIN_MAP_BYTES)


class NativeFileBuilder:
    """A native snapshot's lmdb data file at ``path``, built from the table's key groups read in order (by a
    materialization's reader process): each key group put in lmdb's append mode (pages filled, no search per
    entry), committed every :data:`COMMIT_BYTES`, each commit's write-back started and what the commits before it
    wrote let go from the page cache; the table digest summed key group by key group, and the file's CRC-32 commit
    by commit. ``pace`` keeps the entries put to its rate (None: as fast as the disk goes). A ``background`` build
    (a materialization's, beside the batches) waits for each commit's write-back a commit later: it goes no faster
    than the disk takes its file, so it never floods the page cache with gigabytes the batches' writes would then
    queue behind, and what it lets go of is clean (a build in the batch's own thread waits for nothing).

    Why not lmdb's own copy of the table: a consistent copy holds one read transaction for as long as it runs, and
    lmdb reuses no page the batches free meanwhile; at 10 GB the live file grew to 3.3x the state. Built from the
    key groups the materialization reads anyway, from a view moved forward at every boundary, the file pins no
    more than the frames it replaces, and compacts as it goes."""

    def __init__(self, path: str, map_size: int, pace: Pace | None = None, *, background: bool = False) -> None:
        self.path = path
        self._pace = pace
        self._background = background
        # locked, so that the snapshot held below is seen: lmdb then reuses no page the commits free
        self.env = lmdb.open(path, subdir=False, lock=True, map_size=map_size, sync=False, metasync=False,
                             readahead=False, max_dbs=0, max_readers=1)
        self._fd = -1
        self._held: lmdb.Transaction | None = None
        self._txn: lmdb.Transaction | None = None
        try:
            self._fd = os.open(path, os.O_RDONLY)  # to start each commit's write-back (write_behind)
            self._held = self.env.begin()  # each commit then only adds pages past the file's end (and a meta page)
            self._meta_bytes = 2 * self.env.stat()["psize"]
        except BaseException:
            self.abort()  # a builder that could not start leaves nothing either
            raise
        self._checksum = _Checksum(self._fd, self._meta_bytes)
        self.groups: list[int] = []
        self.bytes = 0  # of the entries added
        self._digest = 0
        self._pending = 0
        self._started_up_to = 0  # the file's size when its write-back was last started
        self.crc: int | None = None  # the file's CRC-32, once finished

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
        self.bytes += size
        self._pending += size
        if self._pending >= COMMIT_BYTES:
            self._txn.commit()
            self._txn, self._pending = None, 0
            self._write_back()
        self.groups.append(kg)
        if self._pace is not None:
            self._pace.moved(size)
        return size

    def _write_back(self) -> None:
        """Start the write-back of what was committed, and let go from the page cache what was written back a
        commit earlier (clean by now, mostly; in the background, waited for): a file of the state's size would
        otherwise push the table's own pages out while it is built. lmdb's own pages it still maps (the tree's
        right edge) stay cached. What the commit added is checksummed first, read from the page cache."""
        self._checksum.to_end()
        start_write_back(self._fd)
        if self._background:
            wait_written_back(self._fd, self._started_up_to)
        drop_cached(self._fd, 0, self._started_up_to)
        self._started_up_to = os.fstat(self._fd).st_size

    def _close(self) -> None:
        if self._held is not None:
            self._held.abort()
        self.env.close()
        if self._fd >= 0:
            os.close(self._fd)
        _remove(self.path + LOCK_SUFFIX)

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
        self._checksum.to_end()
        start_write_back(self._fd)
        self.crc = crc32_combine(crc32(os.pread(self._fd, self._meta_bytes, 0)), self._checksum.crc,
                                 self._checksum.at - self._meta_bytes)
        self._close()

    def built(self) -> NativeBuild:
        """What :meth:`finish` made."""
        assert self.crc is not None, "finished"
        return NativeBuild(tuple(self.groups), self.digest, self.crc)

    def abort(self) -> None:
        """Drop what was built (the file deleted)."""
        if self._txn is not None:
            self._txn.abort()
            self._txn = None
        self._close()
        _remove(self.path)


@dataclass(frozen=True)
class NativeBuild:
    """A native snapshot file built (:class:`NativeFileBuilder`): the key groups that hold data, the table digest it
    records, and the file's CRC-32."""

    groups: tuple[int, ...]
    digest: int
    crc: int


class _Checksum:
    """The CRC-32 of a growing file from ``start`` (past its meta pages) up to where it was last read (``at``), read
    in chunks of :data:`CHUNK_BYTES`."""

    def __init__(self, fd: int, start: int) -> None:
        self._fd = fd
        self.at = start
        self.crc = 0

    def to_end(self) -> None:
        size = os.fstat(self._fd).st_size
        while self.at < size:
            data = os.pread(self._fd, min(CHUNK_BYTES, size - self.at), self.at)
            if not data:
                break
            self.crc = crc32(data, self.crc)
            self.at += len(data)


def write_native_file(path: str, built: NativeBuild, scope: SnapshotScope, out: SegmentWriter,
                      pace: Pace | None = None) -> NativeSnapshotHandle | None:
    """The native snapshot file at ``path`` (``built`` by :class:`NativeFileBuilder`) as one logical file of
    ``out`` (None: no key group of ``scope`` holds data): linked into place where ``out`` can (the file is then
    written to disk once, and not read again), else copied, read at ``pace`` (None: as fast as the disk goes) and
    checked against the CRC-32 it was built with.

    Raises:
        CheckpointError: the copy's bytes are not those the file was built with (nothing is kept).
    """
    if not built.groups:
        return None
    ref = out.link_in(path)  # a local root on the same disk: the file itself, written once
    if ref is None:
        copied = _CopiedFile(path, pace)
        ref = out.write_parts(copied.parts())
        if copied.crc != built.crc:
            out.discard(ref)
            raise CheckpointError(f"the native snapshot {path} changed while it was copied to checkpoint storage "
                                  f"(CRC-32 {copied.crc:#010x}, built as {built.crc:#010x}): nothing was kept, the "
                                  "next materialization writes it again")
    kgs = scope.key_groups
    return NativeSnapshotHandle(ref.path, kgs.start, kgs.stop - 1, kgs.start, kgs.stop - 1, built.groups,
                                ref.length, built.crc, built.digest, tuple(m.to_dict() for m in scope.metas),
                                ref.offset)


class _CopiedFile:
    """A file read in chunks for a copy, at a pace, its CRC-32 summed as it goes, and let go from the page cache
    behind (a checkpoint's file now: read again only by a restore)."""

    def __init__(self, path: str, pace: Pace | None) -> None:
        self._path, self._pace = path, pace
        self.crc = 0

    def parts(self) -> Iterator[bytes]:
        with open(self._path, "rb", buffering=0) as f:
            at = 0
            while data := f.read(CHUNK_BYTES):
                self.crc = crc32(data, self.crc)
                yield data
                drop_cached(f.fileno(), at, len(data))
                at += len(data)
                if self._pace is not None:
                    self._pace.moved(len(data))


def native_table(backend: KeyedStateBackend, from_bytes: int | None) -> LmdbTable | OverlayTable | None:
    """The lmdb table of ``backend`` if its full snapshots are native: at least ``from_bytes`` in use (None: never),
    no TTL'd state."""
    table = backend.table
    inner = unwrapped(table)  # under the changelog's wrapper, and the profiler's (``profile=True``)
    if from_bytes is None or not isinstance(inner, (LmdbTable, OverlayTable)):
        return None
    if any(backend.expiry_filter(m.sid) for m in backend.state_metas) or inner.approx_bytes() < from_bytes:
        return None
    return inner


def write_native_snapshot(backend: KeyedStateBackend, table: LmdbTable | OverlayTable,
                          out: SegmentWriter) -> NativeSnapshotHandle | None:
    """A full snapshot of ``backend`` (whose table is ``table``, see :func:`native_table`) as a native snapshot,
    built here and placed with ``out``; None if no key group holds data."""
    backend.table.commit()
    scope = SnapshotScope.of(backend)
    path = build_path(table.path)
    builder = NativeFileBuilder(path, map_bytes(table.path))
    try:
        try:
            with bulk_phase(), backend.table.consistent_view() as view:
                for kg in scope.key_groups:
                    if flat := view.key_group_flat(kg):
                        builder.add(kg, flat)
                states = table.get_meta("states")
            builder.finish({STATES_KEY: states} if states is not None else {})
        except BaseException:
            builder.abort()
            raise
        return write_native_file(path, builder.built(), scope, out)
    finally:
        remove_build(path)


def remove_build(path: str) -> None:
    """Remove the native snapshot being built at ``path`` (:func:`build_path`), with its lock file."""
    _remove(path + LOCK_SUFFIX)
    _remove(path)


def remove_parts(path: str) -> None:
    """Remove every part of the native snapshot built in parts at ``path`` (:func:`part_path`), with their lock
    files."""
    directory, first = os.path.split(path)
    stem = first.removesuffix(".mdb") + "-"
    for name in os.listdir(directory):
        if name.startswith(stem):
            _remove(os.path.join(directory, name))
    remove_build(path)


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
