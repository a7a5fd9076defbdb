"""A state value (or map-state key) as Spark's ``transformWithState`` stores it, with the same meaning.

On Spark a value takes two steps. The Python client (``StatefulProcessorApiClient._serialize_to_bytes``)
iterates the value into a tuple (so a bare ``5`` fails with ``TypeError``, a string ``"abc"`` becomes
``('a', 'b', 'c')`` and a dict its keys), normalizes numpy and pandas scalars, applies the schema's
``toInternal`` and pickles the result. The JVM unpickles it (Python ``int`` → ``Integer``/``Long``/``BigInteger``
by size, ``float`` → ``Double``, ``tuple`` → an array, ``list`` → a ``List``, ``dict`` → a ``Map``) and
converts it by the schema (``EvaluatePython.makeFromJava``): a value of another type becomes null (an ``int``
for a ``double``, a ``float`` for a ``long``, a ``bool`` for a number), integers narrow by wrapping (2**40 in an
``int`` is 0), anything in a ``string`` field becomes its Java ``toString`` (``5`` → ``"5"``), and a struct
given more or fewer values than it has fields fails the task with ``[STRUCT_ARRAY_LENGTH_MISMATCH]``.

spate runs the installed pyspark's own client step and then these JVM rules (:func:`spark_internal`), so a
processor's values mean on spate what they mean on Spark.
"""

from __future__ import annotations

import datetime as _dt
import decimal
import math
import pickle
import types
from typing import Any

from pyspark.errors import PySparkRuntimeError
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DayTimeIntervalType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from spate.errors import SparkErrorClass, SpateError

_INT = (-(2**31), 2**31 - 1)
_LONG = (-(2**63), 2**63 - 1)


class StateValueError(SparkErrorClass, SpateError, PySparkRuntimeError):
    """A value Spark's JVM refuses for a state's schema (the task fails on Spark): Spark's error class and
    message, and a ``PySparkRuntimeError`` as a processor on Spark would see the failure."""

    def __init__(self, message: str) -> None:
        PySparkRuntimeError.__init__(self, message=message)


def spark_internal(value: Any, schema: StructType, what: str) -> tuple:
    """``value`` for ``schema`` as Spark stores it, in Spark's internal form (a tuple of the fields; structs as
    tuples, timestamps as microseconds, dates as days). Raises what Spark raises: the client's ``TypeError``
    for a value it cannot iterate, :class:`StateValueError` where the JVM fails; ``what`` names the state."""
    internal = _client_internal(value, schema)
    try:
        return _from_java(internal, schema)
    except _Refused as e:
        raise refused(e.error_class, f"{e} ({what})") from None


def refused(error_class: str | None, message: str) -> StateValueError:
    """The error for a value Spark's state server refuses (its error class, its message): on Spark the server
    logs it and the task fails with the Python worker's lost connection."""
    prefix = f"[{error_class}] " if error_class else ""
    return StateValueError(f"{prefix}{message}; on Spark the task fails")


def _client_internal(value: Any, schema: StructType) -> Any:
    """What the installed pyspark's client sends for ``value``: its own ``_serialize_to_bytes``, unpickled."""
    from pyspark.sql.streaming import stateful_processor_api_client as api

    # the serializer the installed client pickles with (CPickleSerializer, a cloudpickle one, before 4.2)
    serializer = getattr(api, "CPickleSerializer", None) or api.PickleSerializer
    client: Any = types.SimpleNamespace(pickleSer=serializer())  # stands in for the client: only pickleSer is used
    return pickle.loads(api.StatefulProcessorApiClient._serialize_to_bytes(client, schema, value))  # noqa: SLF001


class _Refused(Exception):
    def __init__(self, error_class: str | None, message: str) -> None:
        super().__init__(message)
        self.error_class = error_class


_UNPICKLED = (bool, int, float, str, bytes, bytearray, tuple, list, dict, set, decimal.Decimal, _dt.date, _dt.time,
              _dt.timedelta)


def _from_java(obj: Any, dtype: DataType) -> Any:
    """``obj`` (as the JVM unpickles it) converted to ``dtype`` as ``EvaluatePython.makeFromJava`` converts it."""
    if obj is None:
        return None
    if not isinstance(obj, _UNPICKLED):
        raise _Refused(None, "net.razorvine.pickle.PickleException: expected zero arguments for construction of "
                       f"ClassDict (for {type(obj).__module__}.{type(obj).__name__}): the JVM cannot unpickle it; "
                       "convert it to a Python value first (e.g. .tolist())")
    if isinstance(dtype, StructType):
        if not isinstance(obj, tuple):
            return None
        if len(obj) != len(dtype.fields):
            raise _Refused("STRUCT_ARRAY_LENGTH_MISMATCH", "Input row doesn't have expected number of values "
                           f"required by the schema. {len(dtype.fields)} fields are required while {len(obj)} "
                           "values are provided.")
        return tuple(_from_java(v, f.dataType) for v, f in zip(obj, dtype.fields, strict=True))
    if isinstance(dtype, ArrayType):
        return [_from_java(v, dtype.elementType) for v in obj] if isinstance(obj, (list, tuple)) else None
    if isinstance(dtype, MapType):  # as spate stores a map: its (key, value) pairs
        if not isinstance(obj, dict):
            return None
        return [(_from_java(k, dtype.keyType), _from_java(v, dtype.valueType)) for k, v in obj.items()]
    if isinstance(dtype, StringType):
        return _java_string(obj)
    return _scalar(obj, dtype)


def _scalar(obj: Any, dtype: DataType) -> Any:
    java_int = type(obj) is int and _INT[0] <= obj <= _INT[1]
    java_long = type(obj) is int and _LONG[0] <= obj <= _LONG[1]
    if isinstance(dtype, BooleanType):
        return obj if type(obj) is bool else None
    if isinstance(dtype, (ByteType, ShortType, IntegerType)):
        bits = {ByteType: 8, ShortType: 16, IntegerType: 32}[type(dtype)]
        return _wrap(obj, bits) if java_long else None
    if isinstance(dtype, (LongType, TimestampType, TimestampNTZType, DayTimeIntervalType)):
        return obj if java_long else None
    if isinstance(dtype, DateType):
        return obj if java_int else None
    if isinstance(dtype, FloatType):
        return _to_float32(obj) if type(obj) is float else None
    if isinstance(dtype, DoubleType):
        return obj if type(obj) is float else None
    if isinstance(dtype, DecimalType):
        return _decimal(obj, dtype) if isinstance(obj, decimal.Decimal) else None
    if isinstance(dtype, BinaryType):
        if isinstance(obj, str):
            return obj.encode()
        return bytes(obj) if isinstance(obj, (bytes, bytearray)) else None
    return obj


def _wrap(value: int, bits: int) -> int:
    """Java's narrowing of an integer to ``bits`` bits (two's complement)."""
    value &= (1 << bits) - 1
    return value - (1 << bits) if value >> (bits - 1) else value


def _to_float32(value: float) -> float:
    import struct

    if math.isinf(value) or math.isnan(value) or abs(value) <= 3.4028234663852886e38:
        return struct.unpack("f", struct.pack("f", value))[0]
    return math.copysign(math.inf, value)


def _decimal(value: decimal.Decimal, dtype: DecimalType) -> decimal.Decimal:
    """``Decimal(value, precision, scale)``: rounded half-up to the scale; too many digits fail."""
    rounded = value.quantize(decimal.Decimal(1).scaleb(-dtype.scale), rounding=decimal.ROUND_HALF_UP)
    if len(rounded.as_tuple().digits) > dtype.precision and rounded != 0:
        raise _Refused("NUMERIC_VALUE_OUT_OF_RANGE.WITHOUT_SUGGESTION",
                       f"The {rounded} rounded half up from {value} cannot be represented as Decimal("
                       f"{dtype.precision}, {dtype.scale}).")
    return rounded


def _java_string(obj: Any) -> str:
    """Java's ``toString`` of ``obj`` as the JVM unpickles it. Where Java's depends on an object's identity
    (a tuple or ``bytes`` is an array: ``[Ljava.lang.Object;@1b2c3d``) or a ``Calendar`` (a ``datetime``), no
    two runs of Spark agree either: spate stores Python's ``str``."""
    if isinstance(obj, str):
        return obj
    if type(obj) is bool:
        return "true" if obj else "false"
    if type(obj) is float:
        return _java_double(obj)
    if isinstance(obj, list):
        return "[" + ", ".join("null" if v is None else _java_string(v) for v in obj) + "]"
    if isinstance(obj, dict):
        return "{" + ", ".join(f"{_java_string(k)}={'null' if v is None else _java_string(v)}"
                               for k, v in obj.items()) + "}"
    return str(obj)


def _java_double(value: float) -> str:
    """``Double.toString``: plain between 10^-3 and 10^7 (as Python's ``repr`` there), else scientific
    (``1.0E300``, ``1.23456789E7``) with the shortest digits."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    if value == 0 or 1e-3 <= abs(value) < 1e7:
        return repr(value)
    sign, digits, exponent = decimal.Decimal(repr(value)).as_tuple()
    assert isinstance(exponent, int)
    shown = "".join(map(str, digits)).rstrip("0") or "0"
    return f"{'-' if sign else ''}{shown[0]}.{shown[1:] or '0'}E{exponent + len(digits) - 1}"


__all__ = ["StateValueError", "refused", "spark_internal"]
