"""The timers a :class:`~spate.runtime.batch.BatchProcessor` receives at once: every timer of one time domain
that came due in a batch, column by column."""

from __future__ import annotations

from typing import Any

import numpy as np

from spate.serde import decode_key
from spate.state.timers import TimerService


class FiredTimers:
    """Timer ``i`` belongs to ``keys[i]`` (key group ``key_groups[i]``) and fired at ``timestamps[i]`` (ms) in
    ``namespaces[i]`` (None: the default). In timestamp order; a key appears once per timer. It is a key set
    for bulk state: ``self.count.get_many(timers)`` reads the state of each timer's key."""

    def __init__(self, domain: str, due: list[tuple[int, int, bytes, bytes]]) -> None:
        self.domain = domain
        self.timestamps = np.fromiter((ts for ts, _, _, _ in due), dtype=np.int64, count=len(due))
        self.key_groups = [kg for _, kg, _, _ in due]
        self.encoded_keys = [kb for _, _, kb, _ in due]
        self.keys: list[Any] = [decode_key(kb) for kb in self.encoded_keys]
        self.namespaces: list[Any] = [decode_key(ns) if ns else None for _, _, _, ns in due]

    @staticmethod
    def take(timers: TimerService, domain: str, up_to: int) -> FiredTimers:
        """The timers of ``domain`` due at ``up_to``, removed from ``timers``."""
        return FiredTimers(domain, timers.take_due(domain, up_to))

    def __len__(self) -> int:
        return len(self.keys)

    def __repr__(self) -> str:
        return f"FiredTimers({self.domain}, {len(self)} timers)"


__all__ = ["FiredTimers"]
