"""The coordinator side of checkpoint files: logical files (segments) → physical files, with reference
counts, last use, space statistics and space-amplification control.

A logical file is live while a retained checkpoint references it; its ``last_used`` is the newest checkpoint
that did (a later checkpoint advances it, an older one never lowers it). Subsuming checkpoints is a watermark:
``unregister_unused(lowest)`` drops every logical file last used before ``lowest``, so a missed notification
is made good by the next. A physical file is deleted exactly once, when it is closed (no worker may append
to it) and no live logical file is in it; a file with live and dead segments is kept whole, its dead bytes
are waste. Without file merging every logical file is a closed physical file of its own.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass

from spate.segments import FileRef

FORGET_DELETED_AFTER = 64


@dataclass
class _Logical:
    ref: FileRef
    last_used: int


@dataclass
class _Physical:
    size: int = 0
    live_bytes: int = 0
    refs: int = 0
    open: bool = False
    reusable: bool = True


@dataclass(frozen=True)
class SpaceStats:
    """Bytes still referenced (logical) vs bytes stored (physical) over every tracked file."""

    logical_bytes: int
    physical_bytes: int
    physical_files: int
    logical_files: int

    @property
    def amplification(self) -> float:
        return self.physical_bytes / self.logical_bytes if self.logical_bytes else (1.0 if not
                                                                                     self.physical_bytes else 0.0)


class FileRegistry:
    """Reference counting from logical to physical files; ``discard(path)`` deletes a physical file."""

    def __init__(self, discard: Callable[[str], None], max_space_amplification: float = 2.0) -> None:
        self._logical: dict[tuple[str, int], _Logical] = {}
        self._physical: dict[str, _Physical] = {}
        self._discard = discard
        self.max_space_amplification = max_space_amplification
        # recently deleted files, so a late report of one (a worker that has not heard of the completion yet)
        # does not bring it back and delete it twice; forgotten after FORGET_DELETED_AFTER sweeps
        self._deleted: dict[str, int] = {}
        self._sweeps = 0

    # -- what exists --------------------------------------------------------------------------------
    def track(self, path: str, size: int) -> None:
        """A physical file of ``size`` bytes exists (reported by a worker or found on restore)."""
        if path in self._deleted:
            return
        p = self._physical.setdefault(path, _Physical())
        p.size = max(p.size, size)

    def register(self, ref: FileRef, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` references ``ref``."""
        entry = self._logical.get(ref.key)
        if entry is not None:
            entry.last_used = max(entry.last_used, checkpoint_id)
            return
        self._logical[ref.key] = _Logical(ref, checkpoint_id)
        p = self._physical.setdefault(ref.path, _Physical())
        p.refs += 1
        p.live_bytes += ref.length
        p.size = max(p.size, ref.end)

    def set_open(self, paths: Collection[str]) -> list[str]:
        """The files workers may still append to (granted in the next plans); returns the files deleted
        because they just closed with nothing live in them."""
        closing = [path for path, p in self._physical.items() if p.open and path not in paths]
        for path in paths:
            if path not in self._deleted:
                self._physical.setdefault(path, _Physical()).open = True
        for path in closing:
            self._physical[path].open = False
        return self.sweep(closing)

    @property
    def open_files(self) -> list[str]:
        """Files workers may keep appending to: open and still reusable."""
        return sorted(path for path, p in self._physical.items() if p.open and p.reusable)

    @property
    def non_reusable(self) -> list[str]:
        """Files whose live segments must not be referenced by new checkpoints (re-write them instead)."""
        return sorted(path for path, p in self._physical.items() if not p.reusable)

    # -- what goes ----------------------------------------------------------------------------------
    def unregister_unused(self, lowest_retained_checkpoint_id: int) -> list[str]:
        """Drop every logical file last used before ``lowest_retained_checkpoint_id``; returns the physical
        files deleted as a result."""
        dead = [e for e in self._logical.values() if e.last_used < lowest_retained_checkpoint_id]
        touched = []
        for e in dead:
            del self._logical[e.ref.key]
            p = self._physical[e.ref.path]
            p.refs -= 1
            p.live_bytes -= e.ref.length
            touched.append(e.ref.path)
        return self.sweep(touched)

    def sweep(self, paths: Iterable[str]) -> list[str]:
        """Delete those of ``paths`` that are closed and hold no live logical file."""
        deleted = []
        self._sweeps += 1
        for path in dict.fromkeys(paths):
            p = self._physical.get(path)
            if p is not None and p.refs <= 0 and not p.open:
                del self._physical[path]
                self._deleted[path] = self._sweeps
                self._discard(path)
                deleted.append(path)
        if self._sweeps % FORGET_DELETED_AFTER == 0:
            self._deleted = {p: n for p, n in self._deleted.items() if n > self._sweeps - FORGET_DELETED_AFTER}
        return deleted

    # -- space ---------------------------------------------------------------------------------------
    def stats(self) -> SpaceStats:
        return SpaceStats(sum(p.live_bytes for p in self._physical.values()),
                          sum(p.size for p in self._physical.values()), len(self._physical), len(self._logical))

    def control_space(self) -> list[str]:
        """If physical bytes exceed ``max_space_amplification`` × logical bytes, mark the most wasteful files
        non-reusable until what would stay is within the bound; returns the files newly marked."""
        amp = self.max_space_amplification
        stats = self.stats()
        if amp < 1 or stats.physical_bytes <= amp * stats.logical_bytes:
            return []
        goal = amp * stats.logical_bytes
        alive = stats.physical_bytes
        marked = []
        candidates = sorted(((p.size - p.live_bytes, path) for path, p in self._physical.items() if p.reusable),
                            reverse=True)
        for waste, path in candidates:
            if alive <= goal or waste <= 0:
                break
            self._physical[path].reusable = False
            alive -= waste  # the file goes once its live segments are re-written elsewhere
            marked.append(path)
        return marked

    # -- queries --------------------------------------------------------------------------------------
    def __contains__(self, path: str) -> bool:
        return path in self._physical

    def __len__(self) -> int:
        return len(self._logical)

    def directories(self) -> set[str]:
        """Directories holding at least one tracked physical file."""
        return {posixpath.dirname(path) for path in self._physical}

    def live_bytes(self, path: str) -> int:
        p = self._physical.get(path)
        return p.live_bytes if p else 0
