"""``lmdb`` table: key-group-prefixed keys in an LMDB environment on local disk.

Larger than memory, shared safely across processes (an exclusive file lock guards the directory while a
process writes it; another process may take it over afterwards; a shared hold, kept while a process has it
open, keeps :func:`remove_if_unused` away), and every read transaction is an O(1) consistent snapshot. Writes
go into one long write transaction that is committed at checkpoints (and every ``commit_every`` writes); if
the memory map fills, the transaction is replayed into a map twice the size instead of failing. Each commit
also stores a digest of every entry (kept up to date write by write), so state reused from local disk can be
checked with :meth:`LmdbTable.verify` before it is trusted.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import threading
import time
import zlib
from collections.abc import Iterator, Sequence

import lmdb

from spate.errors import SpateError
from spate.state.layout import META_PREFIX, U16, primary_length
from spate.state.table import StateTable

MAX_LMDB_KEY = 511
_MIN_MAP_SIZE = 64 << 20
_DIGEST_KEY = META_PREFIX + b"digest"
_MASK64 = (1 << 64) - 1
_KG = tuple(U16.pack(kg) for kg in range(1 << 15))  # key-group prefixes, precomputed
_LOCK_FILE = "spate.lock"  # exclusive while a process writes; its mtime is when a process last took it
_HOLD_FILE = "spate.open"  # shared while a process has the table open


class LmdbTable(StateTable):
    """State table backed by an LMDB environment in ``path``."""

    kind = "lmdb"

    def __init__(self, path: str, map_size: int = _MIN_MAP_SIZE, commit_every: int = 50_000) -> None:
        self.path = path
        self._hold_fd = _hold(path)
        self._lock_fd = os.open(os.path.join(path, _LOCK_FILE), os.O_CREAT | os.O_RDWR, 0o644)
        self.locked = self._try_lock()
        if not self.locked:
            os.close(self._lock_fd)
            os.close(self._hold_fd)
            raise SpateError(f"lmdb state directory {path} is in use by another process; each subtask's "
                             "local state may be open in one process at a time")
        data_file = os.path.join(path, "data.mdb")
        existing = os.path.getsize(data_file) if os.path.exists(data_file) else 0
        try:
            self.env = lmdb.open(path, map_size=max(map_size, existing * 2, _MIN_MAP_SIZE), subdir=True,
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
            self._committed_digest = _parse_digest(txn.get(_DIGEST_KEY))
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
        if not _try_flock(self._lock_fd):
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
            _wait_for_lock(self._lock_fd, self.path, timeout_s,
                           "; is a second attempt of the same subtask still running?")
            os.utime(self._lock_fd)  # the time of this use, for :func:`last_used`
            self.locked = True

    def _w(self) -> lmdb.Transaction:
        return self._txn or self._begin()

    def _apply(self, txn: lmdb.Transaction, key: bytes, value: bytes | None) -> bool:
        """Put (or, for None, delete) one entry in ``txn`` and keep the table digest; True if it existed."""
        old = txn.pop(key) if value is None else txn.replace(key, value)
        digest = self._digest
        if digest is not None and key[:2] != META_PREFIX:
            key_crc = zlib.crc32(key)  # as in _entry_hash, shared by the old and the new entry
            if value is not None:
                digest += zlib.crc32(value, key_crc) + 1
            if old is not None:
                digest -= zlib.crc32(old, key_crc) + 1
            self._digest = digest & _MASK64
        return old is not None

    def _put(self, key: bytes, value: bytes) -> None:
        """The one writer: put in the open transaction, remember it for a replay after map growth."""
        txn = self._txn or self._begin()
        try:
            self._apply(txn, key, value)
        except (lmdb.MapFullError, lmdb.BadValsizeError) as e:
            self._recover(e, key, value)
            return
        ops = self._ops
        ops.append((key, value))
        if len(ops) >= self._commit_every:
            self.commit()

    def _delete(self, key: bytes) -> bool:
        try:
            deleted = self._apply(self._txn or self._begin(), key, None)
        except lmdb.MapFullError:  # copy-on-write pages can fill the map even on delete
            self._grow_and_replay()
            return self._delete(key)
        if deleted:
            self._ops.append((key, None))
        return deleted

    def _recover(self, error: Exception, key: bytes, value: bytes) -> None:
        if isinstance(error, lmdb.BadValsizeError):
            raise SpateError(f"state key of {len(key)} bytes is too large for the lmdb table (limit "
                             f"{MAX_LMDB_KEY} bytes incl. key group, state id and namespace); use shorter keys "
                             "or the heap table") from error
        self._grow_and_replay()
        self._put(key, value)

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
            self._digest = _table_digest(txn)
        if self._digest != self._committed_digest or txn.get(_DIGEST_KEY) is None:
            txn.put(_DIGEST_KEY, str(self._digest).encode())

    def verify(self) -> str | None:
        """Re-read every committed entry and compare with the digest stored with them: None if they agree,
        else what is wrong. Catches any changed, lost or added key or value (a 64-bit sum of per-entry
        CRC32s); costs one sequential read of the table on local disk, no download."""
        try:
            with self._env_begin() as txn:
                return _digest_problem(txn)
        except lmdb.Error as e:
            return f"lmdb cannot read it ({e})"

    # -- value entries --------------------------------------------------------------------------------
    def get(self, kg: int, primary: bytes) -> bytes | None:
        return (self._txn or self._begin()).get(_KG[kg] + primary)  # type: ignore[return-value]

    def put(self, kg: int, primary: bytes, value: bytes) -> None:
        self._put(_KG[kg] + primary, value)

    def get_many(self, kgs: Sequence[int], primaries: Sequence[bytes]) -> list[bytes | None]:
        get = (self._txn or self._begin()).get
        return [get(_KG[kg] + p) for kg, p in zip(kgs, primaries, strict=True)]

    def put_many(self, entries: Sequence[tuple[int, bytes, bytes]]) -> None:
        """``put`` of each entry, with the digest kept in one pass (map growth and large batches go through
        :meth:`_put`, entry by entry)."""
        if len(self._ops) + len(entries) >= self._commit_every or self._digest is None:
            for kg, primary, value in entries:
                self._put(_KG[kg] + primary, value)
            return
        txn, crc, digest = self._txn or self._begin(), zlib.crc32, self._digest
        done: list[tuple[bytes, bytes | None]] = []
        try:
            for kg, primary, value in entries:
                key = _KG[kg] + primary
                old = txn.replace(key, value)
                key_crc = crc(key)
                digest += crc(value, key_crc) + 1
                if old is not None:
                    digest -= crc(old, key_crc) + 1
                done.append((key, value))
        except (lmdb.MapFullError, lmdb.BadValsizeError) as e:
            self._digest = digest & _MASK64
            self._ops.extend(done)
            if isinstance(e, lmdb.MapFullError):  # the transaction is dead: grow the map and replay it first
                self._grow_and_replay()
            for kg, primary, value in entries[len(done):]:
                self._put(_KG[kg] + primary, value)  # explains a bad value
            return
        self._digest = digest & _MASK64
        self._ops.extend(done)

    def delete(self, kg: int, primary: bytes) -> None:
        prefix = _KG[kg] + primary
        if not self._delete(prefix):  # not a value entry: delete the map entries under the primary
            for key in self._keys_with_prefix(self._w(), prefix):
                self._delete(key)

    # -- map entries ----------------------------------------------------------------------------------
    def map_get(self, kg: int, primary: bytes, user_key: bytes) -> bytes | None:
        return self._w().get(_KG[kg] + primary + user_key)  # type: ignore[return-value]

    def map_put(self, kg: int, primary: bytes, user_key: bytes, value: bytes) -> None:
        self._put(_KG[kg] + primary + user_key, value)

    def map_delete(self, kg: int, primary: bytes, user_key: bytes) -> None:
        self._delete(_KG[kg] + primary + user_key)

    def map_items(self, kg: int, primary: bytes) -> list[tuple[bytes, bytes]]:
        prefix = _KG[kg] + primary
        n = len(prefix)
        return [(k[n:], v) for k, v in _scan(self._w(), prefix)]

    @staticmethod
    def _keys_with_prefix(txn: lmdb.Transaction, prefix: bytes) -> list[bytes]:
        return [k for k, _ in _scan(txn, prefix)]

    # -- scans ----------------------------------------------------------------------------------------
    def state_entries(self, kg: int, sid_prefix: bytes) -> Iterator[tuple[bytes, bytes, bytes]]:
        for k, v in list(_scan(self._w(), _KG[kg] + sid_prefix)):
            flat = k[2:]
            plen = primary_length(flat)
            yield flat[:plen], flat[plen:], v

    def key_group_flat(self, kg: int) -> list[bytes]:
        self.commit()
        with self._env_begin() as txn:
            return _flat(txn, kg)

    def _resize(self, map_size: int) -> None:
        """Grow the map. Resizing invalidates every open transaction, so wait until no view is in use."""
        with self._views_closed:
            while self._open_views:
                self._views_closed.wait()
            self.env.set_mapsize(map_size)

    @contextlib.contextmanager
    def consistent_view(self) -> Iterator[_ReadView]:
        """An lmdb read transaction: an O(1) MVCC snapshot that later writes do not change. While it is open
        the map cannot grow, so it is given room first (writes that still fill it wait for the view)."""
        self.commit()
        info = self.env.info()
        used = (info["last_pgno"] + 1) * self.env.stat()["psize"]
        if used * 2 > info["map_size"]:
            self._resize(max(info["map_size"] * 2, used * 4))
        with self._views_closed:  # no resize can start between the begin and the count
            txn = self._env_begin()
            self._open_views += 1
        try:
            with txn:
                yield _ReadView(txn)
        finally:
            with self._views_closed:
                self._open_views -= 1
                self._views_closed.notify_all()

    def restore_key_group(self, kg: int, flat: list[bytes], map_sids: frozenset[bytes]) -> None:
        prefix = _KG[kg]
        items = [(prefix + k, v) for k, v in zip(flat[0::2], flat[1::2], strict=True)]
        self.commit()
        while True:
            try:
                with self._env_begin(write=True) as txn:
                    digest = _updated_digest(txn, self._digest, items)
                    txn.cursor().putmulti(items)
                    if digest is None:
                        txn.delete(_DIGEST_KEY)  # recomputed at the next commit
                    else:
                        txn.put(_DIGEST_KEY, str(digest).encode())
                self._digest = self._committed_digest = digest
                return
            except lmdb.MapFullError:
                self._resize(self.env.info()["map_size"] * 2)
            except lmdb.BadValsizeError as e:
                raise SpateError(f"a restored state key is too large for the lmdb table (limit {MAX_LMDB_KEY} "
                                 "bytes); restore into the heap table") from e

    def linked_elsewhere(self) -> bool:
        """Whether another directory holds a hard link to this table's data file (a rescaled subtask reads it
        as a base): then it must never be written again."""
        try:
            return os.stat(os.path.join(self.path, "data.mdb")).st_nlink > 1
        except FileNotFoundError:
            return False

    def has_prefix(self, prefix: bytes) -> bool:
        """Whether some entry's key starts with ``prefix``."""
        cur = (self._txn or self._begin()).cursor()
        return bool(cur.set_range(prefix)) and bytes(cur.key()).startswith(prefix)

    def drop_prefix(self, prefix: bytes) -> int:
        """Delete every entry whose key starts with ``prefix`` (lmdb has no range delete: one cursor walks the
        range, no lookup per key); returns how many."""
        end = (int.from_bytes(prefix, "big") + 1).to_bytes(len(prefix), "big")
        try:
            return self._drop_range(prefix, end, None)
        except lmdb.MapFullError:  # copy-on-write pages can fill the map even on delete
            self._grow_and_replay()
            return self._drop_range(prefix, end, None)

    def _drop_range(self, start: bytes, end: bytes, limit: int | None) -> int:
        """Delete entries with keys in ``[start, end)`` through one cursor."""
        cur = (self._txn or self._begin()).cursor()
        digest, crc, ops, n = self._digest, zlib.crc32, self._ops, 0
        found = cur.set_range(start)
        while found and (limit is None or n < limit):
            key: bytes = cur.key()  # type: ignore[assignment]
            if not key or key >= end:  # past the end, or the cursor ran off the last entry
                break
            if digest is not None:
                digest -= crc(cur.value(), crc(key)) + 1  # type: ignore[arg-type]
            ops.append((key, None))
            found = cur.delete()
            n += 1
        self._digest = digest & _MASK64 if digest is not None else None
        return n

    # -- whole table keys (an overlay over read-only bases works with them) ---------------------------------
    def get_key(self, key: bytes) -> bytes | None:
        return (self._txn or self._begin()).get(key)  # type: ignore[no-any-return]

    def put_key(self, key: bytes, value: bytes) -> None:
        self._put(key, value)

    def add_new(self, items: list[tuple[bytes, bytes]]) -> None:
        """Put entries whose keys the table does not hold, in the open transaction, in one bulk write (the
        digest gains each entry; no lookup of a value replaced)."""
        txn = self._txn or self._begin()
        digest = self._digest
        if digest is not None:
            crc = zlib.crc32
            digest += sum(crc(v, crc(k)) + 1 for k, v in items)
        try:
            txn.cursor().putmulti(items)
        except lmdb.MapFullError:
            self._grow_and_replay()
            self.add_new(items)
            return
        self._digest = digest & _MASK64 if digest is not None else None
        self._ops.extend(items)

    def delete_key(self, key: bytes) -> bool:
        return self._delete(key)

    def scan(self, prefix: bytes) -> list[tuple[bytes, bytes]]:
        """Every (key, value) whose key starts with ``prefix``, in the open transaction, in key order."""
        return list(_scan(self._w(), prefix))

    # -- metadata -------------------------------------------------------------------------------------
    def get_meta(self, name: str) -> bytes | None:
        return self._w().get(META_PREFIX + name.encode())  # type: ignore[return-value]

    def put_meta(self, name: str, value: bytes) -> None:
        self._put(META_PREFIX + name.encode(), value)

    def committed_meta(self, name: str) -> bytes | None:
        """A metadata entry as last committed (by any process), read without starting a write transaction."""
        with self._env_begin() as txn:
            return txn.get(META_PREFIX + name.encode())  # type: ignore[no-any-return]

    def entry_count(self) -> int:
        """lmdb's own count (open transaction included) less the few entries under ``0xff`` (metadata)."""
        if self._txn is not None:
            return _entries(self._txn, self.env)
        with self._env_begin() as txn:  # no write transaction just to count
            return _entries(txn, self.env)

    def approx_bytes(self) -> int:
        info, stat = self.env.info(), self.env.stat()
        return (info["last_pgno"] + 1) * stat["psize"]

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


def _hold(path: str) -> int:
    """Create the table directory ``path`` if needed and take a shared hold on it; returns the hold's file
    descriptor (closing it lets go). Waits while :func:`remove_if_unused` deletes the directory, then makes it
    anew."""
    hold = os.path.join(path, _HOLD_FILE)
    while True:
        os.makedirs(path, exist_ok=True)
        try:
            fd = os.open(hold, os.O_CREAT | os.O_RDWR, 0o644)
        except FileNotFoundError:  # deleted between the two calls
            continue
        fcntl.flock(fd, fcntl.LOCK_SH)
        if _is_file(fd, hold):
            return fd
        os.close(fd)  # deleted while we waited for the hold


def _is_file(fd: int, path: str) -> bool:
    """Whether ``fd`` is (still) the file at ``path``."""
    try:
        here = os.stat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (mine.st_dev, mine.st_ino) == (here.st_dev, here.st_ino)


def last_used(path: str) -> float:
    """When a process last took the table in ``path`` to write it (seconds since the epoch)."""
    try:
        return os.stat(os.path.join(path, _LOCK_FILE)).st_mtime
    except FileNotFoundError:
        return os.stat(path).st_mtime


def remove_if_unused(path: str, idle_since: float | None = None) -> bool:
    """Delete an lmdb table directory unless a process holds it open or, given ``idle_since``, a process used
    it after that time (:func:`last_used`); True if it is gone."""
    try:
        fd = os.open(os.path.join(path, _HOLD_FILE), os.O_CREAT | os.O_RDWR, 0o644)
    except FileNotFoundError:  # gone already
        return True
    except NotADirectoryError:  # not a table
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if idle_since is not None and last_used(path) > idle_since:
            return False
        shutil.rmtree(path, ignore_errors=True)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


class _ReadView:
    def __init__(self, txn: lmdb.Transaction) -> None:
        self._txn = txn

    def key_group_flat(self, kg: int) -> list[bytes]:
        return _flat(self._txn, kg)

    def get_key(self, key: bytes) -> bytes | None:
        return self._txn.get(key)  # type: ignore[no-any-return]

    def scan(self, prefix: bytes) -> list[tuple[bytes, bytes]]:
        return list(_scan(self._txn, prefix))


@contextlib.contextmanager
def held_for_reading(path: str, timeout_s: float = 60.0) -> Iterator[None]:
    """Keep the table in ``path`` from being written (its lock, waiting up to ``timeout_s``) and removed (a
    shared hold) meanwhile. Raises FileNotFoundError if there is no table, SpateError if it stays locked."""
    if os.path.islink(path) or not os.path.isdir(path):
        raise FileNotFoundError(path)
    hold_fd = os.open(os.path.join(path, _HOLD_FILE), os.O_RDWR)
    try:
        fcntl.flock(hold_fd, fcntl.LOCK_SH)
        if not _is_file(hold_fd, os.path.join(path, _HOLD_FILE)):
            raise FileNotFoundError(path)  # removed while we waited
        lock_fd = os.open(os.path.join(path, _LOCK_FILE), os.O_RDWR)
        try:
            _wait_for_lock(lock_fd, path, timeout_s)
            yield
        finally:
            os.close(lock_fd)
    finally:
        os.close(hold_fd)


def _try_flock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _wait_for_lock(fd: int, path: str, timeout_s: float, hint: str = "") -> None:
    """Take the exclusive lock on ``fd``, waiting up to ``timeout_s`` for another process to release it."""
    deadline = time.monotonic() + timeout_s
    while not _try_flock(fd):
        if time.monotonic() > deadline:
            raise SpateError(f"lmdb state directory {path} stayed locked by another process for {timeout_s} s{hint}")
        time.sleep(0.01)


def move_table(source: str, target: str, timeout_s: float = 60.0) -> int:
    """Move the table in ``source`` to the new table directory ``target`` (a rename on the same file system,
    while no process writes or holds it); returns the bytes of its data file."""
    with held_for_reading(source, timeout_s):
        shutil.rmtree(target, ignore_errors=True)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        os.rename(source, target)
    return os.path.getsize(os.path.join(target, "data.mdb"))


class ReadOnlyTable:
    """The committed state of a table another subtask wrote (a table directory, or with ``file=True`` a data file
    alone), read while nothing writes it: :func:`held_for_reading` keeps writers away, and a base of an overlay
    is never written (so lmdb's own reader lock is not needed). Each thread reads through its own transaction."""

    def __init__(self, path: str, file: bool = False) -> None:
        self.path = path
        if file and not os.path.isfile(path):
            raise FileNotFoundError(path)
        self.env = lmdb.open(path, readonly=True, lock=False, subdir=not file, max_dbs=0, readahead=False)
        self.size = os.path.getsize(path if file else os.path.join(path, "data.mdb"))
        self._local = threading.local()
        self._txns: list[lmdb.Transaction] = []
        self._txns_lock = threading.Lock()

    def _txn(self) -> lmdb.Transaction:
        txn = getattr(self._local, "txn", None)
        if txn is None:
            txn = self._local.txn = self.env.begin()
            with self._txns_lock:
                self._txns.append(txn)
        return txn

    def meta(self, name: str) -> bytes | None:
        return self._txn().get(META_PREFIX + name.encode())  # type: ignore[no-any-return]

    def key_group_flat(self, kg: int) -> list[bytes]:
        return _flat(self._txn(), kg)

    def get_key(self, key: bytes) -> bytes | None:
        return self._txn().get(key)  # type: ignore[no-any-return]

    def scan(self, prefix: bytes) -> list[tuple[bytes, bytes]]:
        return list(_scan(self._txn(), prefix))

    def scan_from(self, start: bytes, prefix: bytes, limit: int) -> list[tuple[bytes, bytes]]:
        """Up to ``limit`` entries with keys from ``start`` on that start with ``prefix``, in key order."""
        out: list[tuple[bytes, bytes]] = []
        cur = self._txn().cursor()
        if cur.set_range(start):
            for k, v in cur:
                if len(out) >= limit or not k.startswith(prefix):
                    break
                out.append((k, v))  # type: ignore[arg-type]
        return out

    def verify(self) -> str | None:
        """As :meth:`LmdbTable.verify`."""
        try:
            return _digest_problem(self._txn())
        except lmdb.Error as e:
            return f"lmdb cannot read it ({e})"

    def data_bytes(self) -> int:
        return self.size

    def close(self) -> None:
        with self._txns_lock:
            for txn in self._txns:
                txn.abort()
            self._txns.clear()
        self.env.close()


def _digest_problem(txn: lmdb.Transaction) -> str | None:
    """None if the committed entries agree with the digest stored with them, else what is wrong."""
    recorded, actual = _parse_digest(txn.get(_DIGEST_KEY)), _table_digest(txn)
    if recorded is None:
        return "it has no valid recorded digest (damaged, or written by an older spate)"
    if recorded != actual:
        return f"its entries do not match the digest recorded at its last commit ({actual} != {recorded})"
    return None


def _entry_hash(key: bytes, value: bytes) -> int:
    return zlib.crc32(value, zlib.crc32(key)) + 1


def _parse_digest(raw: bytes | None) -> int | None:
    try:
        return int(raw) if raw is not None else None
    except ValueError:
        return None


def _updated_digest(txn: lmdb.Transaction, digest: int | None, items: list[tuple[bytes, bytes]]) -> int | None:
    """``digest`` after writing ``items`` (one lookup per item for the value it replaces): a restore replaying
    many change sets keeps the digest current instead of re-reading the whole table after each. None stays
    unknown."""
    if digest is None:
        return None
    get, entry_hash = txn.get, _entry_hash
    for key, value in items:
        old = get(key)
        if old is not None:
            digest -= entry_hash(key, old)  # type: ignore[arg-type]  # bytes: the environment has buffers off
        digest += entry_hash(key, value)
    return digest & _MASK64


def _table_digest(txn: lmdb.Transaction) -> int:
    """The digest of every state entry (table metadata excluded): a 64-bit sum of per-entry hashes, so it can
    be kept up to date one write at a time."""
    total = 0
    for k, v in txn.cursor():
        if not k.startswith(META_PREFIX):
            total += _entry_hash(k, v)
    return total & _MASK64


def _flat(txn: lmdb.Transaction, kg: int) -> list[bytes]:
    return [x for k, v in _scan(txn, _KG[kg]) for x in (k[2:], v)]


def _entries(txn: lmdb.Transaction, env: lmdb.Environment) -> int:
    return int(txn.stat(env.open_db())["entries"]) - sum(1 for _ in _scan(txn, b"\xff"))


def _scan(txn: lmdb.Transaction, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
    cur = txn.cursor()  # buffers=False: keys and values are bytes
    if not cur.set_range(prefix):
        return
    k: bytes
    v: bytes
    for k, v in cur:  # type: ignore[assignment]
        if not k.startswith(prefix):
            break
        yield k, v
