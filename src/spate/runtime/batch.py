"""A subtask's micro-batch grouped by key, column by column, and the vectorized processor API over it.

:class:`KeyedBatch` holds a subtask's rows sorted by (key group, key) with one entry per distinct key: its
key, key group and the range of its rows. On Spark it is built from the task's Arrow record batch with Arrow's
sort, never a Python dict per row (:meth:`KeyedBatch.from_arrow`); in process from (key group, key, row)
triples (:meth:`KeyedBatch.from_rows`).

A :class:`~spate.runtime.processor.Processor` gets each key's rows as a :class:`KeyRows` view: a sequence of
dicts built only when the processor reads a row (``len(rows)`` builds none), with the key's column slices at
hand (:meth:`KeyRows.column`). A :class:`BatchProcessor` gets the whole batch at once and reads and writes
state for all its keys in bulk (:meth:`~spate.state.bulk.BulkValueState.get_many`).
"""

from __future__ import annotations

import datetime as _dt
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeAlias, overload

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spate.keygroups import normalize_key
from spate.runtime.fired_timers import FiredTimers
from spate.runtime.processor import Context, Processor, Row, to_epoch_ms
from spate.serde import encode_keys

KeyedRow = tuple[int, Any, Row]  # (key group, key, row)
_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.UTC)


class KeyRows(Sequence[Row]):
    """The rows of one key in a batch, as dicts of the stream's columns, built on first access (and kept, so a
    processor may change them). Behaves like the list of rows it stands for: ``len``, indexing, slicing,
    iteration, ``list(rows)``, ``rows + other``, ``==`` with a list; ``column(name)`` gives the key's values
    of one column without building rows."""

    __slots__ = ("_batch", "_start", "_stop", "_rows")

    def __init__(self, batch: KeyedBatch, start: int, stop: int) -> None:
        self._batch, self._start, self._stop = batch, start, stop
        self._rows: list[Row] | None = None

    @property
    def batch(self) -> KeyedBatch:
        """The batch these rows are part of."""
        return self._batch

    @property
    def start(self) -> int:
        """Index of the key's first row in :attr:`KeyedBatch.table`."""
        return self._start

    @property
    def stop(self) -> int:
        return self._stop

    def column(self, name: str) -> pa.Array:
        """This key's values of column ``name`` (a zero-copy Arrow slice)."""
        return self._batch.table.column(name).slice(self._start, self._stop - self._start).combine_chunks()

    def arrow(self) -> pa.Table:
        """This key's rows as an Arrow table (a zero-copy slice)."""
        return self._batch.table.slice(self._start, self._stop - self._start)

    @property
    def column_names(self) -> list[str]:
        return self._batch.table.column_names

    def tuples(self) -> Iterator[tuple[Any, ...]]:
        """This key's rows as tuples of the column values (in :attr:`column_names` order)."""
        return self._batch.tuples(self._start, self._stop)

    def pandas(self) -> Any:
        """This key's rows as a pandas DataFrame of its own (sharing the data of the batch's, made once per batch
        from Arrow; changing it does not warn, and touches no other key's rows)."""
        return self._batch.pandas().iloc[self._start:self._stop].copy(deep=False)

    def _materialized(self) -> list[Row]:
        if self._rows is None:
            self._rows = self._batch.dicts(self._start, self._stop)
        return self._rows

    def __len__(self) -> int:
        return self._stop - self._start if self._rows is None else len(self._rows)

    @overload
    def __getitem__(self, index: int) -> Row: ...

    @overload
    def __getitem__(self, index: slice) -> list[Row]: ...

    def __getitem__(self, index: int | slice) -> Row | list[Row]:
        return self._materialized()[index]

    def __iter__(self) -> Iterator[Row]:
        return iter(self._materialized())

    def __add__(self, other: Iterable[Row]) -> list[Row]:
        return [*self._materialized(), *other]

    def __radd__(self, other: Iterable[Row]) -> list[Row]:
        return [*other, *self._materialized()]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, KeyRows):
            other = other._materialized()
        return isinstance(other, list) and self._materialized() == other

    __hash__ = None  # type: ignore[assignment]  # mutable, like a list

    def __repr__(self) -> str:
        return repr(self._materialized())


class KeyedBatch:
    """One subtask's rows of a micro-batch, grouped by key: key ``i`` is ``keys[i]`` in key group
    ``key_groups[i]``, with rows ``offsets[i]:offsets[i + 1]`` of :attr:`table` (sorted by key group, then
    key). Keys are normalized as Spark groups them (``-0.0`` is ``0.0``, one NaN)."""

    def __init__(self, keys: list[Any], key_groups: list[int], offsets: np.ndarray, *,
                 table: pa.Table | None = None, rows: list[Row] | None = None) -> None:
        self.keys = keys
        self.key_groups = key_groups
        self.offsets = offsets
        self._table = table
        self._rows = rows  # from_rows: the rows in key order
        self._columns: list[list[Any]] | None = None
        self._encoded: list[bytes] | None = None
        self._pandas: Any = None
        self._bounds: list[int] | None = None  # the offsets as Python ints

    # -- building ---------------------------------------------------------------------------------------
    @staticmethod
    def empty() -> KeyedBatch:
        return KeyedBatch([], [], np.zeros(1, dtype=np.int64), rows=[])

    @staticmethod
    def from_rows(rows: Iterable[KeyedRow]) -> KeyedBatch:
        """From (key group, key, row) triples, in the order keys first appear."""
        groups: dict[tuple[int, Any], list[Row]] = {}
        for kg, key, row in rows:
            g = groups.get((kg, key))
            if g is None:
                groups[(kg, key)] = [row]
            else:
                g.append(row)
        if not all(normalize_key(key) is key for _kg, key in groups):  # rare: -0.0 or NaN keys
            merged: dict[tuple[int, Any], list[Row]] = {}
            for (kg, key), g in groups.items():
                merged.setdefault((kg, normalize_key(key)), []).extend(g)
            groups = merged
        ordered = [row for g in groups.values() for row in g]
        offsets = np.zeros(len(groups) + 1, dtype=np.int64)
        np.cumsum([len(g) for g in groups.values()], out=offsets[1:])
        return KeyedBatch([k for _, k in groups], [kg for kg, _ in groups], offsets, rows=ordered)

    @staticmethod
    def from_arrow(table: pa.Table, key_columns: Sequence[str], kg_column: str) -> KeyedBatch:
        """From an Arrow table of one subtask's rows with their key group in ``kg_column`` (which is dropped):
        sorted with Arrow, keys found where (key group, key) changes."""
        for name in key_columns:
            if pa.types.is_floating(table.schema.field(name).type):
                table = table.set_column(table.schema.get_field_index(name), name,
                                         _normalized_floats(table.column(name)))
        kg = table.column(kg_column)
        if len(table) == 0:
            return KeyedBatch([], [], np.zeros(1, dtype=np.int64), table=table.drop_columns([kg_column]))
        order = pc.sort_indices(table, sort_keys=[(kg_column, "ascending", "at_end")] +
                                [(c, "ascending", "at_end") for c in key_columns])
        table = table.take(order)
        kg = table.column(kg_column).combine_chunks()
        starts = _group_starts([kg] + [table.column(c).combine_chunks() for c in key_columns])
        first = pa.array(starts, type=pa.int64())
        key_values = [table.column(c).take(first).to_pylist() for c in key_columns]
        keys = key_values[0] if len(key_columns) == 1 else list(zip(*key_values, strict=True))
        offsets = np.append(starts, len(table)).astype(np.int64)
        return KeyedBatch(keys, kg.take(first).to_pylist(), offsets, table=table.drop_columns([kg_column]))

    def without_late_rows(self, column: str, watermark_ms: int) -> KeyedBatch:
        """This batch without the rows whose ``column`` (event time) is at or below ``watermark_ms``, as Spark
        drops late rows before a stateful operator (null event times are kept; keys left without rows go)."""
        keep = self._late_mask(column, watermark_ms)
        if keep.all():
            return self
        kept_per_key = np.add.reduceat(keep.astype(np.int64), self.offsets[:-1]) if len(self.keys) else keep[:0]
        alive = np.flatnonzero(kept_per_key)
        offsets = np.zeros(len(alive) + 1, dtype=np.int64)
        np.cumsum(kept_per_key[alive], out=offsets[1:])
        keys, kgs = [self.keys[i] for i in alive], [self.key_groups[i] for i in alive]
        if self._rows is not None:
            return KeyedBatch(keys, kgs, offsets, rows=[r for r, k in zip(self._rows, keep, strict=True) if k])
        return KeyedBatch(keys, kgs, offsets, table=self.table.filter(pa.array(keep)))

    def _late_mask(self, column: str, watermark_ms: int) -> np.ndarray:
        """True for the rows to keep: event time after ``watermark_ms`` (compared in microseconds for
        timestamps, as Spark does), or null."""
        if self._rows is not None:
            return np.array([r.get(column) is None or _micros(r[column]) > watermark_ms * 1000
                             for r in self._rows], dtype=bool)
        values = self.table.column(column)
        if pa.types.is_timestamp(values.type):
            values = pc.cast(pc.cast(values, pa.timestamp("us", values.type.tz)), pa.int64())
            bound = watermark_ms * 1000
        else:
            bound = watermark_ms
        late = pc.less_equal(values, pa.scalar(bound, values.type))
        return ~np.asarray(pc.fill_null(late, False).to_numpy(zero_copy_only=False), dtype=bool)

    # -- reading ----------------------------------------------------------------------------------------
    def __len__(self) -> int:
        """The number of distinct keys."""
        return len(self.keys)

    @property
    def num_rows(self) -> int:
        return int(self.offsets[-1])

    @property
    def counts(self) -> np.ndarray:
        """Rows per key (int64, aligned with :attr:`keys`)."""
        return np.diff(self.offsets)

    @property
    def table(self) -> pa.Table:
        """The rows, sorted by key group and key, as an Arrow table of the stream's columns."""
        if self._table is None:
            self._table = pa.Table.from_pylist(self._rows or [])
        return self._table

    @property
    def encoded_keys(self) -> list[bytes]:
        """Each key's canonical bytes (as state stores it), computed once."""
        if self._encoded is None:
            self._encoded = encode_keys(self.keys)
        return self._encoded

    def rows_of(self, i: int) -> Sequence[Row]:
        """The rows of key ``i``: the given dicts (:meth:`from_rows`) or a :class:`KeyRows` view."""
        bounds = self._bounds
        if bounds is None:
            bounds = self._bounds = self.offsets.tolist()
        if self._rows is not None:
            return self._rows[bounds[i]:bounds[i + 1]]
        return KeyRows(self, bounds[i], bounds[i + 1])

    def dicts(self, start: int, stop: int) -> list[Row]:
        """Rows ``start:stop`` as new dicts."""
        if self._rows is not None:
            return [dict(r) for r in self._rows[start:stop]]
        names = self.table.column_names
        return [dict(zip(names, values, strict=True)) for values in self.tuples(start, stop)]

    def tuples(self, start: int, stop: int) -> Iterator[tuple[Any, ...]]:
        """Rows ``start:stop`` as tuples of column values, from Python lists of the columns made once."""
        if self._columns is None:
            self._columns = [c.to_pylist() for c in self.table.columns]
        return zip(*(c[start:stop] for c in self._columns), strict=True)

    def pandas(self) -> Any:
        """The rows as one pandas DataFrame (made once per batch)."""
        if self._pandas is None:
            self._pandas = self.table.to_pandas()
        return self._pandas

    def max_event_time(self, column: str) -> int | None:
        """The largest value of ``column`` as epoch milliseconds (None: no rows, or all null)."""
        if self._rows is not None:
            times = [to_epoch_ms(r[column]) for r in self._rows if r.get(column) is not None]
            return max(times) if times else None
        values = self.table.column(column)
        if values.null_count == len(values):
            return None
        return to_epoch_ms(pc.max(values).as_py())


def _micros(value: Any) -> int:
    """An event time as epoch microseconds (int values are milliseconds)."""
    if isinstance(value, _dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=_dt.UTC)
        delta = value - _EPOCH
        return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    return to_epoch_ms(value) * 1000


def _normalized_floats(values: pa.ChunkedArray) -> pa.ChunkedArray:
    """``-0.0`` as ``0.0`` and every NaN as one NaN, as Spark groups floats."""
    values = pc.add(values, pa.scalar(0.0, values.type))  # -0.0 + 0.0 == 0.0
    return pc.if_else(pc.is_nan(values), pa.scalar(float("nan"), values.type), values)


def _group_starts(columns: list[pa.Array]) -> np.ndarray:
    """Indexes of the rows where any of the (sorted) ``columns`` differs from the row before: group starts."""
    n = len(columns[0])
    changed = np.zeros(n, dtype=bool)
    changed[0] = True
    if n > 1:
        for col in columns:
            changed[1:] |= _differs_from_previous(col)
    return np.flatnonzero(changed)


def _differs_from_previous(col: pa.Array) -> np.ndarray:
    a, b = col.slice(1), col.slice(0, len(col) - 1)
    differ = pc.not_equal(a, b)
    if pa.types.is_floating(col.type):
        differ = pc.and_(differ, pc.invert(pc.and_(pc.is_nan(a), pc.is_nan(b))))
    null_a, null_b = pc.is_null(a), pc.is_null(b)
    differ = pc.if_else(pc.or_(null_a, null_b), pc.not_equal(null_a, null_b), differ)
    return differ.to_numpy(zero_copy_only=False)


Columns: TypeAlias = pa.Table | pa.RecordBatch | Mapping[str, Any]


class BatchProcessor(ABC):
    """A processor that handles a subtask's whole micro-batch at once: no Python call per key or row.

    Use it when the work per key is arithmetic over columns (counts, sums, last values, deduplication):
    ``process_batch`` reads the state of every key of the batch with one call (``ctx.bulk_state(descriptor)``
    then :meth:`~spate.state.bulk.BulkValueState.get_many`), computes with numpy or Arrow, writes with
    :meth:`~spate.state.bulk.BulkValueState.put_many` and returns the outputs as columns. Checkpoints, the
    changelog, rescaling and operator state behave exactly as for a :class:`~spate.runtime.processor.Processor`,
    and the state is the same: the two APIs can read each other's state. Timers too are registered in bulk
    (``ctx.bulk_timers().register_many(keys, timestamps)``) and come due together in :meth:`on_timers`.
    """

    def open(self, ctx: Context) -> None:
        """Obtain state here: ``self.count = ctx.bulk_state(ValueStateDescriptor("count", default=0))``."""

    @abstractmethod
    def process_batch(self, batch: KeyedBatch, ctx: Context) -> Columns | None:
        """Handle the batch; return the output rows as columns: a ``pyarrow`` table or record batch, or a
        mapping of column name to values (list, numpy array or Arrow array), or None for no rows."""

    def on_timers(self, timers: FiredTimers, ctx: Context) -> Columns | None:
        """Every timer of one time domain (``timers.domain``, also ``ctx.timer_domain``) due in this batch,
        after :meth:`process_batch`: processing-time timers at the batch's processing time, then event-time
        timers at its watermark. They are removed before the call; timers registered here that are already due
        come in a further call. Returns output columns as :meth:`process_batch` does."""
        return None

    def end_batch(self, ctx: Context) -> Iterable[Row] | None:
        """Called once per subtask after :meth:`process_batch` and :meth:`on_timers` (operator state goes
        here)."""
        return None

    def close(self) -> None:
        """Release resources; state is already checkpointed."""


def uses_timers(processor: Any) -> bool:
    """Whether a processor (instance or class) may have timers: a per-key one that declares
    ``may_have_timers = True``, or declares nothing and overrides :meth:`~spate.runtime.processor.Processor.on_timer`
    (a timer of one that does not would fire into a handler that does nothing) or asks for a batch whenever the
    watermark moves (``idle_batch_on_watermark_move``), and a :class:`BatchProcessor` that overrides
    :meth:`~BatchProcessor.on_timers`."""
    cls = processor if isinstance(processor, type) else type(processor)
    if issubclass(cls, BatchProcessor):
        return cls.on_timers is not BatchProcessor.on_timers
    declared = getattr(processor, "may_have_timers", None)
    if declared is not None:
        return bool(declared)
    if not issubclass(cls, Processor):  # a factory: what it makes is not known here
        return True
    return cls.on_timer is not Processor.on_timer or bool(cls.idle_batch_on_watermark_move)


AnyProcessor: TypeAlias = Processor | BatchProcessor  # what a subtask runs: per key, or the whole batch at once
ProcessorFactory: TypeAlias = Callable[[], AnyProcessor]  # a new processor for each subtask's live state


__all__ = ["BatchProcessor", "FiredTimers", "KeyRows", "KeyedBatch", "uses_timers"]
