"""The integrity digest of an lmdb table: a 64-bit sum of per-entry CRC32s over every state entry (metadata
excluded), so it can be kept up to date one write at a time and stored with each commit.

Being a sum, it splits by key group: a key group's share (:func:`key_group_digest`) travels with the key group
in a keyed snapshot, so a restore adds it instead of hashing every entry again. Sums over many entries run in
C loops (``map`` over :func:`spate.crc.crc32`), never a Python loop per entry; a key's CRC is continued from its key
group's 2-byte prefix instead of hashing a concatenated key.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import compress, islice, repeat
from operator import is_not
from typing import cast

import lmdb

from spate.crc import crc32
from spate.state.layout import META_PREFIX

DIGEST_KEY = META_PREFIX + b"digest"
MASK64 = (1 << 64) - 1
_CHUNK = 65536  # entries hashed at a time when the whole table is read


def digest_problem(txn: lmdb.Transaction) -> str | None:
    """None if the committed entries agree with the digest stored with them, else what is wrong."""
    recorded, actual = parse_digest(cast("bytes | None", txn.get(DIGEST_KEY))), table_digest(txn)  # buffers off
    if recorded is None:
        return "it has no valid recorded digest (damaged, or written by an older spate)"
    if recorded != actual:
        return f"its entries do not match the digest recorded at its last commit ({actual} != {recorded})"
    return None


def entry_hash(key: bytes, value: bytes) -> int:
    return crc32(value, crc32(key)) + 1


def entries_digest(keys: Sequence[bytes], values: Sequence[bytes]) -> int:
    """The sum of :func:`entry_hash` over the entries (full table keys ``keys``, ``values``), not masked."""
    crc = crc32
    return sum(map(crc, values, map(crc, keys))) + len(keys)


def key_group_digest(prefix: bytes, flat_keys: Sequence[bytes], values: Sequence[bytes]) -> int:
    """A key group's share of the digest (masked): the entries ``flat_keys`` (without the key group's 2-byte
    ``prefix``) and ``values``, hashed as the table stores them (prefix + flat key)."""
    crc = crc32
    return (sum(map(crc, values, map(crc, flat_keys, repeat(crc(prefix))))) + len(flat_keys)) & MASK64


def parse_digest(raw: bytes | None) -> int | None:
    try:
        return int(raw) if raw is not None else None
    except ValueError:
        return None


def replaced_digest(txn: lmdb.Transaction, digest: int, keys: list[bytes], values: Sequence[bytes],
                    replaces_nothing: bool = False) -> int:
    """``digest`` after putting ``values`` under ``keys`` (full table keys) in ``txn``: what the keys held
    before is looked up in C loops and subtracted, unless the caller knows there is none."""
    digest += entries_digest(keys, values)
    if not replaces_nothing:
        old = list(map(txn.get, keys))
        if old.count(None) < len(old):
            present = list(map(is_not, old, repeat(None)))
            digest -= entries_digest(list(compress(keys, present)), list(compress(old, present)))  # type: ignore[arg-type]
    return digest & MASK64


def table_digest(txn: lmdb.Transaction) -> int:
    """The digest of every state entry (table metadata, whose keys sort last, excluded): a 64-bit sum of
    per-entry hashes, so it can be kept up to date one write at a time. Read in chunks, hashed in C loops."""
    entries = cast("Iterator[tuple[bytes, bytes]]", txn.cursor().iternext())  # buffers off: bytes
    total = 0
    while chunk := list(islice(entries, _CHUNK)):
        if chunk[-1][0].startswith(META_PREFIX):
            chunk = [e for e in chunk if not e[0].startswith(META_PREFIX)]
            if not chunk:
                break
        keys, values = zip(*chunk, strict=True)
        total += entries_digest(keys, values)
    return total & MASK64
