"""Run an unchanged ``pyspark.sql.streaming.StatefulProcessor`` (the ``transformWithStateInPandas`` /
``transformWithState`` API) on spate with Spark's semantics: its value, list and map states (with TTL and
schemas, :mod:`spate.spark.tws_handle`) become spate keyed state, its timers spate timers, and its handle
calls local reads and writes instead of round trips to the JVM.

What Spark does and the adapter does the same way:

- each batch of a subtask runs like a Spark task: a fresh copy of the processor, ``init`` with a new handle,
  the keys' input rows as the installed Spark's Python worker hands them over (:mod:`spate.spark.python_worker`:
  pandas chunks of at most ``maxRecordsPerBatch`` rows, timestamps naive in the session time zone; ``Row``
  datetimes aware in it), then the due timers (each still listed while its handler runs, deleted after it),
  then ``close``; yielded DataFrames are converted with the session's settings;
- ``TimerValues``: ``(-1, -1)`` in timeMode ``None``; the batch's time and ``-1`` in ``ProcessingTime``; the
  batch's time and the watermark in ``EventTime``, where the watermark is 0 until event times raise it;
- in ``EventTime``, input rows at or below the previous batch's watermark are dropped as late before they
  reach the processor; event-time timers at or below the watermark fire after the input;
- state values come back as Spark returns them (tuples, nested structs as ``Row``) and evolve across
  restarts as Spark's do (:mod:`spate.spark.state_schema`); ``deleteIfExists`` removes a state for every key.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime as _dt
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.errors import PySparkValueError

from spate.errors import ProcessorError, SettingError, SparkErrorClass, SpateError
from spate.runtime.batch import KeyedBatch, KeyRows
from spate.runtime.output_values import PandasConversion
from spate.runtime.outputs import ColumnChunk, SparkRows
from spate.runtime.processor import Context, Processor, Row
from spate.spark.python_worker import PythonWorkerConf, in_session_zone, pandas_chunks, pandas_input
from spate.spark.tws_handle import StatefulProcessorHandle, StateSchemas

TIME_MODES = ("None", "ProcessingTime", "EventTime")


class UnknownTimeModeError(SparkErrorClass, SpateError, PySparkValueError):
    """A time mode Spark does not know: Spark's error class (``STATEFUL_PROCESSOR_UNKNOWN_TIME_MODE``) and message.
    A ``ValueError``."""

    def __init__(self, time_mode: Any) -> None:
        PySparkValueError.__init__(
            self, message=f"[STATEFUL_PROCESSOR_UNKNOWN_TIME_MODE] Unknown time mode {time_mode}. Accepted timeMode "
                          f"modes are 'none', 'processingTime', 'eventTime' (spate: time_mode={time_mode!r}; "
                          f"give one of {', '.join(map(repr, TIME_MODES))}, in any case, as on Spark)")


def time_mode_of(time_mode: Any) -> str:
    """``time_mode`` as spate names it (Spark reads it in any case: ``"processingtime"`` is ``"ProcessingTime"``);
    raises :class:`UnknownTimeModeError` for any other."""
    canonical = {m.lower(): m for m in TIME_MODES}.get(time_mode.lower()) if isinstance(time_mode, str) else None
    if canonical is None:
        raise UnknownTimeModeError(time_mode)
    return canonical
FLAVOURS = ("pandas", "row")


class TimerValues:
    """``pyspark.sql.streaming.stateful_processor.TimerValues`` on spate's clock."""

    def __init__(self, processing_time_ms: int, watermark_ms: int) -> None:
        self._now, self._watermark = processing_time_ms, watermark_ms

    def getCurrentProcessingTimeInMs(self) -> int:  # noqa: N802 - Spark's API
        return self._now

    def getCurrentWatermarkInMs(self) -> int:  # noqa: N802
        return self._watermark


class ExpiredTimerInfo:
    def __init__(self, expiry_ms: int) -> None:
        self._expiry = expiry_ms

    def getExpiryTimeInMs(self) -> int:  # noqa: N802
        return self._expiry


class StatefulProcessorAdapter(Processor):
    """A spate :class:`Processor` running a ``pyspark`` ``StatefulProcessor`` as Spark's transformWithState runs it.

    Args:
        processor: the ``StatefulProcessor`` (copied per subtask and batch, as Spark deserializes it per task).
        flavour: ``"pandas"`` (``transformWithStateInPandas``: rows arrive as pandas DataFrames, outputs are
            DataFrames) or ``"row"`` (``transformWithState``: ``Row`` in and out).
        time_mode: ``"None"``, ``"ProcessingTime"`` or ``"EventTime"``.
        worker_conf: the settings of Spark's Python worker (:meth:`PythonWorkerConf.of_session` reads the
            session's: its time zone, chunk limits, output conversion); Spark 4's defaults if not given.
        max_records_per_batch: pandas flavour: the most rows in one DataFrame ``handleInputRows`` receives
            (overrides ``worker_conf``'s ``spark.sql.execution.arrow.maxRecordsPerBatch``).
    """

    timers_deleted_after_firing = True  # Spark deletes a timer after its handler returned

    def __init__(self, processor: Any, flavour: str = "pandas", time_mode: str = "None",
                 worker_conf: PythonWorkerConf | None = None, max_records_per_batch: int | None = None) -> None:
        if flavour not in FLAVOURS:
            raise SettingError(f"flavour must be one of {FLAVOURS}, got {flavour!r}")
        time_mode = time_mode_of(time_mode)
        conf = worker_conf or PythonWorkerConf()
        if max_records_per_batch is not None:
            if not isinstance(max_records_per_batch, int) or max_records_per_batch <= 0:
                raise SettingError(f"max_records_per_batch must be a positive int, got {max_records_per_batch!r}")
            conf = dataclasses.replace(conf, max_records_per_batch=max_records_per_batch)
        self.processor, self.flavour, self.time_mode = processor, flavour, time_mode
        self.worker_conf = conf
        self._converted: tuple[KeyedBatch, Any, float] | None = None  # this batch's rows as Spark converts them
        self.watermark_floor_ms = 0 if time_mode == "EventTime" else None
        self.drop_late_rows = time_mode == "EventTime"
        self.idle_batch_on_watermark_move = time_mode == "EventTime"  # Spark's no-data batch when it moved
        self.may_have_timers = time_mode != "None"  # no timers (and no TTL) in time mode None, as on Spark
        self._schemas: StateSchemas | None = None
        self._running: Any = None  # this batch's copy of the processor, after its init
        self._opened = False  # open began the first batch's copy
        self.handle: StatefulProcessorHandle | None = None

    @property
    def max_records_per_batch(self) -> int:
        return self.worker_conf.max_records_per_batch

    @property
    def pandas_conversion(self) -> PandasConversion:
        """How yielded DataFrames become Arrow: the installed pyspark's conversion with the session's settings."""
        return self.worker_conf.output

    @property
    def display_name(self) -> str:
        """The wrapped ``StatefulProcessor``'s class, as errors name it."""
        return type(self.processor).__qualname__

    def open(self, ctx: Context) -> None:
        self._schemas = StateSchemas(ctx)
        self._begin(ctx)  # declares the states now: a schema that cannot evolve fails before any input
        self._opened = True

    def start_batch(self, ctx: Context) -> None:
        """A new task's processor: the one ``open`` began, else a fresh one (also after a failed batch, whose
        copy is dropped)."""
        if self._opened:
            self._opened = False
            return
        self.close()
        self._begin(ctx)

    def _begin(self, ctx: Context) -> None:
        assert self._schemas is not None
        self.handle = StatefulProcessorHandle(ctx, self.time_mode, self._schemas)
        self._running = copy.deepcopy(self.processor)
        self._running.init(self.handle)

    def process(self, key: Any, rows: Sequence[Row], ctx: Context) -> Iterable[Row] | None:
        return self._outputs(self._running.handleInputRows(self._spark_key(key), self._inputs(rows),
                                                           self._timers(ctx)))

    def process_initial(self, key: Any, rows: Sequence[Row], ctx: Context) -> Iterable[Row] | None:
        """``handleInitialState`` per DataFrame chunk (pandas) or per ``Row``, as Spark calls it."""
        handler = getattr(self._running, "handleInitialState", None)
        if handler is None:
            raise ProcessorError(f"{self.display_name} has no handleInitialState, but the query was given an initial "
                                 "state")
        spark_key, timers = self._spark_key(key), self._timers(ctx)
        for item in self._inputs(rows):
            handler(spark_key, item, timers)
        return None

    def on_timer(self, key: Any, timestamp_ms: int, ctx: Context) -> Iterable[Row] | None:
        handler = getattr(self._running, "handleExpiredTimer", None)
        if handler is None:
            return None
        return self._outputs(handler(self._spark_key(key), self._timers(ctx), ExpiredTimerInfo(timestamp_ms)))

    def end_batch(self, ctx: Context) -> Iterable[Row] | None:
        self.close()
        self._converted = None
        return None

    def close(self) -> None:
        running, self._running = self._running, None
        if running is not None:
            running.close()

    def _timers(self, ctx: Context) -> TimerValues:
        if self.time_mode == "None":
            return TimerValues(-1, -1)
        watermark = ctx.watermark_ms if self.time_mode == "EventTime" and ctx.watermark_ms is not None else -1
        return TimerValues(ctx.processing_time_ms, watermark)

    def _inputs(self, rows: Sequence[Row]) -> Iterator[Any]:
        """The key's rows as Spark's worker hands them over (:mod:`spate.spark.python_worker`): pandas
        DataFrames (slices of the batch's rows converted once per batch as Spark converts them), or ``Row``
        objects; rows given as dicts (in process) as they are."""
        if not isinstance(rows, KeyRows):
            if self.flavour == "pandas":
                return _chunks(_pandas_rows(rows), self.max_records_per_batch)
            return _spark_rows(rows)
        converted, row_bytes = self._batch_rows(rows.batch)
        if self.flavour == "pandas":
            return pandas_chunks(converted.iloc[rows.start:rows.stop], self.worker_conf, row_bytes)
        return _arrow_rows(converted.slice(rows.start, rows.stop - rows.start))

    def _batch_rows(self, batch: KeyedBatch) -> tuple[Any, float]:
        """The batch's rows converted as Spark converts them (once per batch), and their Arrow bytes per row."""
        if self._converted is None or self._converted[0] is not batch:
            table = batch.table
            if self.flavour == "pandas":
                converted = pandas_input(table, self.worker_conf)
            else:
                converted = in_session_zone(table, self.worker_conf)
            self._converted = (batch, converted, table.nbytes / max(table.num_rows, 1))
        return self._converted[1], self._converted[2]

    def _spark_key(self, key: Any) -> tuple:
        """The grouping key as Spark passes it: a tuple of its columns, timestamps as the flavour gives them
        (pandas: a naive ``Timestamp`` in the session time zone; Row: an aware ``datetime`` in it)."""
        parts = key if isinstance(key, tuple) else (key,)
        if not any(isinstance(p, _dt.datetime) for p in parts):
            return parts
        return tuple(self._spark_time(p) if isinstance(p, _dt.datetime) else p for p in parts)

    def _spark_time(self, value: _dt.datetime) -> Any:
        import pandas as pd

        if value.tzinfo is None:  # timestamp_ntz: as it is (a pandas Timestamp in the pandas flavour)
            return pd.Timestamp(value) if self.flavour == "pandas" else value
        aware = pa.scalar(value, type=pa.timestamp("us", tz=self.worker_conf.timezone)).as_py()
        return pd.Timestamp(aware).tz_localize(None) if self.flavour == "pandas" else aware

    def _outputs(self, produced: Any) -> ColumnChunk | list[Row]:
        """What the processor yielded: DataFrames as one chunk of columns (no dict per row), Rows as dicts (as
        Spark's ``asDict(recursive=True)``); the output buffer converts both as Spark does and names anything
        else (an empty DataFrame without columns is no rows, as on Spark)."""
        if self.flavour == "pandas":
            frames = [f for f in produced or () if getattr(f, "shape", None) != (0, 0)]
            return ColumnChunk.of(frames, self._frame_columns)
        out = SparkRows()
        for item in produced or ():
            fields = getattr(item, "__fields__", None)
            if fields is None:  # Spark's asDict fails on it
                out.refused = item
                break
            row = dict(zip(fields, item, strict=True))
            out.append(row if _flat_plain(row) else item.asDict(recursive=True))  # nested Rows by name, as Spark
        return out

    @staticmethod
    def _frame_columns(frame: Any) -> dict[Any, Any] | None:
        """A DataFrame's columns by label: numpy arrays (cheap to join), pandas Series where the dtype is
        pandas' own (time zones, nullable ints), whose conversion depends on it; None for anything else."""
        import numpy as np
        import pandas as pd

        if not isinstance(frame, pd.DataFrame):
            return None
        return {name: s.to_numpy() if isinstance(s.dtype, np.dtype) else s for name, s in frame.items()}


def _pandas_rows(rows: Sequence[Row]) -> Any:
    """Rows given as dicts (in process) as a pandas DataFrame."""
    import pandas as pd

    return pd.DataFrame(list(rows))


def _spark_rows(rows: Sequence[Row]) -> Iterator[Any]:
    from pyspark.sql import Row as SparkRow

    return (SparkRow(**r) for r in rows)


def _arrow_rows(table: pa.Table) -> Iterator[Any]:
    """``Row`` objects of the table's columns, each value Arrow's ``as_py`` (as Spark's Row flavour makes them)."""
    from pyspark.sql import Row as SparkRow

    make = SparkRow(*table.column_names)
    columns = [c.to_pylist() for c in table.columns]
    return (make(*values) for values in zip(*columns, strict=True))


_PLAIN_TYPES = (str, int, float, bool, type(None), bytes)


def _flat_plain(row: Row) -> bool:
    """Whether every value of ``row`` is a plain Python scalar (the row can be output as it is)."""
    return all(type(v) in _PLAIN_TYPES for v in row.values())


def _chunks(frame: Any, size: int) -> Iterator[Any]:
    """``frame`` in DataFrames of at most ``size`` rows, each indexed from 0 (as Spark's Arrow batches)."""
    if len(frame) <= size:
        yield frame
        return
    import pandas as pd

    for start in range(0, len(frame), size):
        chunk = frame.iloc[start:start + size].copy(deep=False)
        chunk.index = pd.RangeIndex(len(chunk))
        yield chunk


__all__ = ["StatefulProcessorAdapter", "StatefulProcessorHandle", "TimerValues", "ExpiredTimerInfo"]
