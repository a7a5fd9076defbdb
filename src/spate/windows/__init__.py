"""Windows on keyed state: tumbling, sliding and session windows in event or processing time, aggregated
incrementally or by a full-window function (:class:`WindowedProcessor`), on any transport."""

from spate.windows.assigners import SessionWindows, SlidingWindows, TumblingWindows, Window, WindowAssigner
from spate.windows.processor import WindowedProcessor, default_output

__all__ = ["SessionWindows", "SlidingWindows", "TumblingWindows", "Window", "WindowAssigner", "WindowedProcessor",
           "default_output"]
