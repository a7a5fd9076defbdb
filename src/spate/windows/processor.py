"""Windowed aggregation on keyed state: Flink's window operator as a spate :class:`Processor`.

A window's contents live in keyed state under the window as namespace (an accumulator for ``aggregate`` and
``reduce``, the rows for a full-window ``process`` function), its firing is a timer at the window's last
timestamp, and purging clears the namespace. With the changelog on, a window created, updated and purged
between two uploads leaves nothing in the log (:mod:`spate.changelog.changeset`).

Event time: the watermark of the batch (``ctx.watermark_ms``) fires every window whose last timestamp it
reached, after the batch's rows are added. A row whose windows are all past the watermark plus
``allowed_lateness_ms`` is late: dropped, or given to ``late_rows``. With allowed lateness, a fired window
keeps its state until the watermark passes its end plus the lateness, and each late row added to it fires it
again. Processing time: a row belongs to the windows of the batch's processing time; a window fires at the
first batch at or after its end.

Early firings (``early_fire_ms``): a window with contents also fires every that many ms of processing time
before it is complete.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from spate.errors import EventTimeError, WindowError
from spate.runtime.processor import Context, Processor, Row, to_epoch_ms
from spate.state.descriptors import (
    AggregateFunction,
    AggregatingStateDescriptor,
    ListStateDescriptor,
    ReducingStateDescriptor,
    ValueStateDescriptor,
)
from spate.windows.assigners import Window, WindowAssigner

TIMES = ("event", "processing")
# merging assigners: the key's live windows, as [start, end] pairs
SESSIONS: ValueStateDescriptor[list[list[int]]] = ValueStateDescriptor("window-sessions")


def default_output(key: Any, window: Window, result: Any) -> Row:
    return {"key": key, "window_start": window.start, "window_end": window.end, "value": result}


class WindowedProcessor(Processor):
    """Keyed windows with an incremental ``aggregate`` (an :class:`AggregateFunction`), a ``reduce`` function,
    or a full-window ``process(key, window, rows) -> rows`` function (exactly one).

    Args:
        assigner: :class:`TumblingWindows`, :class:`SlidingWindows` or :class:`SessionWindows`.
        time: ``"event"`` (the ``timestamp`` column's time and the stream's watermark) or ``"processing"``.
        timestamp: the event-time column (int ms or datetime).
        value: what ``aggregate``/``reduce`` receive of a row (default: the row).
        output: ``output(key, window, result) -> row`` (default: key, window_start, window_end, value).
        allowed_lateness_ms: event time: how long after the watermark passed a window's end it still takes
            late rows (each fires it again).
        late_rows: ``"drop"`` or ``late(key, row) -> row``, emitted for each late row (a side output).
        early_fire_ms: fire a window with contents every this many ms of processing time before it is
            complete.

    Raises:
        WindowError: (a ``ValueError``) an unknown ``time``, event time without ``timestamp``, not exactly one
            of ``aggregate``/``reduce``/``process``, a negative lateness or lateness in processing time, a
            ``late_rows`` that is neither "drop" nor a function, an ``early_fire_ms`` that is not positive.
        EventTimeError: (while running) a row without its event time, or one that is not int ms or a datetime.
    """

    def __init__(self, assigner: WindowAssigner, *, time: str = "event", timestamp: str | None = None,
                 aggregate: AggregateFunction | None = None, reduce: Callable[[Any, Any], Any] | None = None,
                 process: Callable[[Any, Window, list[Row]], Iterable[Row]] | None = None,
                 value: Callable[[Row], Any] | None = None, output: Callable[[Any, Window, Any], Row] = default_output,
                 allowed_lateness_ms: int = 0, late_rows: str | Callable[[Any, Row], Row] = "drop",
                 early_fire_ms: int | None = None) -> None:
        _check_arguments(time, timestamp, (aggregate, reduce, process), allowed_lateness_ms, late_rows, early_fire_ms)
        self.assigner, self.time, self.timestamp = assigner, time, timestamp
        self.aggregate, self.reduce, self.process_window = aggregate, reduce, process
        self.value, self.output = value, output
        self.allowed_lateness_ms, self.late_rows, self.early_fire_ms = allowed_lateness_ms, late_rows, early_fire_ms

    # -- lifecycle --------------------------------------------------------------------------------------
    def open(self, ctx: Context) -> None:
        if self.aggregate is not None:
            self.contents = ctx.state(AggregatingStateDescriptor("window-contents", aggregate_fn=self.aggregate))
        elif self.reduce is not None:
            self.contents = ctx.state(ReducingStateDescriptor("window-contents", reduce_fn=self.reduce))
        else:
            self.contents = ctx.state(ListStateDescriptor("window-rows"))
        self.sessions = ctx.state(SESSIONS) if self.assigner.merging else None

    # -- rows -------------------------------------------------------------------------------------------
    def process(self, key: Any, rows: Sequence[Row], ctx: Context) -> Iterator[Row]:
        watermark = self._watermark(ctx)
        touched: dict[Window, None] = {}
        for row in rows:
            ts = self._timestamp(row, ctx)
            windows = self._windows_of(ts, watermark, ctx)
            if not windows:
                if callable(self.late_rows):
                    yield self.late_rows(key, row)
                continue
            item = self.value(row) if self.value is not None else row
            for window in windows:
                self._add(window, item, watermark, ctx)
                touched[window] = None
        for window in self._still_live(touched):  # rows added to a window the watermark passed fire it again
            if watermark is not None and window.max_timestamp <= watermark:
                yield from self._emit(key, window)

    def _windows_of(self, ts: int, watermark: int | None, ctx: Context) -> list[Window]:
        """The live windows ``ts`` goes to (merged, for sessions); none if all are late."""
        windows = [w for w in self.assigner.assign(ts) if not self._is_late(w, watermark)]
        if self.sessions is None or not windows:
            return windows
        merged = self._merge_session(windows[0], ctx)
        return [] if self._is_late(merged, watermark) else [merged]

    def _add(self, window: Window, item: Any, watermark: int | None, ctx: Context) -> None:
        """Add ``item`` to ``window``; a new window gets its timers (an existing one has them)."""
        self.contents.set_namespace(window)
        if self._is_empty():
            self._register(window, watermark, ctx)
            if self.early_fire_ms:
                ctx.register_processing_time_timer(ctx.processing_time_ms + self.early_fire_ms, window)
        self.contents.add(item)

    def _is_empty(self) -> bool:
        return not self.contents.exists()

    # -- sessions ---------------------------------------------------------------------------------------
    def _merge_session(self, new: Window, ctx: Context) -> Window:
        """Merge ``new`` with the key's sessions it touches: their contents and timers move to the merged one."""
        assert self.sessions is not None
        self.sessions.set_namespace(None)
        live = [Window(*w) for w in self.sessions.value() or []]
        touching = [w for w in live if w.touches(new)]
        merged = new
        for w in touching:
            merged = merged.cover(w)
        sources = [w for w in touching if w != merged]
        if sources:
            self.contents.merge_namespaces(merged, sources)
            for w in sources:
                self._delete_timers(w, ctx)
            self._register(merged, ctx.watermark_ms if self.time == "event" else None, ctx)
            if self.early_fire_ms:
                ctx.register_processing_time_timer(ctx.processing_time_ms + self.early_fire_ms, merged)
        rest = [w for w in live if w not in touching]
        self.sessions.update([list(w) for w in sorted([*rest, merged])])
        return merged

    def _still_live(self, windows: dict[Window, None]) -> list[Window]:
        """``windows`` without the sessions a later row merged into another."""
        if self.sessions is None:
            return list(windows)
        self.sessions.set_namespace(None)
        live = {Window(*w) for w in self.sessions.value() or []}
        return [w for w in windows if w in live]

    def _forget_session(self, window: Window) -> None:
        if self.sessions is not None:
            self.sessions.set_namespace(None)
            rest = [w for w in self.sessions.value() or [] if Window(*w) != window]
            if rest:
                self.sessions.update(rest)
            else:
                self.sessions.clear()

    # -- timers -----------------------------------------------------------------------------------------
    def _register(self, window: Window, watermark: int | None, ctx: Context) -> None:
        """The window's firing timer (none once the watermark passed it: rows added then fire it at once) and,
        with allowed lateness, its cleanup timer."""
        if self.time == "processing":
            ctx.register_processing_time_timer(window.max_timestamp, window)
            return
        if watermark is None or window.max_timestamp > watermark:
            ctx.register_event_time_timer(window.max_timestamp, window)
        if self.allowed_lateness_ms:
            ctx.register_event_time_timer(self._cleanup_time(window), window)

    def _delete_timers(self, window: Window, ctx: Context) -> None:
        if self.time == "processing":
            ctx.delete_processing_time_timer(window.max_timestamp, window)
            return
        ctx.delete_event_time_timer(window.max_timestamp, window)
        if self.allowed_lateness_ms:
            ctx.delete_event_time_timer(self._cleanup_time(window), window)

    def on_timer(self, key: Any, timestamp_ms: int, ctx: Context) -> Iterator[Row]:
        window = Window(*ctx.timer_namespace)
        self.contents.set_namespace(window)
        if self._is_empty():
            return  # purged already (an early-firing timer outliving its window)
        in_time_domain = ctx.timer_domain == ("processing" if self.time == "processing" else "event")
        if not in_time_domain or timestamp_ms != window.max_timestamp and timestamp_ms != self._cleanup_time(window):
            yield from self._fire_early(key, window, timestamp_ms, ctx)
            return
        if timestamp_ms == window.max_timestamp:
            yield from self._emit(key, window)
        if timestamp_ms == self._cleanup_time(window):
            self._purge(window)

    def _fire_early(self, key: Any, window: Window, timestamp_ms: int, ctx: Context) -> Iterator[Row]:
        """An early firing, unless the window fires on time in this batch anyway; the next one ``early_fire_ms``
        after this batch (a batch that comes late catches up with one firing, not many)."""
        if self._complete(window, ctx.processing_time_ms, ctx):
            return
        yield from self._emit(key, window)
        following = max(timestamp_ms, ctx.processing_time_ms) + (self.early_fire_ms or 0)
        if not self._complete(window, following, ctx):
            ctx.register_processing_time_timer(following, window)

    def _complete(self, window: Window, at_ms: int, ctx: Context) -> bool:
        """Whether ``window`` will have fired on time by processing time ``at_ms``."""
        if self.time == "processing":
            return at_ms >= window.max_timestamp
        return ctx.watermark_ms is not None and ctx.watermark_ms >= window.max_timestamp

    def _cleanup_time(self, window: Window) -> int:
        return window.max_timestamp + (self.allowed_lateness_ms if self.time == "event" else 0)

    def _purge(self, window: Window) -> None:
        self.contents.set_namespace(window)
        self.contents.clear()
        self._forget_session(window)

    # -- results ----------------------------------------------------------------------------------------
    def _emit(self, key: Any, window: Window) -> Iterator[Row]:
        self.contents.set_namespace(window)
        if self.process_window is not None:
            yield from self.process_window(key, window, list(self.contents.get())) or ()
        else:
            yield self.output(key, window, self.contents.get())

    # -- time -------------------------------------------------------------------------------------------
    def _timestamp(self, row: Row, ctx: Context) -> int:
        if self.time == "processing":
            return ctx.processing_time_ms
        assert self.timestamp is not None
        value = row.get(self.timestamp)
        if value is None:
            raise EventTimeError(f"row {row!r} has no event time in column {self.timestamp!r}: give every row a "
                                 "value there (int ms or a datetime), or use time='processing'")
        return to_epoch_ms(value)

    def _watermark(self, ctx: Context) -> int | None:
        return ctx.watermark_ms if self.time == "event" else None

    def _is_late(self, window: Window, watermark: int | None) -> bool:
        """Flink's rule: past the watermark plus the allowed lateness (a window's state is gone by then)."""
        return watermark is not None and self._cleanup_time(window) <= watermark


def _check_arguments(time: str, timestamp: str | None, functions: tuple[Any, ...], lateness: int,
                     late_rows: Any, early_fire_ms: int | None) -> None:
    if time not in TIMES:
        raise WindowError(f"time must be one of {TIMES}, got {time!r}")
    if time == "event" and not timestamp:
        raise WindowError("event-time windows need timestamp= (the event-time column; the stream's "
                          "event_time_column drives the watermark)")
    if sum(f is not None for f in functions) != 1:
        raise WindowError("give exactly one of aggregate= (an AggregateFunction), reduce= (a function of two "
                          "values) or process= (a function of key, window and the window's rows)")
    if not isinstance(lateness, int) or lateness < 0:
        raise WindowError(f"allowed_lateness_ms must be an int >= 0, got {lateness!r}")
    if lateness and time == "processing":
        raise WindowError("allowed_lateness_ms is for event time: processing-time windows are never late")
    if late_rows != "drop" and not callable(late_rows):
        raise WindowError(f"late_rows must be 'drop' or a function (key, row) -> output row, got {late_rows!r}")
    if early_fire_ms is not None and (not isinstance(early_fire_ms, int) or early_fire_ms <= 0):
        raise WindowError(f"early_fire_ms must be a positive int, got {early_fire_ms!r}")


__all__ = ["WindowedProcessor", "default_output"]
