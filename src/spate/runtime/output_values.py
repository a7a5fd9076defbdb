"""Output values against an output schema: which Python values a field of each Arrow type takes without loss
(as Spark's Arrow conversion stores them), the per-field checks built from that, and turning columns into an
Arrow table of the schema (:func:`conform_to_schema`). :mod:`spate.runtime.outputs` uses them to check a batch's
outputs; :class:`PandasConversion` is how a pandas DataFrame's columns become Arrow.
"""

from __future__ import annotations

import datetime as _dt
import decimal
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from spate.errors import OutputError

CONVERSION_ERRORS = (pa.ArrowException, TypeError, ValueError, OverflowError)
Accepts = Callable[[Any], bool]

def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _int_range(t: pa.DataType) -> Accepts:
    bits = t.bit_width
    low, high = (0, 2 ** bits - 1) if pa.types.is_unsigned_integer(t) else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
    return lambda v: _is_int(v) and low <= v <= high


def _instances(*types: type) -> Accepts:
    return lambda v: isinstance(v, types)


def _accepts(t: pa.DataType) -> Accepts:
    """Whether a Python value can be stored in an Arrow field of type ``t`` (None is checked elsewhere)."""
    is_ = pa.types
    if is_.is_boolean(t):
        return _instances(bool)
    if is_.is_integer(t):
        return _int_range(t)
    if is_.is_floating(t):
        return lambda v: _is_int(v) or isinstance(v, float)
    if is_.is_decimal(t):
        return lambda v: _is_int(v) or isinstance(v, decimal.Decimal)
    if is_.is_string(t) or is_.is_large_string(t):
        return _instances(str)
    if is_.is_binary(t) or is_.is_large_binary(t) or is_.is_fixed_size_binary(t):
        return _instances(bytes, bytearray)
    if is_.is_timestamp(t):
        return _instances(_dt.datetime)
    if is_.is_date(t):
        return _instances(_dt.date)
    if is_.is_duration(t):
        return _instances(_dt.timedelta)
    if is_.is_list(t) or is_.is_large_list(t):
        return _list_of(t.value_field)
    if is_.is_map(t):
        return _map_of(t.key_field, t.item_field)
    if is_.is_struct(t):
        return _struct_of([t.field(i) for i in range(t.num_fields)])
    return lambda v: arrow_takes(v, t)


def arrow_takes(value: Any, t: pa.DataType) -> bool:
    try:
        pa.scalar(value, type=t)
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        return False
    return True


def _value_check(field: pa.Field) -> Accepts:
    accepts = _accepts(field.type)
    return (lambda v: v is None or accepts(v)) if field.nullable else (lambda v: v is not None and accepts(v))


def _list_of(item: pa.Field) -> Accepts:
    ok = _value_check(item)
    return lambda v: isinstance(v, (list, tuple)) and all(ok(x) for x in v)


def _map_of(key: pa.Field, item: pa.Field) -> Accepts:
    key_ok, item_ok = _value_check(key), _value_check(item)
    return lambda v: isinstance(v, dict) and all(key_ok(k) and item_ok(x) for k, x in v.items())


def _struct_of(fields: list[pa.Field]) -> Accepts:
    names = {f.name for f in fields}
    checks = [(f.name, _value_check(f)) for f in fields]
    return lambda v: isinstance(v, dict) and v.keys() == names and all(ok(v[n]) for n, ok in checks)


def _fast_types(t: pa.DataType, nullable: bool) -> frozenset[type]:
    """Python types whose every value a field of type ``t`` takes without a closer look (ints: range-checked
    per column)."""
    is_ = pa.types
    found: set[type] = {type(None)} if nullable else set()
    if is_.is_boolean(t):
        found.add(bool)
    elif is_.is_integer(t):
        found.add(int)
    elif is_.is_floating(t):
        found |= {int, float}
    elif is_.is_string(t) or is_.is_large_string(t):
        found.add(str)
    elif is_.is_binary(t) or is_.is_large_binary(t):
        found |= {bytes, bytearray}
    return frozenset(found)


class OutputField:
    """One output field: its name, type, full per-value check and the types that need none."""

    def __init__(self, field: pa.Field) -> None:
        self.name, self.type = field.name, field.type
        self.ok = _value_check(field)
        self.fast = _fast_types(field.type, field.nullable)
        self.int_range = _bounds(field.type) if pa.types.is_integer(field.type) else None

    def column_ok(self, values: list[Any]) -> bool:
        """Whether every value of the column is right, checked with few Python operations per value."""
        if not set(map(type, values)) <= self.fast:
            return all(map(self.ok, values))
        if self.int_range is not None:
            ints = [v for v in values if v is not None]
            return not ints or (self.int_range[0] <= min(ints) and max(ints) <= self.int_range[1])
        return True


def _bounds(t: pa.DataType) -> tuple[int, int]:
    bits = t.bit_width
    return (0, 2 ** bits - 1) if pa.types.is_unsigned_integer(t) else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)


@dataclass(frozen=True)
class PandasConversion:
    """The settings Spark's Python worker converts a yielded pandas DataFrame to Arrow with (a processor's
    ``pandas_conversion``; Spark reads them from the session): the session time zone, checked casts
    (``spark.sql.execution.pandas.convertToArrowArraySafely``), ints into decimal fields
    (``spark.sql.execution.pythonUDF.pandas.intToDecimalCoercionEnabled``) and columns assigned by name
    (``spark.sql.legacy.execution.pandas.groupedMap.assignColumnsByName``). The defaults are Spark 4's."""

    timezone: str = "UTC"
    safecheck: bool = True
    int_to_decimal: bool = False
    assign_columns_by_name: bool = True

    def array(self, values: Any, field: pa.Field) -> pa.Array:
        """``values`` (a DataFrame's column) as an Arrow array of ``field``'s type. Here with pyarrow alone;
        the Spark transport converts with the installed pyspark's own conversion
        (:class:`spate.spark.python_worker.PandasOutput`)."""
        return pa.Array.from_pandas(values, type=field.type, safe=self.safecheck)


def concat_column(values: list[Any]) -> Any:
    """One column from the parts' columns (numpy arrays concatenated, anything else as a list)."""
    import numpy as np

    if all(isinstance(v, np.ndarray) for v in values):
        return np.concatenate(values) if values else np.array([])
    return [x for v in values for x in v]


def joined_column(values: list[Any]) -> Any:
    """The parts' values of one column as one column when they share their dtype (numpy arrays, pandas Series),
    else None: Spark converts each DataFrame alone, and a column's conversion depends on its dtype."""
    import numpy as np

    if not values or len({getattr(v, "dtype", None) for v in values}) != 1:
        return None
    if all(isinstance(v, np.ndarray) for v in values):
        return np.concatenate(values)
    import pandas as pd

    if all(isinstance(v, pd.Series) for v in values):
        return pd.concat(values, ignore_index=True)
    return None


def has_struct(t: pa.DataType) -> bool:
    if pa.types.is_struct(t):
        return True
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return has_struct(t.value_type)
    return pa.types.is_map(t) and (has_struct(t.key_type) or has_struct(t.item_type))


def struct_gap(value: Any, t: pa.DataType) -> str | None:
    """The path of a struct field a dict in ``value`` lacks (Spark fills it with null), or None."""
    if value is None:
        return None
    if pa.types.is_struct(t):
        if not isinstance(value, dict):
            return None  # positional (a tuple or Row): the conversion checks its length
        for f in t:
            if f.name not in value:
                return f.name
            gap = struct_gap(value[f.name], f.type)
            if gap is not None:
                return f"{f.name}.{gap}"
        return None
    if pa.types.is_map(t):
        items = value.items() if isinstance(value, dict) else value
        return next((g for k, v in items for g in (struct_gap(k, t.key_type), struct_gap(v, t.item_type))
                     if g is not None), None)
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return next((g for v in value if (g := struct_gap(v, t.value_type)) is not None), None)
    return None


def spark_has_null(values: Any) -> bool:
    import pandas as pd

    return bool(pd.isna(pd.Series(values, dtype=object)).any()) if len(values) else False


def columns_table(columns: Any, error: Callable[[str], OutputError]) -> pa.Table:
    if isinstance(columns, pa.Table):
        return columns
    if isinstance(columns, pa.RecordBatch):
        return pa.Table.from_batches([columns])
    if isinstance(columns, Mapping):
        try:
            return pa.table({name: _column(values) for name, values in columns.items()})
        except (pa.ArrowException, TypeError, ValueError) as e:
            raise error(f"returned columns Arrow cannot build a table of ({e})") from e
    raise error(f"returned {type(columns).__name__}, not columns (a pyarrow Table or RecordBatch, or a mapping "
                "of column name to values)")


def _column(values: Any) -> Any:
    if isinstance(values, (pa.Array, pa.ChunkedArray)) or hasattr(values, "__array__"):
        return values
    return list(values)


def _numeric(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t)


def conform_to_schema(table: pa.Table, schema: pa.Schema, error: Callable[[str], OutputError]) -> pa.Table:
    """``table`` with exactly ``schema``'s columns and types: numbers cast without loss, nothing else cast."""
    names = set(table.column_names)
    if names != set(schema.names):
        extra, missing = sorted(names - set(schema.names)), sorted(set(schema.names) - names)
        what = f"column {extra[0]!r}, which is not in the output schema" if extra else f"no column {missing[0]!r}"
        raise error(f"returned {what} ({', '.join(schema.names)})")
    columns = []
    for f in schema:
        col = table.column(f.name)
        if col.type != f.type:
            if not (_numeric(col.type) and _numeric(f.type)) and not pa.types.is_null(col.type):
                raise error(f"returned column {f.name!r} of type {col.type}, which cannot be stored as {f.type}")
            try:
                col = col.cast(f.type, safe=True)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
                raise error(f"returned column {f.name!r} with values {f.type} cannot hold ({e})") from e
        if not f.nullable and col.null_count:
            raise error(f"returned nulls in column {f.name!r}, which the output schema makes non-nullable")
        columns.append(col)
    return pa.Table.from_arrays(columns, schema=schema)
