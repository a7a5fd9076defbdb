"""A processor's outputs, checked when its batch is done (column by column; a wrong row is then found and
named), so a wrong row fails its batch before the checkpoint can commit (instead of reaching the sink as
nulls, or as a dict's keys), and turned into an Arrow table of the output schema.

A result of ``process``, ``on_timer`` or ``end_batch`` must be an iterable of rows (``None``: no rows); a
dict *returned* instead of yielded is refused. A row is a dict. With an output schema (a ``pyarrow.Schema``;
Spark's ``StructType`` converted to Arrow) a row must have exactly the schema's fields, each value of a type
Spark's Arrow conversion stores without loss: ``int`` is accepted for floating point and decimal fields,
anything else must be of the field's own kind (no ``bool`` for numbers, no ``float`` for integers, no
``str`` for numbers). Tuples and ``pyspark.sql.Row`` objects are refused: their fields are positional, and
Spark turns mismatched ones into nulls.

Outputs of a ``pyspark`` ``StatefulProcessor`` (through :mod:`spate.spark.adapter`) are converted exactly as
Spark converts them, so they get Spark's values or fail where Spark fails: DataFrames (:class:`ColumnChunk`)
with Spark's own pandas-to-Arrow conversion and the session's settings for it (:class:`PandasConversion`:
columns by name, extra ones ignored; Arrow casts checked as with
``spark.sql.execution.pandas.convertToArrowArraySafely``, which follows ANSI mode, on in Spark 4), Rows
(:class:`SparkRows`) with ``pyarrow``'s ``from_pylist`` as ``transformWithState`` does. One difference on
purpose: a missing column or field (also inside a struct), which Spark's Row path and nested structs fill with
nulls, fails the batch.
"""

from __future__ import annotations

import bisect
import contextlib
import datetime as _dt
import decimal
import types
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from spate.errors import OutputError, short_repr
from spate.runtime.processor import Row

NO_KEY = object()  # end_batch runs for no key
_CONVERSION_ERRORS = (pa.ArrowException, TypeError, ValueError, OverflowError)
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


class _Field:
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


class Outputs:
    """A subtask's output rows of one batch: as dicts (:attr:`rows`) and, with an output schema, as an Arrow
    table (:attr:`table`); each form is built from the other on first use."""

    def __init__(self, rows: list[Row] | None = None, table: pa.Table | None = None) -> None:
        self._rows, self._table = rows, table

    def __len__(self) -> int:
        return len(self._rows) if self._rows is not None else (self._table.num_rows if self._table else 0)

    @property
    def rows(self) -> list[Row]:
        if self._rows is None:
            self._rows = self._table.to_pylist() if self._table is not None else []
        return self._rows

    @property
    def table(self) -> pa.Table | None:
        """The rows as an Arrow table of the output schema (None without a schema)."""
        return self._table


class ColumnChunk:
    """Output rows of one result as columns: parts, each a mapping of column name to values (numpy arrays or
    lists of equal length), as an adapter turns DataFrames into them without a dict per row."""

    def __init__(self, parts: list[Mapping[str, Any]], refused: Any = None) -> None:
        self.parts = parts
        self.refused = refused  # an item that was not columns (the output buffer names it)

    def __iter__(self) -> Iterator[Row]:
        """The rows as dicts (an :class:`OutputBuffer` takes the columns as they are instead)."""
        for part in self.parts:
            names = list(part)
            yield from (dict(zip(names, values, strict=True)) for values in zip(*part.values(), strict=True))

    @staticmethod
    def of(items: Iterable[Any], to_columns: Callable[[Any], Mapping[str, Any] | None]) -> ColumnChunk:
        """The columns of ``items`` (``to_columns``: None for an item that is not columns, which stops here)."""
        parts: list[Mapping[str, Any]] = []
        for item in items:
            columns = to_columns(item)
            if columns is None:
                return ColumnChunk(parts, refused=item)
            parts.append(columns)
        return ColumnChunk(parts)


class SparkRows(list):
    """Rows a ``transformWithState`` processor yielded, as dicts (``Row.asDict(recursive=True)``), converted as
    Spark converts them: ``from_pylist`` on the output schema."""

    refused: Any = None  # an item that was not a Row with named fields (the output buffer names it)


_ROW_CONTAINERS = (list, tuple, types.GeneratorType)  # results that are certainly iterables of rows


class OutputBuffer:
    """Collects the rows one processor produces in a batch and checks them against ``schema`` (None: rows need
    only be dicts) column by column when the batch is done (:meth:`finish`), so a wrong row fails its batch
    before the checkpoint. Each result is checked as it comes for being rows at all (not a dict or a scalar).

    Args:
        processor: the processor (named in errors).
        schema: the output schema, or None.
    """

    def __init__(self, processor: object, schema: pa.Schema | None) -> None:
        self.processor_name = getattr(processor, "display_name", None) or type(processor).__qualname__
        self.conversion: PandasConversion = getattr(processor, "pandas_conversion", None) or PandasConversion()
        self.schema = schema
        self.names = frozenset(schema.names) if schema is not None else None
        self.fields = [_Field(f) for f in schema] if schema is not None else []
        self.rows: list[Row] = []
        self._starts: list[int] = []  # rows produced before each result
        self._origins: list[tuple[str, Any]] = []  # (hook, key) of each result
        self._tables: list[pa.Table] = []  # columns a BatchProcessor returned, already checked
        self._chunks: list[tuple[Mapping[str, Any], str, Any]] = []  # (columns, hook, key) of ColumnChunks
        self._spark_rows: list[tuple[SparkRows, str, Any]] = []  # (rows, hook, key) of SparkRows

    def extend(self, produced: Iterable[Row] | ColumnChunk | None, hook: str, key: Any = NO_KEY) -> None:
        """Add the rows of ``produced`` (a result of ``hook`` for ``key``)."""
        if produced is None:
            return
        if isinstance(produced, ColumnChunk):
            self._add_chunk(produced, hook, key)
            return
        if isinstance(produced, SparkRows) and produced.refused is not None:
            item = produced.refused
            raise self._error(hook, key, f"yielded {type(item).__name__} {short_repr(item)}, not a Row with named "
                                         f"fields: yield Row(name=value, ...){self._fields_hint()}")
        if isinstance(produced, SparkRows) and self.schema is not None:
            if produced:
                self._spark_rows.append((produced, hook, key))
            return
        if type(produced) not in _ROW_CONTAINERS and (isinstance(produced, (dict, str, bytes))
                                            or not isinstance(produced, Iterable)):
            what = "a dict, not rows: yield it (or return a list of dicts)" if isinstance(produced, dict) else \
                f"{type(produced).__name__} {short_repr(produced)}, not an iterable of rows (dicts)"
            raise self._error(hook, key, f"returned {what}")
        self._starts.append(len(self.rows))
        self._origins.append((hook, key))
        self.rows.extend(produced)

    def _add_chunk(self, chunk: ColumnChunk, hook: str, key: Any) -> None:
        if chunk.refused is not None:
            item = chunk.refused
            raise self._error(hook, key, f"yielded {type(item).__name__} {short_repr(item)}, not a pandas DataFrame")
        self._chunks.extend((part, hook, key) for part in chunk.parts)

    def add_columns(self, columns: Any, hook: str) -> None:
        """Add the rows a ``BatchProcessor`` returned as columns (a table, a record batch or a mapping of
        name to values), converted to the output schema: only lossless conversions between number types."""
        if columns is None:
            return
        table = _as_table(columns, lambda problem: self._error(hook, NO_KEY, problem))
        if self.schema is None:
            self.rows.extend(table.to_pylist())
            return
        self._tables.append(_conform(table, self.schema, lambda problem: self._error(hook, NO_KEY, problem)))

    def finish(self) -> Outputs:
        """Check every row collected (an :class:`~spate.errors.OutputError` names the first wrong one) and
        return them."""
        rows = self.rows
        if self.schema is None and self._chunks:
            rows.extend(pa.table({n: _concat([p[n] for p, _, _ in self._chunks]) for n in self._chunks[0][0]})
                        .to_pylist())
        if set(map(type, rows)) - {dict}:
            self._check_each(rows)
        if self.schema is None:
            return Outputs(rows)
        names = self.names
        if not all(r.keys() == names for r in rows):
            self._check_each(rows)
        columns = []
        for f in self.fields:
            values = [r[f.name] for r in rows]
            if not f.column_ok(values):
                self._check_each(rows)
            columns.append(pa.array(values, type=f.type))
        table = pa.Table.from_arrays(columns, schema=self.schema)
        more = [*self._tables, *([self._chunk_table()] if self._chunks else []),
                *([self._spark_rows_table()] if self._spark_rows else [])]
        if more:
            return Outputs(None, pa.concat_tables([table, *more]))
        return Outputs(rows, table)

    def _chunk_table(self) -> pa.Table:
        """The column chunks (DataFrames) as one table of the output schema, converted column by column as Spark
        converts a DataFrame: all parts at once, or part by part where they differ in dtype or fail together."""
        assert self.schema is not None
        parts = [(self._assigned(part, hook, key), hook, key) for part, hook, key in self._chunks]
        columns = []
        for i, f in enumerate(self.schema):
            values = [cols[i] for cols, _, _ in parts]
            column = None
            joined = _joined(values)
            if joined is not None:
                with contextlib.suppress(Exception):
                    column = self.conversion.array(joined, f)
            if column is None:
                column = pa.chunked_array([self._part_array(cols[i], f, hook, key) for cols, hook, key in parts],
                                          type=f.type)
            if _has_struct(f.type) or (not f.nullable and column.null_count):
                self._check_column(column, f, [(cols[i], hook, key) for cols, hook, key in parts])
            columns.append(column)
        return pa.Table.from_arrays(columns, schema=self.schema)

    def _assigned(self, part: Mapping[Any, Any], hook: str, key: Any) -> list[Any]:
        """A DataFrame's columns in schema order, assigned as Spark assigns them: by name when any column name is
        a string (other columns ignored) and the session assigns by name, else by position."""
        assert self.schema is not None
        names = self.schema.names
        if self.conversion.assign_columns_by_name and any(isinstance(label, str) for label in part):
            missing = [n for n in names if n not in part]
            if missing:
                raise self._error(hook, key, self._missing_column_problem(part, missing[0]))
            return [part[n] for n in names]
        if len(part) < len(names):
            raise self._error(hook, key, f"yielded a DataFrame with {len(part)} unnamed columns for the "
                                         f"{len(names)} of the output schema{self._fields_hint()}: name them")
        return list(part.values())[:len(names)]

    def _missing_column_problem(self, part: Mapping[Any, Any], missing: str) -> str:
        extra = [str(label) for label in part if label not in (self.names or ())]
        if extra:
            return (f"produced field {extra[0]!r}, which is not in the output schema{self._fields_hint()}, and no "
                    f"column {missing!r}: rename it")
        return f"yielded a DataFrame without column {missing!r}{self._fields_hint()}: add it (None for nulls)"

    def _part_array(self, values: Any, f: pa.Field, hook: str, key: Any) -> pa.Array:
        try:
            return self.conversion.array(values, f)
        except Exception as e:  # whatever Spark's conversion raises fails the batch on Spark too
            said = str(e).split(" It can be caused by")[0]  # not Spark's hint at a Spark conf
            raise self._error(hook, key, f"produced column {f.name!r} that cannot be stored as {f.type}, as on "
                                         f"Spark ({type(e).__name__}: {said}); convert it before yielding it") from e

    def _check_column(self, column: Any, f: pa.Field, parts: list[tuple[Any, str, Any]]) -> None:
        """Refuse what Spark would turn into nulls (dicts without a struct field) or nulls the schema forbids."""
        if _has_struct(f.type):
            for values, hook, key in parts:
                for value in values:
                    gap = _struct_gap(value, f.type)
                    if gap is not None:
                        raise self._error(hook, key, f"produced field {f.name!r} = {short_repr(value)} without "
                                                     f"struct field {gap!r}, which Spark would fill with null: "
                                                     "set it (None for a null)")
        if not f.nullable and column.null_count:
            hook, key = next(((h, k) for v, h, k in parts if _spark_has_null(v)), ("process", NO_KEY))
            raise self._error(hook, key, f"produced nulls in field {f.name!r}, which the output schema makes "
                                         "non-nullable")

    def _spark_rows_table(self) -> pa.Table:
        """The Rows of ``transformWithState`` processors as one table of the output schema, converted as Spark
        converts them (``from_pylist``), except that a row missing a field fails instead of getting a null."""
        assert self.schema is not None and self.names is not None
        names = self.names
        for rows, hook, key in self._spark_rows:
            if set(map(type, rows)) - {dict} or not all(names <= r.keys() for r in rows):
                raise self._error(hook, key, self._spark_row_problem(rows))
        every = [r for rows, _, _ in self._spark_rows for r in rows]
        try:
            table = pa.Table.from_pylist(every, schema=self.schema)
        except _CONVERSION_ERRORS:
            table = self._spark_rows_each()  # Spark converts each result alone: structs as dicts or as tuples
        for f in self.schema:
            column = table.column(f.name)
            if _has_struct(f.type) or (not f.nullable and column.null_count):
                self._check_column(column, f, [([r[f.name] for r in rows], hook, key)
                                               for rows, hook, key in self._spark_rows])
        return table

    def _spark_row_problem(self, rows: list[Any]) -> str:
        assert self.names is not None
        for row in rows:
            if not isinstance(row, dict):
                return f"produced a {type(row).__name__} row {short_repr(row)}, not a dict"
            missing = sorted(self.names - row.keys())
            if missing:
                return (f"produced a row without field {missing[0]!r}{self._fields_hint()}, which Spark would fill "
                        f"with null: set it (None for a null): {short_repr(row)}")
        raise AssertionError("no wrong row")

    def _spark_rows_each(self) -> pa.Table:
        """The Rows converted result by result, as Spark converts them; the first that fails is named."""
        tables = []
        for rows, hook, key in self._spark_rows:
            try:
                tables.append(pa.Table.from_pylist(rows, schema=self.schema))
            except _CONVERSION_ERRORS as e:
                raise self._spark_value_error(rows, hook, key, e) from None
        return pa.concat_tables(tables)

    def _spark_value_error(self, rows: list[Row], hook: str, key: Any, error: Exception) -> OutputError:
        """The error naming the first value of ``rows`` Arrow (and so Spark) cannot store in its field."""
        assert self.schema is not None
        for f in self.schema:
            try:
                pa.array([r[f.name] for r in rows], type=f.type)
            except _CONVERSION_ERRORS as e:
                value = next((v for v in (r[f.name] for r in rows) if not _arrow_takes(v, f.type)), None)
                return self._error(hook, key, f"produced field {f.name!r} = {short_repr(value)} "
                                              f"({type(value).__name__}), which cannot be stored as {f.type}, as "
                                              f"on Spark ({e}): convert it before yielding it")
        return self._error(hook, key, f"produced rows Arrow cannot convert, as on Spark ({error})")

    def _check_each(self, rows: list[Row]) -> None:
        """The slow path: find the first wrong row and raise for it, naming the hook and key that made it."""
        for i, row in enumerate(rows):
            problem = self._problem(row)
            if problem is not None:
                hook, key = self._origins[bisect.bisect_right(self._starts, i) - 1]
                raise self._error(hook, key, problem)

    def _problem(self, row: Any) -> str | None:
        if not isinstance(row, dict):
            return f"produced a {type(row).__name__} row {short_repr(row)}: a row is a dict of field name to " \
                   f"value{self._fields_hint()}"
        if self.names is None:
            return None
        if row.keys() != self.names:
            return self._field_names_problem(row)
        for f in self.fields:
            if not f.ok(row[f.name]):
                value = row[f.name]
                return (f"field {f.name!r} = {short_repr(value)} ({type(value).__name__}) cannot be stored as "
                        f"{f.type} in row {short_repr(row)}")
        return None

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


def _concat(values: list[Any]) -> Any:
    """One column from the parts' columns (numpy arrays concatenated, anything else as a list)."""
    import numpy as np

    if all(isinstance(v, np.ndarray) for v in values):
        return np.concatenate(values) if values else np.array([])
    return [x for v in values for x in v]


def _joined(values: list[Any]) -> Any:
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


def _has_struct(t: pa.DataType) -> bool:
    if pa.types.is_struct(t):
        return True
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return _has_struct(t.value_type)
    return pa.types.is_map(t) and (_has_struct(t.key_type) or _has_struct(t.item_type))


def _struct_gap(value: Any, t: pa.DataType) -> str | None:
    """The path of a struct field a dict in ``value`` lacks (Spark fills it with null), or None."""
    if value is None:
        return None
    if pa.types.is_struct(t):
        if not isinstance(value, dict):
            return None  # positional (a tuple or Row): the conversion checks its length
        for f in t:
            if f.name not in value:
                return f.name
            gap = _struct_gap(value[f.name], f.type)
            if gap is not None:
                return f"{f.name}.{gap}"
        return None
    if pa.types.is_map(t):
        items = value.items() if isinstance(value, dict) else value
        return next((g for k, v in items for g in (_struct_gap(k, t.key_type), _struct_gap(v, t.item_type))
                     if g is not None), None)
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return next((g for v in value if (g := _struct_gap(v, t.value_type)) is not None), None)
    return None


def _spark_has_null(values: Any) -> bool:
    import pandas as pd

    return bool(pd.isna(pd.Series(values, dtype=object)).any()) if len(values) else False


def _as_table(columns: Any, error: Callable[[str], OutputError]) -> pa.Table:
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


def _conform(table: pa.Table, schema: pa.Schema, error: Callable[[str], OutputError]) -> pa.Table:
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
