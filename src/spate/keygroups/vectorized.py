"""Key groups of a 1-D numpy array of keys, hashed with numpy (Murmur3 on ``uint32`` lanes): integers as
``bigint`` (or ``int``/``smallint``/``tinyint``/``date`` given as ``key_types``), float64 as ``double``."""

from __future__ import annotations

from typing import Any

from spate.errors import InvalidKeyError
from spate.keygroups.murmur3 import C1, C2, M32, SEED
from spate.keygroups.type_names import normalize_key_types
from spate.keygroups.updates import (
    DOUBLE_NAN_BITS,
    INT32_MAX,
    INT32_MIN,
    INT64_MAX,
    SMALLINT_MAX,
    SMALLINT_MIN,
    TINYINT_MAX,
    TINYINT_MIN,
)

_INT_RANGES = {
    "int": (INT32_MIN, INT32_MAX),
    "date": (INT32_MIN, INT32_MAX),
    "smallint": (SMALLINT_MIN, SMALLINT_MAX),
    "tinyint": (TINYINT_MIN, TINYINT_MAX),
}


def numpy_key_groups(keys: Any, max_parallelism: int, key_types: Any) -> list[int] | None:
    """Key groups of ``keys`` hashed vectorised, or None if ``keys`` is not an array this path handles."""
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
        bits = np.where(np.isnan(arr), np.uint64(DOUBLE_NAN_BITS), bits)
        h = _np_hash_long(bits)
    elif type_name == "bigint":
        if dtype.kind == "u" and arr.size and int(arr.max()) > INT64_MAX:
            raise InvalidKeyError("unsigned value does not fit Spark's LongType (int64): key by values below 2**63")
        h = _np_hash_long(arr.astype(np.int64, copy=False).view(np.uint64))
    elif type_name in _INT_RANGES:
        lo, hi = _INT_RANGES[type_name]
        if arr.size and (int(arr.min()) < lo or int(arr.max()) > hi):
            raise InvalidKeyError(f"value out of range for Spark type {type_name!r}: pass key_types with a wider type")
        h = _np_hash_int(arr.astype(np.int64, copy=False).astype(np.uint32))
    else:
        return None
    signed = h.view(np.int32).astype(np.int64)
    return (signed % max_parallelism).tolist()


def _np_mix(h: Any, k: Any) -> Any:
    k = k * C1
    k = (k << 15) | (k >> 17)
    k = k * C2
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
    h = _np_mix(h, (bits & M32).astype(np.uint32))
    h = _np_mix(h, (bits >> 32).astype(np.uint32))
    return _np_fmix(h, 8)
