"""Memoised hashes of the hot single-column keys (exact ``int`` as bigint or int, short ``str``).

Keys repeat a lot in keyed streams. Each table maps a key to its signed hash; there is one table per Spark
type because ``1 == True == 1.0`` as dict keys. A table is cleared wholesale when full. A hot path reads a
table with ``.get`` and calls the matching ``*_miss`` function only on a miss.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from spate.errors import InvalidKeyError
from spate.keygroups.murmur3 import SEED, hash_bytes, hash_int, hash_long
from spate.keygroups.updates import INT32_MAX, INT32_MIN, INT64_MAX, INT64_MIN

KeyHasher = Callable[[Any], int]

_CACHE_LIMIT = 1 << 16
_CACHE_MAX_STR_LEN = 256
LONG_CACHE: dict[int, int] = {}
INT32_CACHE: dict[int, int] = {}
STR_CACHE: dict[str, int] = {}
# The tables' lookups, bound once: a hot path calls them directly (a method call on a name imported from
# another module would build a bound method per call).
cached_long_hash = LONG_CACHE.get
cached_str_hash = STR_CACHE.get


def _remember(cache: dict[Any, int], key: Any, unsigned: int) -> int:
    """Store the signed form of ``unsigned`` for ``key`` in a bounded memo table and return it."""
    h = unsigned - 0x100000000 if unsigned & 0x80000000 else unsigned
    if len(cache) >= _CACHE_LIMIT:
        cache.clear()
    cache[key] = h
    return h


def long_miss(key: int) -> int:
    """Signed hash of an exact ``int`` as bigint, memoised in ``LONG_CACHE``."""
    if not INT64_MIN <= key <= INT64_MAX:
        raise InvalidKeyError(f"int {key} does not fit Spark's LongType (int64); pass key_types for another type")
    return _remember(LONG_CACHE, key, hash_long(key, SEED))


def int32_miss(key: int) -> int:
    """Signed hash of an exact ``int`` as Spark int, memoised in ``INT32_CACHE``."""
    if not INT32_MIN <= key <= INT32_MAX:
        raise InvalidKeyError(f"value {key} out of range for Spark type 'int' [{INT32_MIN}, {INT32_MAX}]: pass "
                              "key_types with a wider type (bigint)")
    return _remember(INT32_CACHE, key, hash_int(key, SEED))


def str_miss(key: str) -> int:
    """Signed hash of an exact ``str`` as Spark string, memoised in ``STR_CACHE`` (short strings only)."""
    h = hash_bytes(key.encode("utf-8"), SEED)
    if len(key) <= _CACHE_MAX_STR_LEN:
        return _remember(STR_CACHE, key, h)
    return h - 0x100000000 if h & 0x80000000 else h


#: Per canonical type with a memo: (the exact Python type memoised, its table, its miss function).
MEMO_HASHERS: dict[str, tuple[type, dict[Any, int], Callable[[Any], int]]] = {
    "bigint": (int, LONG_CACHE, long_miss),
    "int": (int, INT32_CACHE, int32_miss),
    "string": (str, STR_CACHE, str_miss),
}


def memo_hasher(py_type: type, cache: dict[Any, int], miss: Callable[[Any], int], generic: KeyHasher) -> KeyHasher:
    """A single-column hasher with a memoised fast path for exact ``py_type`` values."""

    def hasher(key: Any) -> int:
        if type(key) is py_type:
            h = cache.get(key)
            return miss(key) if h is None else h
        return generic(key)

    return hasher
