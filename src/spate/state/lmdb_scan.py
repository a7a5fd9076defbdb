"""Reading an lmdb transaction by key prefix: the key-group prefixes, prefix scans, a key group's entries and the
number of state entries."""

from __future__ import annotations

from collections.abc import Iterator

import lmdb

from spate.state.layout import U16

KG_PREFIXES = tuple(U16.pack(kg) for kg in range(1 << 15))  # key-group prefixes, precomputed


def flat_key_group(txn: lmdb.Transaction, kg: int) -> list[bytes]:
    return [x for k, v in scan_prefix(txn, KG_PREFIXES[kg]) for x in (k[2:], v)]


def count_entries(txn: lmdb.Transaction, env: lmdb.Environment) -> int:
    return int(txn.stat(env.open_db())["entries"]) - sum(1 for _ in scan_prefix(txn, b"\xff"))


def scan_prefix(txn: lmdb.Transaction, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
    cur = txn.cursor()  # buffers=False: keys and values are bytes
    if not cur.set_range(prefix):
        return
    k: bytes
    v: bytes
    for k, v in cur:  # type: ignore[assignment]
        if not k.startswith(prefix):
            break
        yield k, v
