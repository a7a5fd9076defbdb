"""Reading committed lmdb state: a read view of a table being written (one read transaction) and the read-only
table of another subtask."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from typing import cast

import lmdb

from spate.page_cache import reading_ahead
from spate.state.layout import META_PREFIX
from spate.state.lmdb_digest import digest_problem
from spate.state.lmdb_scan import count_entries, flat_key_group, scan_prefix


class ReadView:
    """The committed state of a table being written, as one read transaction saw it (a consistent view)."""

    def __init__(self, txn: lmdb.Transaction) -> None:
        self._txn = txn

    @property
    def txn(self) -> lmdb.Transaction:
        """The read transaction (for lmdb's copy of the environment as it saw it)."""
        return self._txn

    def key_group_flat(self, kg: int) -> list[bytes]:
        return flat_key_group(self._txn, kg)

    def get_key(self, key: bytes) -> bytes | None:
        return cast("bytes | None", self._txn.get(key))  # buffers off: values are bytes

    def scan(self, prefix: bytes) -> list[tuple[bytes, bytes]]:
        return list(scan_prefix(self._txn, prefix))


class ReadOnlyTable:
    """The committed state of a table another subtask wrote (a table directory, or with ``file=True`` a data file
    alone), read while nothing writes it: :func:`held_for_reading` keeps writers away, and a base of an overlay
    is never written (so lmdb's own reader lock is not needed). Each thread reads through its own transaction."""

    def __init__(self, path: str, file: bool = False) -> None:
        self.path = path
        if file and not os.path.isfile(path):
            raise FileNotFoundError(path)
        self.env = lmdb.open(path, readonly=True, lock=False, subdir=not file, max_dbs=0, readahead=False)
        self._file = file
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
        return cast("bytes | None", self._txn().get(META_PREFIX + name.encode()))  # buffers off: values are bytes

    def key_group_flat(self, kg: int) -> list[bytes]:
        return flat_key_group(self._txn(), kg)

    def get_key(self, key: bytes) -> bytes | None:
        return cast("bytes | None", self._txn().get(key))  # buffers off: values are bytes

    def scan(self, prefix: bytes) -> list[tuple[bytes, bytes]]:
        return list(scan_prefix(self._txn(), prefix))


    def entry_count(self) -> int:
        """The state entries of the file (not its metadata)."""
        return count_entries(self._txn(), self.env)

    def scan_from(self, start: bytes, prefix: bytes, limit: int) -> list[tuple[bytes, bytes]]:
        """Up to ``limit`` entries with keys from ``start`` on that start with ``prefix``, in key order."""
        out: list[tuple[bytes, bytes]] = []
        cur = self._txn().cursor()
        if cur.set_range(start):
            for k, v in cast("Iterator[tuple[bytes, bytes]]", cur):  # buffers off: keys and values are bytes
                if len(out) >= limit or not k.startswith(prefix):
                    break
                out.append((k, v))
        return out

    def verify(self) -> str | None:
        """As :meth:`LmdbTable.verify`."""
        try:
            with reading_ahead(self.path if self._file else os.path.join(self.path, "data.mdb")):
                return digest_problem(self._txn())
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
