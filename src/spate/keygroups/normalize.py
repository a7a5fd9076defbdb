"""Keys as Spark groups them (``NormalizeFloatingNumbers``): ``-0.0`` is ``0.0`` and every NaN one NaN."""

from __future__ import annotations

import math
import struct
from typing import Any

from spate.keygroups.updates import DOUBLE_NAN_BITS

#: The one NaN every NaN key becomes (its bits are Java's canonical NaN). One object, so that dicts, which
#: compare keys by identity before equality, group every NaN key together.
CANONICAL_NAN: float = struct.unpack("<d", struct.pack("<Q", DOUBLE_NAN_BITS))[0]


def _normalize_float(v: float) -> float:
    if v != v:
        return CANONICAL_NAN
    if v == 0.0 and math.copysign(1.0, v) < 0:
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
