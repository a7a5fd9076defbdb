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
import types
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import pyarrow as pa

from spate.errors import OutputError, short_repr
from spate.runtime.output_values import (
    CONVERSION_ERRORS,
    OutputField,
    PandasConversion,
    arrow_takes,
    columns_table,
    concat_column,
    conform_to_schema,
    has_struct,
    joined_column,
    spark_has_null,
    struct_gap,
)
from spate.runtime.processor import Row
from spate.serde import packb_many

NO_KEY = object()  # end_batch runs for no key


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
        serializer: how outputs without a schema are stored ("msgpack": each value is checked to encode, so a
            ``set`` fails its batch naming the key and field, not a sink later).
    """

    def __init__(self, processor: object, schema: pa.Schema | None, serializer: str = "msgpack") -> None:
        self.processor_name = getattr(processor, "display_name", None) or type(processor).__qualname__
        self.conversion: PandasConversion = getattr(processor, "pandas_conversion", None) or PandasConversion()
        self.schema = schema
        self._check_msgpack = schema is None and serializer == "msgpack"
        self.names = frozenset(schema.names) if schema is not None else None
        self.fields = [OutputField(f) for f in schema] if schema is not None else []
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
        table = columns_table(columns, lambda problem: self._error(hook, NO_KEY, problem))
        if self.schema is None:
            self.rows.extend(table.to_pylist())
            return
        self._tables.append(conform_to_schema(table, self.schema, lambda problem: self._error(hook, NO_KEY, problem)))

    def finish(self) -> Outputs:
        """Check every row collected (an :class:`~spate.errors.OutputError` names the first wrong one) and
        return them."""
        rows = self.rows
        if self.schema is None and self._chunks:
            rows.extend(pa.table({n: concat_column([p[n] for p, _, _ in self._chunks]) for n in self._chunks[0][0]})
                        .to_pylist())
        if set(map(type, rows)) - {dict}:
            self._check_each(rows)
        if self.schema is None:
            if self._check_msgpack:
                self._check_encodable(rows)
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
            joined = joined_column(values)
            if joined is not None:
                with contextlib.suppress(Exception):
                    column = self.conversion.array(joined, f)
            if column is None:
                column = pa.chunked_array([self._part_array(cols[i], f, hook, key) for cols, hook, key in parts],
                                          type=f.type)
            if has_struct(f.type) or (not f.nullable and column.null_count):
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
        if has_struct(f.type):
            for values, hook, key in parts:
                for value in values:
                    gap = struct_gap(value, f.type)
                    if gap is not None:
                        raise self._error(hook, key, f"produced field {f.name!r} = {short_repr(value)} without "
                                                     f"struct field {gap!r}, which Spark would fill with null: "
                                                     "set it (None for a null)")
        if not f.nullable and column.null_count:
            hook, key = next(((h, k) for v, h, k in parts if spark_has_null(v)), ("process", NO_KEY))
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
        except CONVERSION_ERRORS:
            table = self._spark_rows_each()  # Spark converts each result alone: structs as dicts or as tuples
        for f in self.schema:
            column = table.column(f.name)
            if has_struct(f.type) or (not f.nullable and column.null_count):
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
            except CONVERSION_ERRORS as e:
                raise self._spark_value_error(rows, hook, key, e) from None
        return pa.concat_tables(tables)

    def _spark_value_error(self, rows: list[Row], hook: str, key: Any, error: Exception) -> OutputError:
        """The error naming the first value of ``rows`` Arrow (and so Spark) cannot store in its field."""
        assert self.schema is not None
        for f in self.schema:
            try:
                pa.array([r[f.name] for r in rows], type=f.type)
            except CONVERSION_ERRORS as e:
                value = next((v for v in (r[f.name] for r in rows) if not arrow_takes(v, f.type)), None)
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

    def _check_encodable(self, rows: list[Row]) -> None:
        """Every value of ``rows`` encodes with msgpack, or an error names the first that does not."""
        try:
            packb_many(rows)
            return
        except Exception:  # noqa: BLE001 - find the row and field
            pass
        for i, row in enumerate(rows):
            problem = _unencodable(row)
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


def _unencodable(row: Row) -> str | None:
    """What in ``row`` msgpack cannot store, or None."""
    try:
        packb_many((row,))
        return None
    except Exception as e:  # noqa: BLE001
        error: Exception = e
    for name, value in row.items():
        try:
            packb_many((value,))
        except Exception as e:  # noqa: BLE001
            return (f"produced field {name!r} = {short_repr(value)} of type {type(value).__qualname__}, which "
                    f"outputs cannot store ({e}): convert it (a list for a set, str for other objects) or give "
                    "an output_schema")
    return f"produced row {short_repr(row)}, which outputs cannot store ({error}): name fields with strings"
