"""Reading an lmdb transaction by key prefix: the key-group prefixes, prefix scans, a key group's entries and the
number of state entries."""

from __future__ import annotations

from collections.abc import Iterator
from itertools import islice, takewhile
from operator import itemgetter
from typing import cast

import lmdb

from spate.state.layout import U16

KG_PREFIXES = tuple(U16.pack(kg) for kg in range(1 << 15))  # key-group prefixes, precomputed
_AFTER_PREFIX = itemgetter(slice(2, None))  # a table key without its key-group prefix


def flat_key_group(txn: lmdb.Transaction, kg: int) -> list[bytes]:
    """[flat key, value, ...] of key group ``kg`` (keys without the 2-byte prefix), read by the cursor in C
    loops: the keys up to the next key group's prefix, then as many values from the same place."""
    cur = txn.cursor()  # buffers=False: keys and values are bytes
    keys = list(key_group_keys(cur, kg))
    if not keys:
        return []
    cur.set_range(KG_PREFIXES[kg])
    flat: list[bytes] = [b""] * (2 * len(keys))
    flat[0::2] = map(_AFTER_PREFIX, keys)
    flat[1::2] = islice(cast("Iterator[bytes]", cur.iternext(keys=False, values=True)), len(keys))
    return flat


def key_group_keys(cur: lmdb.Cursor, kg: int) -> Iterator[bytes]:
    """The full keys of key group ``kg``, in order, from the cursor ``cur`` (moved to its first): to consume in a
    C loop."""
    if not cur.set_range(KG_PREFIXES[kg]):
        return iter(())
    end = KG_PREFIXES[kg + 1] if kg + 1 < len(KG_PREFIXES) else b"\x80\x00"
    return takewhile(end.__gt__, cast("Iterator[bytes]", cur.iternext(keys=True, values=False)))


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
