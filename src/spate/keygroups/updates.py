"""Per-Spark-type hash updates: ``update(value, h) -> h'`` mixes one column value into the running hash.

Follows ``org.apache.spark.sql.catalyst.expressions.Murmur3Hash``:

* int / smallint / tinyint / date (days since epoch) / boolean (1 or 0) -> ``hashInt``
* bigint / timestamp / timestamp_ntz (microseconds since epoch) -> ``hashLong``
* float -> ``hashInt(floatToIntBits)``, double -> ``hashLong(doubleToLongBits)``; ``-0.0`` hashes as
  ``0.0`` and every NaN as the canonical NaN
* string (UTF-8) / binary -> Spark's legacy ``hashUnsafeBytes``
* decimal(p, s): p <= 18 -> ``hashLong(unscaled)``; otherwise ``hashUnsafeBytes`` of Java's
  ``BigInteger.toByteArray()`` of the unscaled value

Each update checks that the value fits its type and raises ``TypeError``/``ValueError`` otherwise.
"""

from __future__ import annotations

import datetime as dt
import decimal
import struct
from collections.abc import Callable
from typing import Any

from spate.errors import InvalidKeyError
from spate.keygroups.murmur3 import hash_bytes, hash_int, hash_long

# An update takes a column value and the running (unsigned 32-bit) hash and returns the new unsigned hash.
Update = Callable[[Any, int], int]

INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
SMALLINT_MIN, SMALLINT_MAX = -(1 << 15), (1 << 15) - 1
TINYINT_MIN, TINYINT_MAX = -(1 << 7), (1 << 7) - 1
FLOAT_NAN_BITS = 0x7FC00000
DOUBLE_NAN_BITS = 0x7FF8000000000000
_EPOCH_ORDINAL = dt.date(1970, 1, 1).toordinal()
_EPOCH_NAIVE = dt.datetime(1970, 1, 1)
_EPOCH_UTC = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_ONE_US = dt.timedelta(microseconds=1)
_pack_f = struct.Struct("<f").pack
_unpack_I = struct.Struct("<I").unpack
_pack_d = struct.Struct("<d").pack
_unpack_Q = struct.Struct("<Q").unpack
_MAX_LONG_DIGITS = 18


def type_error(value: Any, type_name: str) -> InvalidKeyError:
    return InvalidKeyError(f"cannot hash {type(value).__name__} value {value!r} as Spark type {type_name!r}: give "
                           "the key column values of that type, or key_types matching the values")


def make_integral_update(type_name: str, lo: int, hi: int) -> Update:
    def update(v: Any, h: int) -> int:
        if not isinstance(v, int):
            raise type_error(v, type_name)
        if v < lo or v > hi:
            raise InvalidKeyError(f"value {v} out of range for Spark type {type_name!r} [{lo}, {hi}]: pass key_types "
                                  "with a wider type")
        return hash_int(v, h)

    return update


def update_bigint(v: Any, h: int) -> int:
    if type(v) is not int and not isinstance(v, int):
        raise type_error(v, "bigint")
    if v < INT64_MIN or v > INT64_MAX:
        raise InvalidKeyError(f"int {v} does not fit Spark's LongType (int64); pass key_types for another type")
    return hash_long(v, h)


def update_boolean(v: Any, h: int) -> int:
    if v is True:
        return hash_int(1, h)
    if v is False:
        return hash_int(0, h)
    if isinstance(v, int) and v in (0, 1):  # e.g. numpy.bool_ converted, or 0/1
        return hash_int(int(v), h)
    raise type_error(v, "boolean")


def update_float(v: Any, h: int) -> int:
    if not isinstance(v, (float, int)) or isinstance(v, bool):
        raise type_error(v, "float")
    v = float(v)
    if v != v:
        return hash_int(FLOAT_NAN_BITS, h)
    if v == 0.0:  # -0.0 hashes like 0.0
        return hash_int(0, h)
    try:
        bits = _unpack_I(_pack_f(v))[0]
    except OverflowError:  # a finite double beyond float32 range rounds to +-inf, like Java's (float) cast
        bits = 0x7F800000 if v > 0 else 0xFF800000
    return hash_int(bits, h)


def update_double(v: Any, h: int) -> int:
    if type(v) is not float and (not isinstance(v, (float, int)) or isinstance(v, bool)):
        raise type_error(v, "double")
    v = float(v)
    if v != v:
        return hash_long(DOUBLE_NAN_BITS, h)
    if v == 0.0:
        return hash_long(0, h)
    return hash_long(_unpack_Q(_pack_d(v))[0], h)


def update_string(v: Any, h: int) -> int:
    if type(v) is not str and not isinstance(v, str):
        raise type_error(v, "string")
    return hash_bytes(v.encode("utf-8"), h)


def update_binary(v: Any, h: int) -> int:
    if type(v) is bytes:
        return hash_bytes(v, h)
    if isinstance(v, (bytes, bytearray)):
        return hash_bytes(bytes(v), h)
    if isinstance(v, memoryview):
        return hash_bytes(v.tobytes(), h)
    raise type_error(v, "binary")


def update_date(v: Any, h: int) -> int:
    # datetime is a subclass of date; PySpark's DateType takes its calendar date (toordinal).
    if not isinstance(v, dt.date):
        raise type_error(v, "date")
    return hash_int(v.toordinal() - _EPOCH_ORDINAL, h)


def update_timestamp(v: Any, h: int) -> int:
    if not isinstance(v, dt.datetime):
        raise type_error(v, "timestamp")
    if v.tzinfo is None:
        micros = (v - _EPOCH_NAIVE) // _ONE_US  # naive datetimes are taken as UTC
    else:
        micros = (v - _EPOCH_UTC) // _ONE_US
    return hash_long(micros, h)


def update_timestamp_ntz(v: Any, h: int) -> int:
    if not isinstance(v, dt.datetime):
        raise type_error(v, "timestamp_ntz")
    # Like PySpark's TimestampNTZType.toInternal: the wall-clock time, any tzinfo is ignored.
    return hash_long((v.replace(tzinfo=None) - _EPOCH_NAIVE) // _ONE_US, h)


def _java_bigint_bytes(n: int) -> bytes:
    """``java.math.BigInteger.toByteArray()``: minimal two's-complement big-endian bytes."""
    bit_length = (~n).bit_length() if n < 0 else n.bit_length()
    return n.to_bytes(bit_length // 8 + 1, "big", signed=True)


def _decimal_unscaler(precision: int, scale: int) -> Callable[[Any], int | None]:
    """``value -> unscaled int`` for Spark type decimal(precision, scale) (None for NaN, which is null)."""
    type_name = f"decimal({precision},{scale})"
    limit = 10**precision

    def unscaled(v: Any) -> int | None:
        if isinstance(v, decimal.Decimal):
            if not v.is_finite():
                if v.is_nan():
                    return None  # PySpark treats Decimal('NaN') as null
                raise InvalidKeyError(f"cannot hash {v!r} as Spark type {type_name!r}: a decimal key must be finite")
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
            raise type_error(v, type_name)
        if not -limit < u < limit:
            raise InvalidKeyError(f"{v!r} cannot be represented as Spark type {type_name!r}: pass key_types with a "
                                  "larger precision")
        return u

    return unscaled


def make_decimal_update(precision: int, scale: int) -> Update:
    unscaled = _decimal_unscaler(precision, scale)
    if precision <= _MAX_LONG_DIGITS:

        def update(v: Any, h: int) -> int:
            u = unscaled(v)
            return h if u is None else hash_long(u, h)

    else:

        def update(v: Any, h: int) -> int:
            u = unscaled(v)
            return h if u is None else hash_bytes(_java_bigint_bytes(u), h)

    return update


#: The update of each canonical Spark type name; ``decimal(p,s)`` updates are added on first use.
UPDATES: dict[str, Update] = {
    "int": make_integral_update("int", INT32_MIN, INT32_MAX),
    "smallint": make_integral_update("smallint", SMALLINT_MIN, SMALLINT_MAX),
    "tinyint": make_integral_update("tinyint", TINYINT_MIN, TINYINT_MAX),
    "bigint": update_bigint,
    "boolean": update_boolean,
    "float": update_float,
    "double": update_double,
    "string": update_string,
    "binary": update_binary,
    "date": update_date,
    "timestamp": update_timestamp,
    "timestamp_ntz": update_timestamp_ntz,
}
