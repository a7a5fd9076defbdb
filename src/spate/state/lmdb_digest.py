"""The integrity digest of an lmdb table: a 64-bit sum of per-entry CRC32s over every state entry (metadata
excluded), so it can be kept up to date one write at a time and stored with each commit."""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from typing import cast

import lmdb

from spate.state.layout import META_PREFIX

DIGEST_KEY = META_PREFIX + b"digest"
MASK64 = (1 << 64) - 1


def digest_problem(txn: lmdb.Transaction) -> str | None:
    """None if the committed entries agree with the digest stored with them, else what is wrong."""
    recorded, actual = parse_digest(cast("bytes | None", txn.get(DIGEST_KEY))), table_digest(txn)  # buffers off
    if recorded is None:
        return "it has no valid recorded digest (damaged, or written by an older spate)"
    if recorded != actual:
        return f"its entries do not match the digest recorded at its last commit ({actual} != {recorded})"
    return None


def entry_hash(key: bytes, value: bytes) -> int:
    return zlib.crc32(value, zlib.crc32(key)) + 1


def parse_digest(raw: bytes | None) -> int | None:
    try:
        return int(raw) if raw is not None else None
    except ValueError:
        return None


def updated_digest(txn: lmdb.Transaction, digest: int | None, items: list[tuple[bytes, bytes]],
                   replaces_nothing: bool = False) -> int | None:
    """``digest`` after writing ``items`` (one lookup per item for the value it replaces, none when the caller
    knows there is none: a key group restored into an empty table): a restore replaying many change sets keeps
    the digest current instead of re-reading the whole table after each. None stays unknown."""
    if digest is None:
        return None
    get, hash_of = txn.get, entry_hash
    if replaces_nothing:
        return (digest + sum(hash_of(k, v) for k, v in items)) & MASK64
    for key, value in items:
        old = get(key)
        if old is not None:
            digest -= hash_of(key, old)  # type: ignore[arg-type]  # bytes: the environment has buffers off
        digest += hash_of(key, value)
    return digest & MASK64


def table_digest(txn: lmdb.Transaction) -> int:
    """The digest of every state entry (table metadata excluded): a 64-bit sum of per-entry hashes, so it can
    be kept up to date one write at a time."""
    total = 0
    for k, v in cast("Iterator[tuple[bytes, bytes]]", txn.cursor()):  # buffers off: keys and values are bytes
        if not k.startswith(META_PREFIX):
            total += entry_hash(k, v)
    return total & MASK64
