"""Window assigners: which windows an element with timestamp ``ts`` (ms) belongs to.

A window is the half-open interval ``[start, end)``; its last timestamp ``end - 1`` is when it fires
(:attr:`Window.max_timestamp`), as in Flink. Tumbling and sliding windows are aligned to ``offset_ms``, like
Spark's ``window(ts, size, slide)`` (windows start at multiples of the slide); session windows start as
``[ts, ts + gap)`` and merge when they overlap or touch.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import NamedTuple

from spate.errors import WindowError


class Window(NamedTuple):
    """The time interval ``[start, end)`` in ms."""

    start: int
    end: int

    @property
    def max_timestamp(self) -> int:
        return self.end - 1

    def touches(self, other: Window) -> bool:
        """Overlapping or adjacent: two session windows that merge."""
        return self.start <= other.end and other.start <= self.end

    def cover(self, other: Window) -> Window:
        return Window(min(self.start, other.start), max(self.end, other.end))


class WindowAssigner(ABC):
    """Base of the assigners. ``merging`` assigners (sessions) merge windows that touch."""

    merging = False

    @abstractmethod
    def assign(self, ts: int) -> list[Window]:
        """The windows an element with timestamp ``ts`` (ms) belongs to."""


def _positive(name: str, value: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise WindowError(f"{name} must be a positive int (milliseconds), got {value!r}: pass e.g. {name}=60_000")
    return value


class TumblingWindows(WindowAssigner):
    """Fixed, non-overlapping windows of ``size_ms``.

    Raises:
        WindowError: (a ``ValueError``) ``size_ms`` is not a positive int.
    """

    def __init__(self, size_ms: int, offset_ms: int = 0) -> None:
        self.size_ms, self.offset_ms = _positive("size_ms", size_ms), offset_ms % size_ms

    def assign(self, ts: int) -> list[Window]:
        start = ts - (ts - self.offset_ms) % self.size_ms
        return [Window(start, start + self.size_ms)]

    def __repr__(self) -> str:
        return f"TumblingWindows(size_ms={self.size_ms})"


class SlidingWindows(WindowAssigner):
    """Windows of ``size_ms`` starting every ``slide_ms``: an element is in ``ceil(size / slide)`` of them.

    Raises:
        WindowError: (a ``ValueError``) ``size_ms`` or ``slide_ms`` is not a positive int, or the slide is larger
            than the size.
    """

    def __init__(self, size_ms: int, slide_ms: int, offset_ms: int = 0) -> None:
        self.size_ms, self.slide_ms = _positive("size_ms", size_ms), _positive("slide_ms", slide_ms)
        if slide_ms > size_ms:
            raise WindowError(f"slide_ms ({slide_ms}) larger than size_ms ({size_ms}) leaves gaps: use a slide at "
                              "most the size")
        self.offset_ms = offset_ms % slide_ms

    def assign(self, ts: int) -> list[Window]:
        last_start = ts - (ts - self.offset_ms) % self.slide_ms
        return [Window(start, start + self.size_ms)
                for start in range(last_start, ts - self.size_ms, -self.slide_ms)]

    def __repr__(self) -> str:
        return f"SlidingWindows(size_ms={self.size_ms}, slide_ms={self.slide_ms})"


class SessionWindows(WindowAssigner):
    """A key's elements less than ``gap_ms`` apart form one session ``[first, last + gap)``.

    Raises:
        WindowError: (a ``ValueError``) ``gap_ms`` is not a positive int.
    """

    merging = True

    def __init__(self, gap_ms: int) -> None:
        self.gap_ms = _positive("gap_ms", gap_ms)

    def assign(self, ts: int) -> list[Window]:
        return [Window(ts, ts + self.gap_ms)]

    def __repr__(self) -> str:
        return f"SessionWindows(gap_ms={self.gap_ms})"


__all__ = ["SessionWindows", "SlidingWindows", "TumblingWindows", "Window", "WindowAssigner"]
