"""The write side of an lmdb table: its environment on local disk, opened under the directory lock, and the one
long write transaction every write goes into.

The transaction is committed at checkpoints (and every ``commit_every`` writes); if the memory map fills, the
transaction is replayed into a map twice the size instead of failing. Each commit also stores the table's
digest (:mod:`spate.state.lmdb_digest`), kept up to date write by write, so state reused from local disk can be
checked with :meth:`LmdbWriter.verify` before it is trusted. Read views (:meth:`LmdbWriter.consistent_view`) are
O(1) MVCC snapshots.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import threading
from collections.abc import Iterator

import lmdb

from spate.crc import crc32
from spate.errors import SpateError
from spate.page_cache import reading_ahead
from spate.state.layout import META_PREFIX
from spate.state.lmdb_digest import DIGEST_KEY, MASK64, digest_problem, parse_digest, table_digest
from spate.state.lmdb_dir import LOCK_FILE, hold_directory, try_flock, wait_for_lock
from spate.state.lmdb_readonly import ReadView

MAX_LMDB_KEY = 511
MIN_MAP_SIZE = 64 << 20


class LmdbWriter:
    """An LMDB environment in ``path`` held and locked by this process, written through one transaction."""

    def __init__(self, path: str, map_size: int = MIN_MAP_SIZE, commit_every: int = 50_000) -> None:
        self.path = path
        self._hold_fd = hold_directory(path)
        self._lock_fd = os.open(os.path.join(path, LOCK_FILE), os.O_CREAT | os.O_RDWR, 0o644)
        self.locked = self._try_lock()
        if not self.locked:
            os.close(self._lock_fd)
            os.close(self._hold_fd)
            raise SpateError(f"lmdb state directory {path} is in use by another process; each subtask's "
                             "local state may be open in one process at a time")
        data_file = os.path.join(path, "data.mdb")
        existing = os.path.getsize(data_file) if os.path.exists(data_file) else 0
        try:
            self.env = lmdb.open(path, map_size=max(map_size, existing * 2, MIN_MAP_SIZE), subdir=True,
                                 sync=False, metasync=False, readahead=False, max_dbs=0, lock=True)
        except BaseException:
            os.close(self._lock_fd)  # lets the lock go
            os.close(self._hold_fd)
            raise
        self._commit_every = commit_every
        self._txn: lmdb.Transaction | None = None
        self._open_views = 0  # read views in use (possibly by another thread)
        self._views_closed = threading.Condition()
        self._ops: list[tuple[bytes, bytes | None]] = []  # writes of the open transaction, for replay
        with self.env.begin() as txn:
            empty = self.env.stat()["entries"] == 0  # a new table: its digest is known (0), not to be computed
            self._committed_digest = 0 if empty else parse_digest(txn.get(DIGEST_KEY))
        self._digest = self._committed_digest  # of the open transaction; None = unknown (recomputed at commit)

    # -- transaction handling -------------------------------------------------------------------------
    def _begin(self) -> lmdb.Transaction:
        if self._txn is None:
            self._txn = self._env_begin(write=True)
        return self._txn

    def _env_begin(self, write: bool = False) -> lmdb.Transaction:
        """A transaction; if another process grew the map meanwhile (local state handed between Spark's Python
        workers), adopt the new size first."""
        try:
            return self.env.begin(write=write)
        except lmdb.MapResizedError:
            self._resize(0)
            return self.env.begin(write=write)

    # -- the lock: one process writes a subtask's local state at a time ------------------------------------
    def _try_lock(self) -> bool:
        if not try_flock(self._lock_fd):
            return False
        os.utime(self._lock_fd)  # the time of this use, for :func:`last_used`
        return True

    def unlock(self) -> None:
        """Let another process open and write this state (between two batches); :meth:`lock` before the next
        write. Everything is committed first."""
        self.commit()
        if self.locked:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            self.locked = False

    def lock(self, timeout_s: float = 60.0) -> None:
        """Take the lock back, waiting up to ``timeout_s`` for another process to release it."""
        if not self.locked:
            wait_for_lock(self._lock_fd, self.path, timeout_s,
                           "; is a second attempt of the same subtask still running?")
            os.utime(self._lock_fd)  # the time of this use, for :func:`last_used`
            self.locked = True

    # -- the one writer: every write goes through the open transaction -------------------------------------------
    def _w(self) -> lmdb.Transaction:
        return self._txn or self._begin()

    def _apply(self, txn: lmdb.Transaction, key: bytes, value: bytes | None) -> bool:
        """Put (or, for None, delete) one entry in ``txn`` and keep the table digest; True if it existed."""
        old = txn.pop(key) if value is None else txn.replace(key, value)
        digest = self._digest
        if digest is not None and key[:2] != META_PREFIX:
            key_crc = crc32(key)  # as in entry_hash, shared by the old and the new entry
            if value is not None:
                digest += crc32(value, key_crc) + 1
            if old is not None:
                digest -= crc32(old, key_crc) + 1
            self._digest = digest & MASK64
        return old is not None

    def _put(self, key: bytes, value: bytes) -> bool:
        """The one writer: put in the open transaction, remember it for a replay after map growth; True if
        the entry existed."""
        txn = self._txn or self._begin()
        try:
            existed = self._apply(txn, key, value)
        except (lmdb.MapFullError, lmdb.BadValsizeError) as e:
            return self._recover(e, key, value)
        ops = self._ops
        ops.append((key, value))
        if len(ops) >= self._commit_every:
            self.commit()
        return existed

    def _delete(self, key: bytes) -> bool:
        try:
            deleted = self._apply(self._txn or self._begin(), key, None)
        except lmdb.MapFullError:  # copy-on-write pages can fill the map even on delete
            self._grow_and_replay()
            return self._delete(key)
        if deleted:
            self._ops.append((key, None))
        return deleted

    def _recover(self, error: Exception, key: bytes, value: bytes) -> bool:
        if isinstance(error, lmdb.BadValsizeError):
            raise SpateError(f"state key of {len(key)} bytes is too large for the lmdb table (limit "
                             f"{MAX_LMDB_KEY} bytes incl. key group, state id and namespace); use shorter keys "
                             "or the heap table") from error
        self._grow_and_replay()
        return self._put(key, value)

    def _grow_and_replay(self) -> None:
        assert self._txn is not None
        self._txn.abort()
        self._txn = None
        self._digest = self._committed_digest
        self._resize(self.env.info()["map_size"] * 2)
        txn = self._begin()
        for key, value in self._ops:
            try:
                self._apply(txn, key, value)
            except lmdb.MapFullError:
                self._grow_and_replay()
                return

    def commit(self) -> None:
        """Commit the open transaction, with the digest of the entries it leaves (see :meth:`verify`)."""
        if self._txn is not None:
            try:
                self._store_digest(self._txn)
                self._txn.commit()
            except lmdb.MapFullError:
                self._grow_and_replay()
                self.commit()
                return
            self._txn = None
            self._ops.clear()
            self._committed_digest = self._digest

    # -- integrity: a digest of every entry, kept up to date on each write and stored at each commit --------
    def _store_digest(self, txn: lmdb.Transaction) -> None:
        if self._digest is None:  # unknown after a bulk restore or in a table written before digests
            self._digest = table_digest(txn)
        if self._digest != self._committed_digest or txn.get(DIGEST_KEY) is None:
            txn.put(DIGEST_KEY, str(self._digest).encode())

    def verify(self) -> str | None:
        """Re-read every committed entry and compare with the digest stored with them: None if they agree,
        else what is wrong. Catches any changed, lost or added key or value (a 64-bit sum of per-entry
        CRC32s); costs one read of the table on local disk (read in order ahead of the scan), no download."""
        try:
            with reading_ahead(os.path.join(self.path, "data.mdb")), self._env_begin() as txn:
                return digest_problem(txn)
        except lmdb.Error as e:
            return f"lmdb cannot read it ({e})"

    # -- map growth and read views -------------------------------------------------------------------------------
    def _resize(self, map_size: int) -> None:
        """Grow the map. Resizing invalidates every open transaction, so wait until no view is in use."""
        with self._views_closed:
            while self._open_views:
                self._views_closed.wait()
            self.env.set_mapsize(map_size)

    def used_bytes(self) -> int:
        """The bytes of the data file in use (up to its last page)."""
        return int((self.env.info()["last_pgno"] + 1) * self.env.stat()["psize"])

    @contextlib.contextmanager
    def consistent_view(self) -> Iterator[ReadView]:
        """An lmdb read transaction: an O(1) MVCC snapshot that later writes do not change. While it is open
        the map cannot grow, so it is given room first (writes that still fill it wait for the view)."""
        self.commit()
        used, map_size = self.used_bytes(), self.env.info()["map_size"]
        if used * 2 > map_size:
            self._resize(max(map_size * 2, used * 4))
        with self._views_closed:  # no resize can start between the begin and the count
            txn = self._env_begin()
            self._open_views += 1
        try:
            with txn:
                yield ReadView(txn)
        finally:
            with self._views_closed:
                self._open_views -= 1
                self._views_closed.notify_all()

    # -- lifetime ------------------------------------------------------------------------------------------------
    def linked_elsewhere(self) -> bool:
        """Whether another directory holds a hard link to this table's data file (a rescaled subtask reads it
        as a base): then it must never be written again."""
        try:
            return os.stat(os.path.join(self.path, "data.mdb")).st_nlink > 1
        except FileNotFoundError:
            return False

    def close(self) -> None:
        if self.env is None:
            return
        self.commit()
        self.env.close()
        self.env = None  # type: ignore[assignment]
        os.close(self._lock_fd)
        os.close(self._hold_fd)

    def destroy(self) -> None:
        if self._txn is not None:
            self._txn.abort()
            self._txn = None
            self._ops.clear()
        self.close()
        shutil.rmtree(self.path, ignore_errors=True)


