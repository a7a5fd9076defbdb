"""Spark's ``hash(col1, col2, ...)`` of a key: :func:`compile_key_hasher` resolves a key schema's per-column
updates once and returns a one-argument hasher (cached per schema); :func:`spark_hash` is the one-off form.

A multi-column key chains the seed: ``h = 42; for col: h = update(col, h)``; a null column leaves ``h``
unchanged. Hashers return the signed 32-bit hash, as Spark does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from spate.errors import InvalidKeyError
from spate.keygroups.inference import hash_inferred
from spate.keygroups.memo import (
    MEMO_HASHERS,
    KeyHasher,
    cached_long_hash,
    cached_str_hash,
    long_miss,
    memo_hasher,
    str_miss,
)
from spate.keygroups.murmur3 import SEED
from spate.keygroups.type_names import normalize_key_types, update_for
from spate.keygroups.updates import Update

_HASHER_CACHE: dict[Any, KeyHasher] = {}
_HASHER_CACHE_LIMIT = 1024


def _one_column_hasher(type_name: str, upd: Update) -> KeyHasher:
    def generic(key: Any) -> int:
        if type(key) is tuple:
            if len(key) != 1:
                raise InvalidKeyError(f"expected a 1-column key, got a tuple of {len(key)} values: key_types names "
                                      "one key column; give one type per column")
            key = key[0]
        if key is None:
            return SEED
        h = upd(key, SEED)
        return h - 0x100000000 if h & 0x80000000 else h

    fast = MEMO_HASHERS.get(type_name)
    return memo_hasher(*fast, generic) if fast else generic


def _two_column_hasher(u0: Update, u1: Update) -> KeyHasher:
    def hasher(key: Any) -> int:
        if (type(key) is not tuple and not isinstance(key, (tuple, list))) or len(key) != 2:
            raise InvalidKeyError(f"expected a 2-column key (tuple), got {key!r}: give a tuple of 2 values, one per "
                                  "type of key_types")
        v0, v1 = key
        h = SEED if v0 is None else u0(v0, SEED)
        if v1 is not None:
            h = u1(v1, h)
        return h - 0x100000000 if h & 0x80000000 else h

    return hasher


def _many_column_hasher(updates: Sequence[Update]) -> KeyHasher:
    n = len(updates)

    def hasher(key: Any) -> int:
        if not isinstance(key, (tuple, list)) or len(key) != n:
            raise InvalidKeyError(f"expected a {n}-column key (tuple), got {key!r}: give a tuple of {n} values, one "
                                  "per type of key_types")
        h = SEED
        for u, v in zip(updates, key, strict=True):
            if v is not None:
                h = u(v, h)
        return h - 0x100000000 if h & 0x80000000 else h

    return hasher


def _compile(types: tuple[str, ...]) -> KeyHasher:
    updates = tuple(update_for(t) for t in types)
    if len(updates) == 1:
        hasher = _one_column_hasher(types[0], updates[0])
    elif len(updates) == 2:
        hasher = _two_column_hasher(*updates)
    else:
        hasher = _many_column_hasher(updates)
    hasher.__doc__ = f"Spark hash() of a key with column types {types}."
    return hasher


def hash_dynamic(key: Any) -> int:
    """``spark_hash`` without key_types, as a one-argument hasher."""
    t = type(key)
    if t is int:
        h = cached_long_hash(key)
        return long_miss(key) if h is None else h
    if t is str:
        h = cached_str_hash(key)
        return str_miss(key) if h is None else h
    h = hash_inferred(key)
    return h - 0x100000000 if h & 0x80000000 else h


def _cache_hasher(key_types: Any, hasher: KeyHasher) -> None:
    try:
        if len(_HASHER_CACHE) < _HASHER_CACHE_LIMIT:
            _HASHER_CACHE[key_types] = hasher
    except TypeError:  # unhashable key_types (e.g. a list)
        pass


def compile_key_hasher(key_types: Any = None) -> KeyHasher:
    """Return a fast ``key -> spark_hash(key)`` function for one key schema.

    With ``key_types`` (see :func:`spark_hash`) the per-column hash functions are resolved once; the
    returned hasher raises :class:`~spate.errors.InvalidKeyError` (a ``ValueError`` and a ``TypeError``) if a
    key has the wrong number of columns or a value does not match its column type. Without ``key_types`` the
    hasher infers types per value. Hashers are cached per (hashable) ``key_types``.

    Raises:
        SettingError: ``key_types`` that spate cannot key by (see :func:`normalize_key_types`).
    """
    if key_types is None:
        return hash_dynamic
    if type(key_types) is list:
        key_types = tuple(key_types)
    try:
        return _HASHER_CACHE[key_types]
    except (KeyError, TypeError):
        pass
    types = normalize_key_types(key_types)
    hasher = _HASHER_CACHE.get(types)
    if hasher is None:
        hasher = _compile(types)
        _cache_hasher(types, hasher)
    _cache_hasher(key_types, hasher)
    return hasher


def spark_hash(key: Any, key_types: Any = None) -> int:
    """Exactly Spark SQL's ``hash(col1, col2, ...)`` of ``key`` as a signed 32-bit int.

    ``key`` is a scalar (one key column) or a tuple (one value per column); ``None`` is a null column.
    Without ``key_types`` each value's Spark type is inferred as PySpark does: bool -> boolean,
    int -> bigint (must fit int64), float -> double, str -> string, bytes-like -> binary,
    datetime.date -> date, datetime.datetime -> timestamp, Decimal -> decimal(38,18).
    ``key_types`` is a sequence of Spark DDL type names (``"int"``, ``"bigint"``, ``"decimal(10,2)"``...)
    or pyspark DataTypes, one per column, or a ``StructType``.

    Naive datetimes for ``timestamp`` columns are taken as UTC (PySpark itself uses the Python process'
    local time zone, which agrees when that is UTC); ``timestamp_ntz`` uses the wall-clock time.
    """
    if key_types is None:
        return hash_dynamic(key)
    return compile_key_hasher(key_types)(key)
