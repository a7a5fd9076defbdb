"""``lmdb`` table: key-group-prefixed keys in an LMDB environment on local disk.

Larger than memory, shared safely across processes (:mod:`spate.state.lmdb_dir`), and every read transaction is
an O(1) consistent snapshot. :class:`~spate.state.lmdb_writer.LmdbWriter` holds the environment and its write
transaction; :class:`LmdbTable` adds the table's operations on value entries, map entries, key-group scans,
bulk writes, whole-table keys and metadata. The read-only table of another subtask and the directory functions
are importable from here too.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import cast

import lmdb

from spate.crc import crc32
from spate.errors import SpateError
from spate.state.layout import META_PREFIX, primary_length
from spate.state.lmdb_append import put_sorted
from spate.state.lmdb_digest import DIGEST_KEY, MASK64, replaced_digest
from spate.state.lmdb_dir import held_for_reading, last_used, move_table, remove_if_unused
from spate.state.lmdb_prefetch import warm
from spate.state.lmdb_readonly import ReadOnlyTable
from spate.state.lmdb_scan import KG_PREFIXES, count_entries, flat_key_group, scan_prefix
from spate.state.lmdb_writer import MAX_LMDB_KEY, LmdbWriter
from spate.state.table import StateTable

__all__ = [
    "MAX_LMDB_KEY",
    "LmdbTable",
    "ReadOnlyTable",
    "held_for_reading",
    "last_used",
    "move_table",
    "remove_if_unused",
]


class LmdbTable(LmdbWriter, StateTable):
    """State table backed by an LMDB environment in ``path``."""

    kind = "lmdb"

    # -- value entries --------------------------------------------------------------------------------
    def get(self, kg: int, primary: bytes) -> bytes | None:
        return (self._txn or self._begin()).get(KG_PREFIXES[kg] + primary)  # type: ignore[return-value]

    def put(self, kg: int, primary: bytes, value: bytes) -> None:
        self._put(KG_PREFIXES[kg] + primary, value)

    def put_existed(self, kg: int, primary: bytes, value: bytes) -> bool:
        return self._put(KG_PREFIXES[kg] + primary, value)

    def get_many(self, kgs: Sequence[int], primaries: Sequence[bytes]) -> list[bytes | None]:
        keys = [KG_PREFIXES[kg] + p for kg, p in zip(kgs, primaries, strict=True)]
        warm(self.env, keys)
        get = (self._txn or self._begin()).get
        return cast("list[bytes | None]", list(map(get, keys)))

    def put_many(self, entries: Sequence[tuple[int, bytes, bytes]]) -> None:
        self.put_many_existed(entries)

    def put_many_existed(self, entries: Sequence[tuple[int, bytes, bytes]]) -> list[bool]:
        """``put`` of each entry, with the digest kept in one pass, and whether each existed: lmdb's replace
        returns the old value, so nothing is looked up. A batch larger than the transaction's room is written in
        runs, committed every ``commit_every`` writes as :meth:`_put` would; map growth and a table whose digest
        is unknown go through :meth:`_put`, entry by entry."""
        keys = [KG_PREFIXES[kg] + primary for kg, primary, _value in entries]
        warm(self.env, keys)
        if self._digest is None:
            return [self._put(key, value) for key, (_kg, _primary, value) in zip(keys, entries, strict=True)]
        existed: list[bool] = []
        start = 0
        while start < len(entries):
            end = min(len(entries), start + max(1, self._commit_every - len(self._ops)))
            existed += self._replace_run(keys[start:end], entries[start:end])
            if len(self._ops) >= self._commit_every:
                self.commit()
            start = end
        return existed

    def _replace_run(self, keys: list[bytes], entries: Sequence[tuple[int, bytes, bytes]]) -> list[bool]:
        """Replace ``entries`` (at ``keys``) in the open transaction, keeping the digest; whether each existed."""
        txn, crc, digest = self._txn or self._begin(), crc32, self._digest
        assert digest is not None
        done: list[tuple[bytes, bytes | None]] = []
        existed: list[bool] = []
        try:
            for key, (_kg, _primary, value) in zip(keys, entries, strict=True):
                old = txn.replace(key, value)
                key_crc = crc(key)
                digest += crc(value, key_crc) + 1
                if old is not None:
                    digest -= crc(old, key_crc) + 1
                done.append((key, value))
                existed.append(old is not None)
        except (lmdb.MapFullError, lmdb.BadValsizeError) as e:
            self._digest = digest & MASK64
            self._ops.extend(done)
            if isinstance(e, lmdb.MapFullError):  # the transaction is dead: grow the map and replay it first
                self._grow_and_replay()
            rest = zip(keys[len(done):], entries[len(done):], strict=True)
            return existed + [self._put(key, value) for key, (_kg, _p, value) in rest]  # explains a bad value
        self._digest = digest & MASK64
        self._ops.extend(done)
        return existed

    def delete(self, kg: int, primary: bytes) -> None:
        prefix = KG_PREFIXES[kg] + primary
        if not self._delete(prefix):  # not a value entry: delete the map entries under the primary
            for key in self._keys_with_prefix(self._w(), prefix):
                self._delete(key)

    # -- map entries ----------------------------------------------------------------------------------
    def map_get(self, kg: int, primary: bytes, user_key: bytes) -> bytes | None:
        return self._w().get(KG_PREFIXES[kg] + primary + user_key)  # type: ignore[return-value]

    def map_put(self, kg: int, primary: bytes, user_key: bytes, value: bytes) -> None:
        self._put(KG_PREFIXES[kg] + primary + user_key, value)

    def map_put_existed(self, kg: int, primary: bytes, user_key: bytes, value: bytes) -> bool:
        return self._put(KG_PREFIXES[kg] + primary + user_key, value)

    def map_delete(self, kg: int, primary: bytes, user_key: bytes) -> None:
        self._delete(KG_PREFIXES[kg] + primary + user_key)

    def map_items(self, kg: int, primary: bytes) -> list[tuple[bytes, bytes]]:
        prefix = KG_PREFIXES[kg] + primary
        n = len(prefix)
        return [(k[n:], v) for k, v in scan_prefix(self._w(), prefix)]

    @staticmethod
    def _keys_with_prefix(txn: lmdb.Transaction, prefix: bytes) -> list[bytes]:
        return [k for k, _ in scan_prefix(txn, prefix)]

    # -- scans ----------------------------------------------------------------------------------------
    def state_entries(self, kg: int, sid_prefix: bytes) -> Iterator[tuple[bytes, bytes, bytes]]:
        for k, v in list(scan_prefix(self._w(), KG_PREFIXES[kg] + sid_prefix)):
            flat = k[2:]
            plen = primary_length(flat)
            yield flat[:plen], flat[plen:], v

    def key_group_flat(self, kg: int) -> list[bytes]:
        self.commit()
        with self._env_begin() as txn:
            return flat_key_group(txn, kg)

    # -- bulk: a key group restored, a prefix dropped ------------------------------------------------------------
    def restore_key_group(self, kg: int, flat: list[bytes], map_sids: frozenset[bytes],
                          digest: int | None = None) -> None:
        """Put a key group's entries in one bulk write of their own transaction. ``digest``: their share of the
        table digest (:func:`~spate.state.lmdb_digest.key_group_digest`, carried by the snapshot), added as is
        when the key group was empty; else the entries are hashed (in C loops). No Python loop per entry."""
        prefix = KG_PREFIXES[kg]
        keys, values = list(map(prefix.__add__, flat[0::2])), flat[1::2]
        self.commit()
        while True:
            try:
                with self._env_begin(write=True) as txn:
                    self._digest = self._restored_digest(txn, prefix, keys, values, digest)
                    put_sorted(txn, keys, values)
                    if self._digest is None:
                        txn.delete(DIGEST_KEY)  # recomputed at the next commit
                    else:
                        txn.put(DIGEST_KEY, str(self._digest).encode())
                self._committed_digest = self._digest
                return
            except lmdb.MapFullError:
                self._digest = self._committed_digest
                self._resize(self.env.info()["map_size"] * 2)
            except lmdb.BadValsizeError as e:
                self._digest = self._committed_digest
                raise SpateError(f"a restored state key is too large for the lmdb table (limit {MAX_LMDB_KEY} "
                                 "bytes); restore into the heap table") from e

    def _restored_digest(self, txn: lmdb.Transaction, prefix: bytes, keys: list[bytes], values: list[bytes],
                         carried: int | None) -> int | None:
        if self._digest is None:
            return None
        empty = not _holds_prefix(txn, prefix)
        if carried is not None and empty:
            return (self._digest + carried) & MASK64
        return replaced_digest(txn, self._digest, keys, values, replaces_nothing=empty)

    def has_prefix(self, prefix: bytes) -> bool:
        """Whether some entry's key starts with ``prefix``."""
        return _holds_prefix(self._txn or self._begin(), prefix)

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
        digest, crc, ops, n = self._digest, crc32, self._ops, 0
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
        self._digest = digest & MASK64 if digest is not None else None
        return n

    # -- whole table keys (an overlay over read-only bases works with them) ---------------------------------
    def get_key(self, key: bytes) -> bytes | None:
        return cast("bytes | None", (self._txn or self._begin()).get(key))  # buffers off: values are bytes

    def put_key(self, key: bytes, value: bytes) -> bool:
        """Put a whole table key; True if the table held it."""
        return self._put(key, value)


    def add_new(self, items: list[tuple[bytes, bytes]]) -> None:
        """Put entries whose keys the table does not hold, in the open transaction, in one bulk write (the
        digest gains each entry; no lookup of a value replaced)."""
        txn = self._txn or self._begin()
        digest = self._digest
        if digest is not None:
            crc = crc32
            digest += sum(crc(v, crc(k)) + 1 for k, v in items)
        try:
            txn.cursor().putmulti(items)
        except lmdb.MapFullError:
            self._grow_and_replay()
            self.add_new(items)
            return
        self._digest = digest & MASK64 if digest is not None else None
        self._ops.extend(items)

    def delete_key(self, key: bytes) -> bool:
        return self._delete(key)

    def scan(self, prefix: bytes) -> list[tuple[bytes, bytes]]:
        """Every (key, value) whose key starts with ``prefix``, in the open transaction, in key order."""
        return list(scan_prefix(self._w(), prefix))

    # -- metadata -------------------------------------------------------------------------------------
    def get_meta(self, name: str) -> bytes | None:
        return self._w().get(META_PREFIX + name.encode())  # type: ignore[return-value]

    def put_meta(self, name: str, value: bytes) -> None:
        self._put(META_PREFIX + name.encode(), value)

    def committed_meta(self, name: str) -> bytes | None:
        """A metadata entry as last committed (by any process), read without starting a write transaction."""
        with self._env_begin() as txn:
            return cast("bytes | None", txn.get(META_PREFIX + name.encode()))  # buffers off: values are bytes

    def entry_count(self) -> int:
        """lmdb's own count (open transaction included) less the few entries under ``0xff`` (metadata)."""
        if self._txn is not None:
            return count_entries(self._txn, self.env)
        with self._env_begin() as txn:  # no write transaction just to count
            return count_entries(txn, self.env)

    def approx_bytes(self) -> int:
        info, stat = self.env.info(), self.env.stat()
        return (info["last_pgno"] + 1) * stat["psize"]



def _holds_prefix(txn: lmdb.Transaction, prefix: bytes) -> bool:
    cur = txn.cursor()
    return bool(cur.set_range(prefix)) and bytes(cur.key()).startswith(prefix)

