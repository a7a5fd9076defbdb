"""A processor's outputs, checked as they are produced, so a wrong row fails its batch before the checkpoint
can commit (instead of reaching the sink as nulls, or as a dict's keys).

A result of ``process``, ``on_timer`` or ``end_batch`` must be an iterable of rows (``None``: no rows); a
dict *returned* instead of yielded is refused. A row is a dict. With an output schema (a ``pyarrow.Schema``;
Spark's ``StructType`` converted to Arrow) a row must have exactly the schema's fields, each value of a type
Spark's Arrow conversion stores without loss: ``int`` is accepted for floating point and decimal fields,
anything else must be of the field's own kind (no ``bool`` for numbers, no ``float`` for integers, no
``str`` for numbers). Tuples and ``pyspark.sql.Row`` objects are refused: their fields are positional, and
Spark turns mismatched ones into nulls.
"""

from __future__ import annotations

import datetime as _dt
import decimal
from collections.abc import Callable, Iterable
from typing import Any

import pyarrow as pa

from spate.errors import OutputError, short_repr
from spate.runtime.processor import Row

NO_KEY = object()  # end_batch runs for no key
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
    return lambda v: _arrow_takes(v, t)


def _arrow_takes(value: Any, t: pa.DataType) -> bool:
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


class OutputCheck:
    """Checks the rows one processor produces in a batch against ``schema`` (None: rows need only be dicts).

    Args:
        processor: the processor (named in errors).
        schema: the output schema, or None.
    """

    def __init__(self, processor: object, schema: pa.Schema | None) -> None:
        self.processor_name = getattr(processor, "display_name", None) or type(processor).__qualname__
        self.schema = schema
        self.names = frozenset(schema.names) if schema is not None else None
        self.fields = [(f.name, _value_check(f), f.type) for f in schema] if schema is not None else []

    def extend(self, out: list[Row], produced: Iterable[Row] | None, hook: str, key: Any = NO_KEY) -> None:
        """Append the rows of ``produced`` (a result of ``hook`` for ``key``) to ``out``, checking each."""
        if produced is None:
            return
        if isinstance(produced, (dict, str, bytes)) or not isinstance(produced, Iterable):
            what = "a dict, not rows: yield it (or return a list of dicts)" if isinstance(produced, dict) else \
                f"{type(produced).__name__} {short_repr(produced)}, not an iterable of rows (dicts)"
            raise self._error(hook, key, f"returned {what}")
        for row in produced:
            self._check(row, hook, key)
            out.append(row)

    def _check(self, row: Any, hook: str, key: Any) -> None:
        if not isinstance(row, dict):
            raise self._error(hook, key, f"produced a {type(row).__name__} row {short_repr(row)}: a row is a dict "
                                         f"of field name to value{self._fields_hint()}")
        if self.names is None:
            return
        if row.keys() != self.names:
            raise self._error(hook, key, self._field_names_problem(row))
        for name, ok, arrow_type in self.fields:
            if not ok(row[name]):
                value = row[name]
                raise self._error(hook, key, f"field {name!r} = {short_repr(value)} ({type(value).__name__}) "
                                             f"cannot be stored as {arrow_type} in row {short_repr(row)}")

    def _field_names_problem(self, row: Row) -> str:
        assert self.names is not None
        extra = sorted(map(str, row.keys() - self.names))
        missing = sorted(self.names - row.keys())
        if extra:
            return f"produced field {extra[0]!r}, which is not in the output schema{self._fields_hint()}"
        return f"produced a row without field {missing[0]!r}{self._fields_hint()}: {short_repr(row)}"

    def _fields_hint(self) -> str:
        return f" ({', '.join(self.schema.names)})" if self.schema is not None else ""

    def _error(self, hook: str, key: Any, problem: str) -> OutputError:
        where = f"{self.processor_name}.{hook}" + ("" if key is NO_KEY else f" for key {short_repr(key)}")
        return OutputError(f"{where} {problem}; the batch fails and its checkpoint is not taken")
