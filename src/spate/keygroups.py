"""Spark-compatible key -> key group mapping and Flink's key-group range formulas.

A *key group* is the unit of keyed state that is moved around when an operator is rescaled. A key is
assigned to a key group with exactly the same arithmetic Spark SQL uses for ``pmod(hash(cols...), n)``,
so a DataFrame can be pre-partitioned by key group inside Spark (``F.pmod(F.hash(*cols), F.lit(n))``)
and the in-process runner computes the identical value per row in pure Python.

Key groups ``[0, max_parallelism)`` are then split into contiguous ranges, one per parallel subtask,
with Flink's ``KeyGroupRangeAssignment`` formulas.

Hashing follows ``org.apache.spark.sql.catalyst.expressions.Murmur3Hash`` (seed 42) and
``org.apache.spark.unsafe.hash.Murmur3_x86_32``:

* int / smallint / tinyint / date (days since epoch) / boolean (1 or 0) -> ``hashInt``
* bigint / timestamp / timestamp_ntz (microseconds since epoch) -> ``hashLong``
* float -> ``hashInt(floatToIntBits)``, double -> ``hashLong(doubleToLongBits)``; ``-0.0`` hashes as
  ``0.0`` and every NaN as the canonical NaN
* string (UTF-8) / binary -> Spark's legacy ``hashUnsafeBytes`` (little-endian 4-byte words, then each
  tail byte mixed on its own as a *signed* byte)
* decimal(p, s): p <= 18 -> ``hashLong(unscaled)``; otherwise ``hashUnsafeBytes`` of Java's
  ``BigInteger.toByteArray()`` of the unscaled value
* a multi-column key chains the seed: ``h = 42; for col: h = hash(col, h)``; a null column leaves ``h``
  unchanged.

Everything is pure Python on masked ints; per-type hash functions are precompiled per key schema with
:func:`compile_key_hasher`, which is what per-row callers should use.
"""

from __future__ import annotations

import datetime as _dt
import decimal as _decimal
import math as _math
import re as _re
import struct as _struct
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from spate.errors import IncompatibleStateError

__all__ = [
    "MAX_MAX_PARALLELISM",
    "SEED",
    "compile_key_hasher",
    "default_max_parallelism",
    "key_group",
    "key_group_range",
    "key_groups",
    "normalize_key",
    "normalize_key_types",
    "spark_hash",
    "subtask_for_key_group",
]

#: Upper bound for ``max_parallelism`` (Flink's ``UPPER_BOUND_MAX_PARALLELISM``, 2**15).
MAX_MAX_PARALLELISM = 32768

#: Seed of Spark SQL's ``hash()`` (``Murmur3Hash``).
SEED = 42

_M32 = 0xFFFFFFFF
_C1 = 0xCC9E2D51
_C2 = 0x1B873593
_INT32_MIN, _INT32_MAX = -(1 << 31), (1 << 31) - 1
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_EPOCH_ORDINAL = _dt.date(1970, 1, 1).toordinal()
_EPOCH_NAIVE = _dt.datetime(1970, 1, 1)
_EPOCH_UTC = _dt.datetime(1970, 1, 1, tzinfo=_dt.UTC)
_ONE_US = _dt.timedelta(microseconds=1)
_FLOAT_NAN_BITS = 0x7FC00000
_DOUBLE_NAN_BITS = 0x7FF8000000000000
_pack_f = _struct.Struct("<f").pack
_unpack_I = _struct.Struct("<I").unpack
_pack_d = _struct.Struct("<d").pack
_unpack_Q = _struct.Struct("<Q").unpack
_MAX_LONG_DIGITS = 18
_UNPACK_WORDS = [_struct.Struct(f"<{n}I").unpack_from for n in range(64)]

# Bounded memo tables for the hot single-column paths (keys repeat a lot in keyed streams). Separate tables
# per Spark type because 1 == True == 1.0 as dict keys. Cleared wholesale when full.
_CACHE_LIMIT = 1 << 16
_CACHE_MAX_STR_LEN = 256
_LONG_CACHE: dict[int, int] = {}
_INT32_CACHE: dict[int, int] = {}
_STR_CACHE: dict[str, int] = {}

# A hash "update" function takes a column value and the running (unsigned 32-bit) hash and returns the
# new unsigned hash.
_Update = Callable[[Any, int], int]


# --------------------------------------------------------------------------------------------------
# Murmur3_x86_32 primitives (all state kept as unsigned 32-bit Python ints)
# --------------------------------------------------------------------------------------------------


def _hash_int(v: int, h: int) -> int:
    """Murmur3_x86_32.hashInt(v, seed=h) as an unsigned 32-bit int (``v`` may be any int)."""
    k = (v * _C1) & _M32
    k = (((k << 15) | (k >> 17)) * _C2) & _M32
    h ^= k
    h = (((h << 13) | (h >> 19)) * 5 + 0xE6546B64) & _M32
    h ^= 4
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & _M32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & _M32
    return h ^ (h >> 16)


def _hash_long(v: int, h: int) -> int:
    """Murmur3_x86_32.hashLong(v, seed=h): low word then high word, fmix with length 8."""
    k = ((v & _M32) * _C1) & _M32
    k = (((k << 15) | (k >> 17)) * _C2) & _M32
    h ^= k
    h = (((h << 13) | (h >> 19)) * 5 + 0xE6546B64) & _M32
    k = (((v >> 32) & _M32) * _C1) & _M32
    k = (((k << 15) | (k >> 17)) * _C2) & _M32
    h ^= k
    h = (((h << 13) | (h >> 19)) * 5 + 0xE6546B64) & _M32
    h ^= 8
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & _M32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & _M32
    return h ^ (h >> 16)


def _hash_bytes(b: bytes, h: int) -> int:
    """Spark's legacy Murmur3_x86_32.hashUnsafeBytes(b, seed=h).

    Whole 4-byte little-endian words are mixed first; each remaining tail byte is then mixed on its own as
    a sign-extended byte (this differs from standard Murmur3 and is what Spark's ``hash()`` uses).
    """
    n = len(b)
    words = n >> 2
    if words:
        unpack = _UNPACK_WORDS[words] if words < 64 else _struct.Struct(f"<{words}I").unpack_from
        for k in unpack(b):
            k = (k * _C1) & _M32
            k = (((k << 15) | (k >> 17)) * _C2) & _M32
            h ^= k
            h = (((h << 13) | (h >> 19)) * 5 + 0xE6546B64) & _M32
    for i in range(words << 2, n):
        k = b[i]
        k = ((k - 256 if k > 127 else k) * _C1) & _M32
        k = (((k << 15) | (k >> 17)) * _C2) & _M32
        h ^= k
        h = (((h << 13) | (h >> 19)) * 5 + 0xE6546B64) & _M32
    h ^= n
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & _M32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & _M32
    return h ^ (h >> 16)


def _to_signed(h: int) -> int:
    return h - 0x100000000 if h & 0x80000000 else h


# --------------------------------------------------------------------------------------------------
# Per-type value -> hash update functions
# --------------------------------------------------------------------------------------------------


def _type_error(value: Any, type_name: str) -> TypeError:
    return TypeError(f"cannot hash {type(value).__name__} value {value!r} as Spark type {type_name!r}")


def _make_integral(type_name: str, lo: int, hi: int) -> _Update:
    def update(v: Any, h: int) -> int:
        if not isinstance(v, int):
            raise _type_error(v, type_name)
        if v < lo or v > hi:
            raise ValueError(f"value {v} out of range for Spark type {type_name!r} [{lo}, {hi}]")
        return _hash_int(v, h)

    return update


def _upd_long(v: Any, h: int) -> int:
    if type(v) is not int and not isinstance(v, int):
        raise _type_error(v, "bigint")
    if v < _INT64_MIN or v > _INT64_MAX:
        raise ValueError(f"int {v} does not fit Spark's LongType (int64); pass key_types for another type")
    return _hash_long(v, h)


def _upd_boolean(v: Any, h: int) -> int:
    if v is True:
        return _hash_int(1, h)
    if v is False:
        return _hash_int(0, h)
    if isinstance(v, int) and v in (0, 1):  # e.g. numpy.bool_ converted, or 0/1
        return _hash_int(int(v), h)
    raise _type_error(v, "boolean")


def _upd_float(v: Any, h: int) -> int:
    if not isinstance(v, (float, int)) or isinstance(v, bool):
        raise _type_error(v, "float")
    v = float(v)
    if v != v:
        return _hash_int(_FLOAT_NAN_BITS, h)
    if v == 0.0:  # -0.0 hashes like 0.0
        return _hash_int(0, h)
    try:
        bits = _unpack_I(_pack_f(v))[0]
    except OverflowError:  # a finite double beyond float32 range rounds to +-inf, like Java's (float) cast
        bits = 0x7F800000 if v > 0 else 0xFF800000
    return _hash_int(bits, h)


def _upd_double(v: Any, h: int) -> int:
    if type(v) is not float and (not isinstance(v, (float, int)) or isinstance(v, bool)):
        raise _type_error(v, "double")
    v = float(v)
    if v != v:
        return _hash_long(_DOUBLE_NAN_BITS, h)
    if v == 0.0:
        return _hash_long(0, h)
    return _hash_long(_unpack_Q(_pack_d(v))[0], h)


def _upd_string(v: Any, h: int) -> int:
    if type(v) is not str and not isinstance(v, str):
        raise _type_error(v, "string")
    return _hash_bytes(v.encode("utf-8"), h)


def _upd_binary(v: Any, h: int) -> int:
    if type(v) is bytes:
        return _hash_bytes(v, h)
    if isinstance(v, (bytes, bytearray)):
        return _hash_bytes(bytes(v), h)
    if isinstance(v, memoryview):
        return _hash_bytes(v.tobytes(), h)
    raise _type_error(v, "binary")


def _upd_date(v: Any, h: int) -> int:
    # datetime is a subclass of date; PySpark's DateType takes its calendar date (toordinal).
    if not isinstance(v, _dt.date):
        raise _type_error(v, "date")
    return _hash_int(v.toordinal() - _EPOCH_ORDINAL, h)


def _upd_timestamp(v: Any, h: int) -> int:
    if not isinstance(v, _dt.datetime):
        raise _type_error(v, "timestamp")
    if v.tzinfo is None:
        micros = (v - _EPOCH_NAIVE) // _ONE_US  # naive datetimes are taken as UTC
    else:
        micros = (v - _EPOCH_UTC) // _ONE_US
    return _hash_long(micros, h)


def _upd_timestamp_ntz(v: Any, h: int) -> int:
    if not isinstance(v, _dt.datetime):
        raise _type_error(v, "timestamp_ntz")
    # Like PySpark's TimestampNTZType.toInternal: the wall-clock time, any tzinfo is ignored.
    return _hash_long((v.replace(tzinfo=None) - _EPOCH_NAIVE) // _ONE_US, h)


def _java_bigint_bytes(n: int) -> bytes:
    """``java.math.BigInteger.toByteArray()``: minimal two's-complement big-endian bytes."""
    bit_length = (~n).bit_length() if n < 0 else n.bit_length()
    return n.to_bytes(bit_length // 8 + 1, "big", signed=True)


def _make_decimal(precision: int, scale: int) -> _Update:
    type_name = f"decimal({precision},{scale})"
    limit = 10**precision

    def unscaled(v: Any) -> int | None:
        if isinstance(v, _decimal.Decimal):
            if not v.is_finite():
                if v.is_nan():
                    return None  # PySpark treats Decimal('NaN') as null
                raise ValueError(f"cannot hash {v!r} as Spark type {type_name!r}")
            sign, digits, exp = v.as_tuple()
            coef = int("".join(map(str, digits))) if digits else 0
            assert isinstance(exp, int)
            shift = exp + scale
            if shift >= 0:
                u = coef * 10**shift
            else:  # reduce the scale, rounding HALF_UP like Spark's Decimal.changePrecision
                div = 10**-shift
                u, rem = divmod(coef, div)
                if 2 * rem >= div:
                    u += 1
            if sign:
                u = -u
        elif isinstance(v, int) and not isinstance(v, bool):
            u = v * 10**scale
        else:
            raise _type_error(v, type_name)
        if not -limit < u < limit:
            raise ValueError(f"{v!r} cannot be represented as Spark type {type_name!r}")
        return u

    if precision <= _MAX_LONG_DIGITS:

        def update(v: Any, h: int) -> int:
            u = unscaled(v)
            return h if u is None else _hash_long(u, h)

    else:

        def update(v: Any, h: int) -> int:
            u = unscaled(v)
            return h if u is None else _hash_bytes(_java_bigint_bytes(u), h)

    return update


_UPDATES: dict[str, _Update] = {
    "int": _make_integral("int", _INT32_MIN, _INT32_MAX),
    "smallint": _make_integral("smallint", -(1 << 15), (1 << 15) - 1),
    "tinyint": _make_integral("tinyint", -(1 << 7), (1 << 7) - 1),
    "bigint": _upd_long,
    "boolean": _upd_boolean,
    "float": _upd_float,
    "double": _upd_double,
    "string": _upd_string,
    "binary": _upd_binary,
    "date": _upd_date,
    "timestamp": _upd_timestamp,
    "timestamp_ntz": _upd_timestamp_ntz,
}

_ALIASES = {
    "integer": "int",
    "long": "bigint",
    "short": "smallint",
    "byte": "tinyint",
    "real": "float",
    "timestamp_ltz": "timestamp",
}

_DECIMAL_RE = _re.compile(r"^(?:decimal|dec|numeric)\s*(?:\(\s*(\d+)\s*(?:,\s*(\d+)\s*)?\))?$")

_SUPPORTED_TYPES_TEXT = (
    "int/integer, bigint/long, smallint/short, tinyint/byte, boolean, float, double, string, binary, "
    "date, timestamp, timestamp_ntz, decimal(p,s)"
)


def _canonical_type(t: Any) -> str:
    """Canonical Spark type name for a DDL string or a pyspark DataType (duck-typed)."""
    if isinstance(t, str):
        name = t
    elif hasattr(t, "simpleString") and callable(t.simpleString):
        name = t.simpleString()
    else:
        raise TypeError(f"key type must be a Spark DDL type name or a pyspark DataType, got {type(t).__name__}: {t!r}")
    name = " ".join(name.strip().lower().split())
    name = _ALIASES.get(name, name)
    if name in _UPDATES:
        return name
    m = _DECIMAL_RE.match(name)
    if m:
        precision = int(m.group(1)) if m.group(1) else 10
        scale = int(m.group(2)) if m.group(2) else 0
        if not 1 <= precision <= 38 or not 0 <= scale <= precision:
            raise ValueError(f"invalid decimal type {t!r}: need 1 <= precision <= 38 and 0 <= scale <= precision")
        return f"decimal({precision},{scale})"
    raise TypeError(f"unsupported Spark key type {t!r}; supported types: {_SUPPORTED_TYPES_TEXT}")


def normalize_key_types(key_types: Any) -> tuple[str, ...]:
    """Normalise ``key_types`` to a tuple of canonical Spark type names (one per key column).

    Accepts a sequence of DDL type names / pyspark DataTypes, a pyspark ``StructType`` (its fields'
    types), or a single type name / DataType for a one-column key.
    """
    if isinstance(key_types, str):
        items: Iterable[Any] = [key_types]
    elif hasattr(key_types, "fields") and hasattr(key_types, "simpleString"):  # StructType
        items = [f.dataType for f in key_types.fields]
    elif hasattr(key_types, "simpleString"):  # a single (non-struct) DataType
        items = [key_types]
    else:
        try:
            items = list(key_types)
        except TypeError:
            raise TypeError(
                f"key_types must be a sequence of Spark types or a StructType, got {type(key_types).__name__}"
            ) from None
    result = tuple(_canonical_type(t) for t in items)
    if not result:
        raise ValueError("key_types must name at least one key column")
    return result


def _update_for(type_name: str) -> _Update:
    upd = _UPDATES.get(type_name)
    if upd is None:  # decimal(p,s)
        m = _DECIMAL_RE.match(type_name)
        assert m is not None
        upd = _make_decimal(int(m.group(1)), int(m.group(2)))
        _UPDATES[type_name] = upd
    return upd


# --------------------------------------------------------------------------------------------------
# Type inference (PySpark's defaults) for keys hashed without key_types
# --------------------------------------------------------------------------------------------------

_INFERRED: dict[type, _Update] = {
    bool: _upd_boolean,
    int: _upd_long,
    float: _upd_double,
    str: _upd_string,
    bytes: _upd_binary,
    bytearray: _upd_binary,
    memoryview: _upd_binary,
    _dt.date: _upd_date,
    _dt.datetime: _upd_timestamp,
    _decimal.Decimal: _make_decimal(38, 18),
}


def _infer_update(v: Any) -> _Update:
    upd = _INFERRED.get(type(v))
    if upd is not None:
        return upd
    # Subclasses: order matters (bool before int, datetime before date).
    for cls in (bool, int, float, str, bytes, bytearray, memoryview, _dt.datetime, _dt.date, _decimal.Decimal):
        if isinstance(v, cls):
            return _INFERRED[cls]
    raise TypeError(
        f"cannot infer a Spark type for key value of type {type(v).__name__}; supported Python types: "
        "bool, int, float, str, bytes/bytearray/memoryview, datetime.date, datetime.datetime, "
        "decimal.Decimal (or None); pass key_types=[...] with Spark type names for other keys"
    )


def _hash_inferred(key: Any) -> int:
    """Unsigned hash of ``key`` with types inferred per value (PySpark's default inference)."""
    if type(key) is tuple or isinstance(key, tuple):
        h = SEED
        for v in key:
            if v is not None:
                h = _infer_update(v)(v, h)
        return h
    if key is None:
        return SEED
    return _infer_update(key)(key, SEED)


# --------------------------------------------------------------------------------------------------
# Public hashing API
# --------------------------------------------------------------------------------------------------

KeyHasher = Callable[[Any], int]

_HASHER_CACHE: dict[Any, KeyHasher] = {}


def _compile(types: tuple[str, ...]) -> KeyHasher:
    updates = tuple(_update_for(t) for t in types)
    n = len(updates)
    if n == 1:
        upd = updates[0]

        def generic(key: Any) -> int:
            if type(key) is tuple:
                if len(key) != 1:
                    raise ValueError(f"expected a 1-column key, got a tuple of {len(key)} values")
                key = key[0]
            if key is None:
                return SEED
            h = upd(key, SEED)
            return h - 0x100000000 if h & 0x80000000 else h

        fast = _MEMO_HASHERS.get(types[0])
        hasher = _memo_hasher(*fast, generic) if fast else generic

    elif n == 2:
        u0, u1 = updates

        def hasher(key: Any) -> int:
            if (type(key) is not tuple and not isinstance(key, (tuple, list))) or len(key) != 2:
                raise ValueError(f"expected a 2-column key (tuple), got {key!r}")
            v0, v1 = key
            h = SEED if v0 is None else u0(v0, SEED)
            if v1 is not None:
                h = u1(v1, h)
            return h - 0x100000000 if h & 0x80000000 else h

    else:

        def hasher(key: Any) -> int:
            if not isinstance(key, (tuple, list)) or len(key) != n:
                raise ValueError(f"expected a {n}-column key (tuple), got {key!r}")
            h = SEED
            for u, v in zip(updates, key, strict=True):
                if v is not None:
                    h = u(v, h)
            return h - 0x100000000 if h & 0x80000000 else h

    hasher.__doc__ = f"Spark hash() of a key with column types {types}."
    return hasher


def _remember(cache: dict[Any, int], key: Any, unsigned: int) -> int:
    """Store the signed form of ``unsigned`` for ``key`` in a bounded memo table and return it."""
    h = unsigned - 0x100000000 if unsigned & 0x80000000 else unsigned
    if len(cache) >= _CACHE_LIMIT:
        cache.clear()
    cache[key] = h
    return h


def _long_miss(key: int) -> int:
    """Signed hash of an exact ``int`` as bigint, memoised in ``_LONG_CACHE``."""
    if not _INT64_MIN <= key <= _INT64_MAX:
        raise ValueError(f"int {key} does not fit Spark's LongType (int64); pass key_types for another type")
    return _remember(_LONG_CACHE, key, _hash_long(key, SEED))


def _int32_miss(key: int) -> int:
    """Signed hash of an exact ``int`` as Spark int, memoised in ``_INT32_CACHE``."""
    if not _INT32_MIN <= key <= _INT32_MAX:
        raise ValueError(f"value {key} out of range for Spark type 'int' [{_INT32_MIN}, {_INT32_MAX}]")
    return _remember(_INT32_CACHE, key, _hash_int(key, SEED))


def _str_miss(key: str) -> int:
    """Signed hash of an exact ``str`` as Spark string, memoised in ``_STR_CACHE`` (short strings only)."""
    h = _hash_bytes(key.encode("utf-8"), SEED)
    if len(key) <= _CACHE_MAX_STR_LEN:
        return _remember(_STR_CACHE, key, h)
    return h - 0x100000000 if h & 0x80000000 else h


_MEMO_HASHERS: dict[str, tuple[type, dict[Any, int], Callable[[Any], int]]] = {
    "bigint": (int, _LONG_CACHE, _long_miss),
    "int": (int, _INT32_CACHE, _int32_miss),
    "string": (str, _STR_CACHE, _str_miss),
}


def _memo_hasher(py_type: type, cache: dict[Any, int], miss: Callable[[Any], int],
                 generic: KeyHasher) -> KeyHasher:
    """A single-column hasher with a memoised fast path for exact ``py_type`` values."""

    def hasher(key: Any) -> int:
        if type(key) is py_type:
            h = cache.get(key)
            return miss(key) if h is None else h
        return generic(key)

    return hasher


#: The one NaN every NaN key becomes (its bits are Java's canonical NaN). One object, so that dicts, which
#: compare keys by identity before equality, group every NaN key together.
CANONICAL_NAN: float = _struct.unpack("<d", _struct.pack("<Q", _DOUBLE_NAN_BITS))[0]


def _normalize_float(v: float) -> float:
    if v != v:
        return CANONICAL_NAN
    if v == 0.0 and _math.copysign(1.0, v) < 0:
        return 0.0
    return v


def normalize_key(key: Any) -> Any:
    """``key`` as Spark groups it: ``-0.0`` becomes ``0.0`` and every NaN :data:`CANONICAL_NAN`, in a scalar
    key or in any column of a tuple key (Spark's ``NormalizeFloatingNumbers``). Returns ``key`` itself (the
    same object) when nothing changes, so callers can detect that cheaply."""
    if isinstance(key, float):
        return _normalize_float(key)
    if type(key) is tuple and any(isinstance(v, float) for v in key):
        normalized = tuple(_normalize_float(v) if isinstance(v, float) else v for v in key)
        return key if all(a is b for a, b in zip(normalized, key, strict=True)) else normalized
    return key


def _hash_dynamic(key: Any) -> int:
    """``spark_hash`` without key_types, as a one-argument hasher."""
    t = type(key)
    if t is int:
        h = _LONG_CACHE.get(key)
        return _long_miss(key) if h is None else h
    if t is str:
        h = _STR_CACHE.get(key)
        return _str_miss(key) if h is None else h
    h = _hash_inferred(key)
    return h - 0x100000000 if h & 0x80000000 else h


def compile_key_hasher(key_types: Any = None) -> KeyHasher:
    """Return a fast ``key -> spark_hash(key)`` function for one key schema.

    With ``key_types`` (see :func:`spark_hash`) the per-column hash functions are resolved once; the
    returned hasher raises ``ValueError`` if a key has the wrong number of columns and ``TypeError`` if a
    value does not match its column type. Without ``key_types`` the hasher infers types per value.
    Hashers are cached per (hashable) ``key_types``.
    """
    if key_types is None:
        return _hash_dynamic
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
        if len(_HASHER_CACHE) < 1024:
            _HASHER_CACHE[types] = hasher
    try:
        if len(_HASHER_CACHE) < 1024:
            _HASHER_CACHE[key_types] = hasher
    except TypeError:  # unhashable key_types (e.g. a list)
        pass
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
        return _hash_dynamic(key)
    return compile_key_hasher(key_types)(key)


def _check_max_parallelism(max_parallelism: int) -> None:
    if not isinstance(max_parallelism, int) or isinstance(max_parallelism, bool):
        raise TypeError(f"max_parallelism must be an int, got {type(max_parallelism).__name__}")
    if not 0 < max_parallelism <= MAX_MAX_PARALLELISM:
        raise ValueError(f"max_parallelism must be in 1..{MAX_MAX_PARALLELISM}, got {max_parallelism}")


def key_group(key: Any, max_parallelism: int, key_types: Any = None) -> int:
    """Key group of ``key``: Spark's ``pmod(hash(cols...), max_parallelism)``, in ``[0, max_parallelism)``.

    For per-row use with a fixed schema prefer ``compile_key_hasher(key_types)(key) % max_parallelism``.
    """
    if type(max_parallelism) is not int or not 0 < max_parallelism <= MAX_MAX_PARALLELISM:
        _check_max_parallelism(max_parallelism)
    if key_types is None:
        t = type(key)
        if t is int:
            h = _LONG_CACHE.get(key)
            return (_long_miss(key) if h is None else h) % max_parallelism
        if t is str:
            h = _STR_CACHE.get(key)
            return (_str_miss(key) if h is None else h) % max_parallelism
        h = _hash_inferred(key)
        return (h - 0x100000000 if h & 0x80000000 else h) % max_parallelism
    return compile_key_hasher(key_types)(key) % max_parallelism


def key_groups(keys: Sequence[Any] | Any, max_parallelism: int, key_types: Any = None) -> list[int]:
    """Key groups of many keys (see :func:`key_group`).

    A 1-D numpy array of integers (single ``bigint`` column, or ``int``/``smallint``/``tinyint``/``date``
    when given as ``key_types``) or of float64 (``double``) is hashed vectorised.
    """
    _check_max_parallelism(max_parallelism)
    vectorised = _numpy_key_groups(keys, max_parallelism, key_types)
    if vectorised is not None:
        return vectorised
    if hasattr(keys, "dtype") and hasattr(keys, "tolist"):  # other numpy arrays: hash Python scalars
        keys = keys.tolist()
    hasher = compile_key_hasher(key_types)
    return [hasher(k) % max_parallelism for k in keys]


# --------------------------------------------------------------------------------------------------
# numpy-vectorised path
# --------------------------------------------------------------------------------------------------


def _numpy_key_groups(keys: Any, max_parallelism: int, key_types: Any) -> list[int] | None:
    dtype = getattr(keys, "dtype", None)
    if dtype is None or getattr(keys, "ndim", None) != 1 or dtype.kind not in "iuf":
        return None
    import numpy as np

    if key_types is None:
        type_name = "double" if dtype.kind == "f" else "bigint"
    else:
        types = normalize_key_types(key_types)
        if len(types) != 1:
            return None
        type_name = types[0]
    arr = np.asarray(keys)
    if dtype.kind == "f":
        if type_name != "double" or dtype.itemsize != 8:
            return None
        bits = np.where(arr == 0.0, 0.0, arr).view(np.uint64)
        bits = np.where(np.isnan(arr), np.uint64(_DOUBLE_NAN_BITS), bits)
        h = _np_hash_long(bits)
    elif type_name == "bigint":
        if dtype.kind == "u" and arr.size and int(arr.max()) > _INT64_MAX:
            raise ValueError("unsigned value does not fit Spark's LongType (int64)")
        h = _np_hash_long(arr.astype(np.int64, copy=False).view(np.uint64))
    elif type_name in ("int", "smallint", "tinyint", "date"):
        lo, hi = {
            "int": (_INT32_MIN, _INT32_MAX),
            "date": (_INT32_MIN, _INT32_MAX),
            "smallint": (-(1 << 15), (1 << 15) - 1),
            "tinyint": (-(1 << 7), (1 << 7) - 1),
        }[type_name]
        if arr.size and (int(arr.min()) < lo or int(arr.max()) > hi):
            raise ValueError(f"value out of range for Spark type {type_name!r}")
        h = _np_hash_int(arr.astype(np.int64, copy=False).astype(np.uint32))
    else:
        return None
    signed = h.view(np.int32).astype(np.int64)
    return (signed % max_parallelism).tolist()


def _np_mix(h: Any, k: Any) -> Any:
    k = k * _C1
    k = (k << 15) | (k >> 17)
    k = k * _C2
    h = h ^ k
    h = (h << 13) | (h >> 19)
    return h * 5 + 0xE6546B64


def _np_fmix(h: Any, length: int) -> Any:
    h = h ^ length
    h = h ^ (h >> 16)
    h = h * 0x85EBCA6B
    h = h ^ (h >> 13)
    h = h * 0xC2B2AE35
    return h ^ (h >> 16)


def _np_hash_int(v: Any) -> Any:
    import numpy as np

    h = np.full(v.shape, SEED, dtype=np.uint32)
    return _np_fmix(_np_mix(h, v.astype(np.uint32)), 4)


def _np_hash_long(bits: Any) -> Any:
    import numpy as np

    h = np.full(bits.shape, SEED, dtype=np.uint32)
    h = _np_mix(h, (bits & _M32).astype(np.uint32))
    h = _np_mix(h, (bits >> 32).astype(np.uint32))
    return _np_fmix(h, 8)


# --------------------------------------------------------------------------------------------------
# Flink KeyGroupRangeAssignment
# --------------------------------------------------------------------------------------------------


def _check_parallelism(max_parallelism: int, parallelism: int) -> None:
    for name, v in (("max_parallelism", max_parallelism), ("parallelism", parallelism)):
        if not isinstance(v, int) or isinstance(v, bool):
            raise TypeError(f"{name} must be an int, got {type(v).__name__}")
    if not 0 < max_parallelism <= MAX_MAX_PARALLELISM:
        raise ValueError(f"max_parallelism must be in 1..{MAX_MAX_PARALLELISM}, got {max_parallelism}")
    if not 0 < parallelism <= max_parallelism:
        raise ValueError(f"parallelism must be in 1..max_parallelism ({max_parallelism}), got {parallelism}")


def check_parallelism(parallelism: int, max_parallelism: int) -> None:
    """Refuse a parallelism a query with ``max_parallelism`` key groups cannot run at, saying what to use."""
    if not isinstance(parallelism, int) or isinstance(parallelism, bool) or parallelism < 1:
        raise ValueError(f"parallelism must be an int >= 1, got {parallelism!r}")
    if parallelism > max_parallelism:
        raise IncompatibleStateError(
            f"parallelism {parallelism} exceeds the max parallelism {max_parallelism} of the query's state (its "
            f"number of key groups, fixed when the checkpoint root was created): use at most {max_parallelism} "
            "subtasks")


def key_group_range(max_parallelism: int, parallelism: int, index: int) -> range:
    """Key groups owned by subtask ``index`` of ``parallelism`` (Flink's formula), as a Python range.

    ``start = ceil(index * max_parallelism / parallelism)``,
    ``end (inclusive) = floor(((index + 1) * max_parallelism - 1) / parallelism)``; the ranges of all
    subtasks partition ``[0, max_parallelism)`` into contiguous, non-empty pieces.
    """
    _check_parallelism(max_parallelism, parallelism)
    if not isinstance(index, int) or isinstance(index, bool):
        raise TypeError(f"index must be an int, got {type(index).__name__}")
    if not 0 <= index < parallelism:
        raise ValueError(f"subtask index must be in 0..{parallelism - 1}, got {index}")
    start = (index * max_parallelism + parallelism - 1) // parallelism
    end = ((index + 1) * max_parallelism - 1) // parallelism
    return range(start, end + 1)


def subtask_for_key_group(max_parallelism: int, parallelism: int, key_group: int) -> int:
    """Index of the subtask (of ``parallelism``) owning ``key_group``: ``key_group * parallelism // max_p``."""
    _check_parallelism(max_parallelism, parallelism)
    if not isinstance(key_group, int) or isinstance(key_group, bool):
        raise TypeError(f"key_group must be an int, got {type(key_group).__name__}")
    if not 0 <= key_group < max_parallelism:
        raise ValueError(f"key_group must be in 0..{max_parallelism - 1}, got {key_group}")
    return key_group * parallelism // max_parallelism


def default_max_parallelism(parallelism: int) -> int:
    """Flink's default max parallelism: ``min(max(next_pow2(P + P // 2), 128), 32768)``."""
    if not isinstance(parallelism, int) or isinstance(parallelism, bool):
        raise TypeError(f"parallelism must be an int, got {type(parallelism).__name__}")
    if not 0 < parallelism <= MAX_MAX_PARALLELISM:
        raise ValueError(f"parallelism must be in 1..{MAX_MAX_PARALLELISM}, got {parallelism}")
    x = parallelism + parallelism // 2
    pow2 = 1 << (x - 1).bit_length()
    return min(max(pow2, 128), MAX_MAX_PARALLELISM)
