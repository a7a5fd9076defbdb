"""Shared-state registry: which checkpoint last used each shared file, so a file is deleted exactly when no
retained checkpoint references it any more (Flink's ``SharedStateRegistry`` semantics)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class _Entry:
    path: str
    last_used: int


class SharedStateRegistry:
    """``register`` on checkpoint completion; ``unregister_unused`` when checkpoints are subsumed."""

    def __init__(self, discard: Callable[[str], None]) -> None:
        self._entries: dict[str, _Entry] = {}
        self._discard = discard

    def register(self, key: str, path: str, checkpoint_id: int) -> str:
        """Record that ``checkpoint_id`` uses the shared state ``key`` stored at ``path``.

        If ``key`` is already registered with another file, the newcomer is a duplicate upload: it is
        discarded and the original is kept. Returns the path the checkpoint should use.
        """
        entry = self._entries.get(key)
        if entry is None:
            self._entries[key] = _Entry(path, checkpoint_id)
            return path
        if entry.path != path:
            self._discard(path)
        entry.last_used = max(entry.last_used, checkpoint_id)
        return entry.path

    def unregister_unused(self, lowest_retained_checkpoint_id: int) -> list[str]:
        """Discard every entry last used by a checkpoint older than the lowest retained one."""
        dead = [k for k, e in self._entries.items() if e.last_used < lowest_retained_checkpoint_id]
        paths = []
        for key in dead:
            paths.append(self._entries.pop(key).path)
            self._discard(paths[-1])
        return paths

    def __contains__(self, key: str) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)
