"""Timers of many keys at once, for a ``BatchProcessor``: register, delete and list them with one call per
batch. They are the timers :class:`~spate.state.timers.TimerService` keeps (one store, one index), so they
fire, checkpoint and rescale like a per-key processor's."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from spate.errors import StateAccessError
from spate.state.bulk_keys import Keys, key_parts, plain_values
from spate.state.key_scope import KeyScope
from spate.state.timers import EVENT_TIME, TimerService


class BulkTimers:
    """``register_many``, ``delete_many`` and ``list_many`` over the subtask's timers; ``domain`` is
    ``"event"`` (the default: fire once the watermark reaches the time) or ``"processing"``."""

    def __init__(self, scope: KeyScope, timers: TimerService) -> None:
        self._scope = scope
        self._timers = timers

    def _primaries(self, keys: Keys, domain: str, namespace: Any) -> tuple[Sequence[int], list[bytes]]:
        kgs, parts = key_parts(self._scope, keys)
        primary_of = self._timers.primary_of
        return kgs, [primary_of(domain, part, namespace) for part in parts]

    def _timestamps(self, timestamps: Sequence[int], op: str, n: int) -> Sequence[int]:
        plain = plain_values(timestamps)
        if len(plain) != n:
            raise StateAccessError(f"{op}: {len(plain)} timestamps for {n} keys: pass one timestamp per key, in the "
                                   "keys' order")
        return plain

    def register_many(self, keys: Keys, timestamps: Sequence[int], domain: str = EVENT_TIME,
                      namespace: Any = None) -> None:
        """A timer for ``keys[i]`` at ``timestamps[i]`` (ms); registering one twice keeps one."""
        kgs, primaries = self._primaries(keys, domain, namespace)
        register = self._timers.register_at
        for kg, primary, ts in zip(kgs, primaries, self._timestamps(timestamps, "register_many", len(kgs)),
                                   strict=True):
            register(domain, ts, kg, primary)

    def delete_many(self, keys: Keys, timestamps: Sequence[int], domain: str = EVENT_TIME,
                    namespace: Any = None) -> None:
        """Delete the timer of ``keys[i]`` at ``timestamps[i]`` (no error where there is none)."""
        kgs, primaries = self._primaries(keys, domain, namespace)
        delete = self._timers.delete_at
        for kg, primary, ts in zip(kgs, primaries, self._timestamps(timestamps, "delete_many", len(kgs)),
                                   strict=True):
            delete(ts, kg, primary)

    def list_many(self, keys: Keys, domain: str = EVENT_TIME, namespace: Any = None) -> list[list[int]]:
        """Each key's timers, in timestamp order."""
        kgs, primaries = self._primaries(keys, domain, namespace)
        list_at = self._timers.list_at
        return [list_at(kg, primary) for kg, primary in zip(kgs, primaries, strict=True)]


__all__ = ["BulkTimers"]
