"""Hashing without ``key_types``: each value's Spark type inferred as PySpark infers it."""

from __future__ import annotations

import datetime as dt
import decimal
from typing import Any

from spate.errors import InvalidKeyError
from spate.keygroups.murmur3 import SEED
from spate.keygroups.updates import (
    Update,
    make_decimal_update,
    update_bigint,
    update_binary,
    update_boolean,
    update_date,
    update_double,
    update_string,
    update_timestamp,
)

_INFERRED: dict[type, Update] = {
    bool: update_boolean,
    int: update_bigint,
    float: update_double,
    str: update_string,
    bytes: update_binary,
    bytearray: update_binary,
    memoryview: update_binary,
    dt.date: update_date,
    dt.datetime: update_timestamp,
    decimal.Decimal: make_decimal_update(38, 18),
}


def _infer_update(v: Any) -> Update:
    upd = _INFERRED.get(type(v))
    if upd is not None:
        return upd
    # Subclasses: order matters (bool before int, datetime before date).
    for cls in (bool, int, float, str, bytes, bytearray, memoryview, dt.datetime, dt.date, decimal.Decimal):
        if isinstance(v, cls):
            return _INFERRED[cls]
    raise InvalidKeyError(
        f"cannot infer a Spark type for key value of type {type(v).__name__}; supported Python types: "
        "bool, int, float, str, bytes/bytearray/memoryview, datetime.date, datetime.datetime, "
        "decimal.Decimal (or None); pass key_types=[...] with Spark type names for other keys"
    )


def hash_inferred(key: Any) -> int:
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
