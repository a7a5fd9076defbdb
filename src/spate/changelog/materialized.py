"""The materialized part of a subtask's keyed state with the changelog on: the snapshot handles a restore starts from
(the last materialization's, or those the state was restored from), from which position each key group's log is
replayed, and what a checkpoint lists of the log.

A materialization takes the place of the handles before it a part at a time when it is written in parts (a native
one of a large table: :mod:`spate.changelog.process_view`). A part holds a contiguous run of key groups, after the
parts before it: it takes those key groups from the older handles (narrowed to the key groups after it), and their
log is replayed from the position each was read at. So a restore replays, per key group, the log since its own part
(at most about one materialization's length) instead of the log since the whole previous materialization began (up
to two, at the worst point of the cycle). A whole materialization is one part holding every key group.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from spate.changelog.rolling_view import trimmed
from spate.segments import FileRef, SegmentWriter
from spate.snapshot.handles import ChangeSetHandle, KeyedHandle

AFTER = 1 << 31  # the end of "every key group after": a range's stop beyond any key group
Relocate = Callable[[Any], Any]


@dataclass(frozen=True)
class MaterializedPart:
    """Key groups ``key_groups`` materialized: their handle (None: none of them holds data), and the position each
    was read at (it holds the changes of the change sets before it)."""

    handle: KeyedHandle | None
    key_groups: range
    positions: dict[int, int]


class Materialized:
    """The handles a restore starts from and the log's start per key group; the files of materializations that no
    checkpoint references yet (deleted once no handle names them)."""

    def __init__(self) -> None:
        self.handles: list[KeyedHandle] = []
        self.restored_changelog: list[ChangeSetHandle] = []  # the restored state's log, listed until replaced
        self.to = 0  # the sequence number the last whole materialization began at: the log a checkpoint lists
        # per key group, the sequence number its materialized part was read at (absent: ``to``)
        self.positions: dict[int, int] = {}
        self._listed: dict[int, tuple[ChangeSetHandle, ChangeSetHandle | None]] = {}  # sqn -> (uploaded, listed)
        self._unreferenced: list[tuple[FileRef, SegmentWriter]] = []

    def restored(self, handles: list[KeyedHandle], changelog: list[ChangeSetHandle]) -> None:
        """The state was restored from ``handles`` and ``changelog``: listed as they are until replaced."""
        self.handles, self.restored_changelog = list(handles), list(changelog)
        self.positions = {}

    def relocate(self, fix: Relocate) -> None:
        """Every handle replaced by its re-written copy (file merging); a file re-written before any checkpoint
        referenced it is deleted."""
        self.handles = [fix(h) for h in self.handles]
        self.restored_changelog = [fix(h) for h in self.restored_changelog]
        self._drop_superseded()

    def referenced(self) -> None:
        """A checkpoint's ack names every handle: the coordinator owns their files from now on."""
        self._unreferenced = []

    def listed(self, handle: ChangeSetHandle, states: tuple[dict[str, Any], ...]) -> ChangeSetHandle | None:
        """``handle`` as a checkpoint lists it: with the state descriptors, without the key groups materialized after
        it (:func:`~spate.changelog.rolling_view.trimmed`; None if that is all of them), the same object from
        checkpoint to checkpoint while nothing changed: checkpoints list the log since the materialization again and
        again, and an unchanged handle keeps its encoding (and lets the coordinator recognize the log's part it
        already wrote down)."""
        known = self._listed.get(handle.sqn)
        if known is not None and known[0] is handle and (known[1] is None or known[1].states == states):
            return known[1]
        kept = trimmed(handle, self.positions)
        listed = None if kept is None else kept.with_states(states)
        self._listed[handle.sqn] = (handle, listed)
        return listed

    def take_part(self, part: MaterializedPart, out: SegmentWriter) -> None:
        """A part of a running materialization (written to ``out``) takes its key groups' place."""
        kgs, after = part.key_groups, range(part.key_groups.stop, AFTER)
        # the parts taken before it end before it; every other handle was narrowed to the key groups after them
        earlier = [h for h in self.handles if h.end < kgs.start]
        older = [n for h in self.handles if h.end >= kgs.start and (n := h.intersect(after)) is not None]
        self.handles = [*earlier, *([part.handle] if part.handle is not None else []), *older]
        self.restored_changelog = [c for h in self.restored_changelog if (c := h.intersect(after)) is not None]
        self.positions.update(part.positions)
        if part.positions:  # change sets before these positions are listed without the part's key groups now
            newest = max(part.positions.values())
            self._listed = {sqn: h for sqn, h in self._listed.items() if sqn >= newest}
        if part.handle is not None:
            self._unreferenced.append((part.handle.segment, out))
        self._drop_superseded()

    def complete(self, last: MaterializedPart, out: SegmentWriter, sqn: int, positions: dict[int, int]) -> None:
        """The materialization begun at ``sqn`` is complete with its ``last`` part (its key groups read at
        ``positions``): the log a checkpoint lists starts there."""
        self.take_part(last, out)
        self.restored_changelog = []
        self.to = sqn
        self.positions = {kg: p for kg, p in positions.items() if p > sqn}
        listed_alike = max(self.positions.values(), default=sqn)  # listed as before from here on
        self._listed = {s: h for s, h in self._listed.items() if s >= listed_alike}

    def _drop_superseded(self) -> None:
        """Delete the materialized files no checkpoint references that no handle names any more."""
        named = {h.segment for h in self.handles}
        kept = []
        for ref, out in self._unreferenced:
            if ref in named:
                kept.append((ref, out))
            else:
                out.discard(ref)
        self._unreferenced = kept

    def drop_unreferenced(self) -> None:
        """Delete every materialized file no checkpoint references (the subtask closes)."""
        for ref, out in self._unreferenced:
            out.discard(ref)
        self._unreferenced = []
