"""Run an unchanged ``pyspark.sql.streaming.StatefulProcessor`` (the ``transformWithStateInPandas`` /
``transformWithState`` API) on spate: its value, list and map state (with TTL) become spate keyed state, its
timers spate timers, and its handle calls local reads and writes instead of round trips to the JVM.

Differences from Spark, on purpose or by construction:

- state values are stored as given (tuples, as Spark's ``get`` returns them), encoded with msgpack; the state
  schemas are not enforced (numpy and pandas scalars are converted to plain Python values);
- ``deleteIfExists(name)`` clears the state for every key of this subtask, like Spark, but only for states
  the processor asked for in ``init`` of this run;
- processing-time timers fire at the start of the first batch at or after their time, event-time timers
  when the watermark (max event time seen − delay, from earlier batches) passes them;
- ``handleInitialState`` is not supported (no initial-state DataFrame); the output mode is append-like:
  every row the processor yields is emitted.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from spate.runtime.batch import KeyRows
from spate.runtime.outputs import ColumnChunk
from spate.runtime.processor import Context, Processor, Row
from spate.state.descriptors import ListStateDescriptor, MapStateDescriptor, StateDescriptor, ValueStateDescriptor

TIME_MODES = ("None", "ProcessingTime", "EventTime")
FLAVOURS = ("pandas", "row")


def plain(value: Any) -> Any:
    """``value`` with numpy/pandas scalars turned into Python values (msgpack stores plain data)."""
    if isinstance(value, (tuple, list)):
        return type(value)(plain(v) for v in value) if isinstance(value, list) else tuple(plain(v) for v in value)
    if isinstance(value, dict):
        return {plain(k): plain(v) for k, v in value.items()}
    to_pydatetime = getattr(value, "to_pydatetime", None)
    if to_pydatetime is not None:  # pandas.Timestamp
        return to_pydatetime()
    item = getattr(value, "item", None)
    if item is not None and type(value).__module__ == "numpy":
        return item()
    return value


class TimerValues:
    """``pyspark.sql.streaming.stateful_processor.TimerValues`` on spate's clock."""

    def __init__(self, processing_time_ms: int, watermark_ms: int | None) -> None:
        self._now, self._watermark = processing_time_ms, watermark_ms

    def getCurrentProcessingTimeInMs(self) -> int:  # noqa: N802 - Spark's API
        return self._now

    def getCurrentWatermarkInMs(self) -> int:  # noqa: N802
        return self._watermark if self._watermark is not None else -1


class ExpiredTimerInfo:
    def __init__(self, expiry_ms: int) -> None:
        self._expiry = expiry_ms

    def getExpiryTimeInMs(self) -> int:  # noqa: N802
        return self._expiry


class _ValueState:
    def __init__(self, state: Any) -> None:
        self._s = state

    def exists(self) -> bool:
        return bool(self._s.exists())

    def get(self) -> tuple | None:
        return self._s.value()

    def update(self, newValue: tuple) -> None:  # noqa: N803
        self._s.update(plain(newValue))

    def clear(self) -> None:
        self._s.clear()


class _ListState:
    def __init__(self, state: Any) -> None:
        self._s = state

    def exists(self) -> bool:
        return bool(self._s.get())

    def get(self) -> Iterator[tuple]:
        return iter(self._s.get())

    def put(self, newState: list[tuple]) -> None:  # noqa: N803
        self._s.update(plain(list(newState)))

    def appendValue(self, newState: tuple) -> None:  # noqa: N802,N803
        self._s.add(plain(newState))

    def appendList(self, newState: list[tuple]) -> None:  # noqa: N802,N803
        self._s.add_all(plain(list(newState)))

    def clear(self) -> None:
        self._s.clear()


class _MapState:
    def __init__(self, state: Any) -> None:
        self._s = state

    def exists(self) -> bool:
        return not self._s.is_empty()

    def getValue(self, key: tuple) -> tuple | None:  # noqa: N802
        return self._s.get(plain(key))

    def containsKey(self, key: tuple) -> bool:  # noqa: N802
        return bool(self._s.contains(plain(key)))

    def updateValue(self, key: tuple, value: tuple) -> None:  # noqa: N802
        self._s.put(plain(key), plain(value))

    def iterator(self) -> Iterator[tuple[tuple, tuple]]:
        return iter(self._s.items())

    def keys(self) -> Iterator[tuple]:
        return iter(self._s.keys())

    def values(self) -> Iterator[tuple]:
        return iter(self._s.values())

    def removeKey(self, key: tuple) -> None:  # noqa: N802
        self._s.remove(plain(key))

    def clear(self) -> None:
        self._s.clear()


class StatefulProcessorHandle:
    """``StatefulProcessorHandle`` backed by spate keyed state and timers."""

    def __init__(self, ctx: Context, time_mode: str) -> None:
        self._ctx, self._time_mode = ctx, time_mode
        self._descriptors: dict[str, StateDescriptor] = {}

    def _state(self, descriptor: StateDescriptor) -> Any:
        if descriptor.ttl_ms is not None and self._time_mode == "None":
            raise ValueError(f"state {descriptor.name!r} has a TTL, which needs timeMode 'ProcessingTime' (or "
                             "'EventTime'), as on Spark; TTL follows processing time")
        self._descriptors[descriptor.name] = descriptor
        return self._ctx.state(descriptor)

    def getValueState(self, stateName: str, schema: Any, ttlDurationMs: int | None = None) -> _ValueState:  # noqa: N802,N803
        return _ValueState(self._state(ValueStateDescriptor(stateName, ttl_ms=ttlDurationMs)))

    def getListState(self, stateName: str, schema: Any, ttlDurationMs: int | None = None) -> _ListState:  # noqa: N802,N803
        return _ListState(self._state(ListStateDescriptor(stateName, ttl_ms=ttlDurationMs)))

    def getMapState(self, stateName: str, userKeySchema: Any, valueSchema: Any,  # noqa: N802,N803
                    ttlDurationMs: int | None = None) -> _MapState:  # noqa: N803
        return _MapState(self._state(MapStateDescriptor(stateName, ttl_ms=ttlDurationMs)))

    def registerTimer(self, expiryTimestampMs: int) -> None:  # noqa: N802,N803
        if self._time_mode == "EventTime":
            self._ctx.register_event_time_timer(int(expiryTimestampMs))
        elif self._time_mode == "ProcessingTime":
            self._ctx.register_processing_time_timer(int(expiryTimestampMs))
        else:
            raise ValueError("registerTimer needs timeMode 'ProcessingTime' or 'EventTime', not 'None'")

    def deleteTimer(self, expiryTimestampMs: int) -> None:  # noqa: N802,N803
        if self._time_mode == "EventTime":
            self._ctx.delete_event_time_timer(int(expiryTimestampMs))
        elif self._time_mode == "ProcessingTime":
            self._ctx.delete_processing_time_timer(int(expiryTimestampMs))

    def listTimers(self) -> Iterator[int]:  # noqa: N802
        if self._time_mode == "EventTime":
            return iter(self._ctx.event_time_timers())
        if self._time_mode == "ProcessingTime":
            return iter(self._ctx.processing_time_timers())
        return iter(())

    def deleteIfExists(self, stateName: str) -> None:  # noqa: N802,N803
        descriptor = self._descriptors.get(stateName)
        if descriptor is None:
            return
        state, keyed = self._ctx.state(descriptor), self._ctx._keyed  # noqa: SLF001
        had_key, current = keyed.current_key_group >= 0, keyed.current_key
        for key in list(self._ctx.keys(descriptor)):
            keyed.set_current_key(key)
            state.clear()
        if had_key:
            keyed.set_current_key(current)
        else:
            keyed.clear_current_key()


class StatefulProcessorAdapter(Processor):
    """A spate :class:`Processor` running a ``pyspark`` ``StatefulProcessor``.

    Args:
        processor: the ``StatefulProcessor`` (copied per subtask).
        flavour: ``"pandas"`` (``transformWithStateInPandas``: rows arrive as pandas DataFrames, outputs are
            DataFrames) or ``"row"`` (``transformWithState``: ``Row`` in and out).
        time_mode: ``"None"``, ``"ProcessingTime"`` or ``"EventTime"``.
    """

    def __init__(self, processor: Any, flavour: str = "pandas", time_mode: str = "None") -> None:
        if flavour not in FLAVOURS:
            raise ValueError(f"flavour must be one of {FLAVOURS}, got {flavour!r}")
        if time_mode not in TIME_MODES:
            raise ValueError(f"timeMode must be one of {TIME_MODES}, got {time_mode!r}")
        self.processor, self.flavour, self.time_mode = processor, flavour, time_mode
        self.handle: StatefulProcessorHandle | None = None

    @property
    def display_name(self) -> str:
        """The wrapped ``StatefulProcessor``'s class, as errors name it."""
        return type(self.processor).__qualname__

    def open(self, ctx: Context) -> None:
        self.handle = StatefulProcessorHandle(ctx, self.time_mode)
        self.processor.init(self.handle)

    def process(self, key: Any, rows: Sequence[Row], ctx: Context) -> Iterable[Row] | None:
        return self._outputs(self.processor.handleInputRows(_spark_key(key), self._inputs(rows), _timers(ctx)))

    def on_timer(self, key: Any, timestamp_ms: int, ctx: Context) -> Iterable[Row] | None:
        handler = getattr(self.processor, "handleExpiredTimer", None)
        if handler is None:
            return None
        return self._outputs(handler(_spark_key(key), _timers(ctx), ExpiredTimerInfo(timestamp_ms)))

    def close(self) -> None:
        self.processor.close()

    def _inputs(self, rows: Sequence[Row]) -> Iterator[Any]:
        """The key's rows as Spark hands them over: one pandas DataFrame (a slice of the batch's, made once per
        batch from Arrow), or ``Row`` objects made from the batch's columns."""
        if self.flavour == "pandas":
            return iter([_pandas_rows(rows)])
        return _spark_rows(rows)

    def _outputs(self, produced: Any) -> ColumnChunk | list[Row]:
        """What the processor yielded: DataFrames as one chunk of columns (no dict per row), Rows as dicts."""
        if self.flavour == "pandas":
            frames = [f for f in produced or () if len(f)]
            return ColumnChunk.of(frames, self._frame_columns)
        out: list[Row] = []
        for item in produced or ():
            fields = getattr(item, "__fields__", None)
            row = dict(zip(fields, item, strict=True)) if fields is not None else item.asDict(recursive=True)
            out.append(plain(row) if not _flat_plain(row) else row)
        return out

    @staticmethod
    def _frame_columns(frame: Any) -> dict[str, Any]:
        return {str(name): series.to_numpy() for name, series in frame.items()}


def _pandas_rows(rows: Sequence[Row]) -> Any:
    """A key's rows as a pandas DataFrame with a fresh index: a slice of the batch's DataFrame for row views,
    else built from the dicts."""
    import pandas as pd

    if isinstance(rows, KeyRows):
        frame = rows.pandas()
        frame.index = pd.RangeIndex(len(frame))
        return frame
    return pd.DataFrame(list(rows))


def _spark_rows(rows: Sequence[Row]) -> Iterator[Any]:
    from pyspark.sql import Row as SparkRow

    if isinstance(rows, KeyRows):
        make = SparkRow(*rows.column_names)
        return (make(*values) for values in rows.tuples())
    return (SparkRow(**r) for r in rows)


_PLAIN_TYPES = (str, int, float, bool, type(None), bytes)


def _flat_plain(row: Row) -> bool:
    """Whether every value of ``row`` is a plain Python scalar (then ``plain`` has nothing to do)."""
    return all(type(v) in _PLAIN_TYPES for v in row.values())


def _spark_key(key: Any) -> tuple:
    """Spark passes the grouping key as a tuple of its columns."""
    return key if isinstance(key, tuple) else (key,)


def _timers(ctx: Context) -> TimerValues:
    return TimerValues(ctx.processing_time_ms, ctx.watermark_ms)


__all__ = ["StatefulProcessorAdapter", "StatefulProcessorHandle", "TimerValues", "ExpiredTimerInfo", "plain"]
