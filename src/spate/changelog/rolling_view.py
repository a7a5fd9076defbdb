"""A background materialization's view of the table, moved forward at every sequence-number boundary.

Why. A materialization reads the whole table in the background, for seconds at 1 GB and minutes at 10 GB.
Read from one view all that time, it pins the table as of its start: lmdb cannot reuse a page freed by a
write made after the view's transaction began, so every batch during the materialization writes to new pages
(about 4 KB per updated entry, ~200 MB per batch of 50 000 updates), and a 10 GB table grew to 39 GB while
materializations followed each other. The heap table's copy-on-write view keeps a copy of every key group
written before the view read it, the same cost in memory.

How. The view is renewed whenever the subtask reaches a sequence-number boundary (the changelog's active change
set closed at a checkpoint, every change before it committed to the table): each key group is read from the
newest view, and its *position* (the first sequence number it does not hold) is remembered. A key group read at
position ``p`` holds exactly the changes of the change sets before ``p``, so a restore replays it from ``p`` on:
a checkpoint lists, per change set, only the key groups whose position it is not before
(:func:`trimmed`). Replay stays exact for every record kind (``APPEND`` included, which is not idempotent):
no change is applied twice, none is skipped.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import AbstractContextManager

from spate.snapshot.handles import ChangeSetHandle
from spate.state.table import TableView

OpenView = Callable[[], AbstractContextManager[TableView]]


class _Opened:
    """One view of the table, open from one boundary to the next (or while a read still uses it)."""

    def __init__(self, opener: AbstractContextManager[TableView], position: int) -> None:
        self._opener = opener
        self.view = opener.__enter__()
        self.position = position
        self.readers = 0
        self.retired = False

    def close(self) -> None:
        self._opener.__exit__(None, None, None)


class RollingView:
    """A :class:`~spate.state.table.TableView` for one materialization: :meth:`key_group_flat` (the background
    thread) reads each key group from the newest view and records its position; :meth:`advance` (the subtask's
    thread, at a boundary) opens a newer one. :attr:`positions` tells, per key group read, the position it was
    read at."""

    def __init__(self, open_view: OpenView, position: int) -> None:
        self._open_view = open_view
        self._changed = threading.Condition()
        self._current: _Opened | None = _Opened(open_view(), position)
        self._finished = False
        self.positions: dict[int, int] = {}

    def key_group_flat(self, kg: int) -> list[bytes]:
        with self._changed:
            while self._current is None and not self._finished:  # a newer view is being opened
                self._changed.wait()
            if self._current is None:
                raise RuntimeError("key group read from a closed materialization view")
            opened = self._current
            opened.readers += 1
        try:
            flat = opened.view.key_group_flat(kg)
        finally:
            self._release(opened)
        self.positions[kg] = opened.position
        return flat

    def advance(self, position: int) -> None:
        """Read key groups from here on at ``position``: call at a sequence-number boundary, with every change
        before ``position`` in the table (the view opened now must see them all and nothing later)."""
        with self._changed:
            if self._finished:
                return
            old, self._current = self._current, None
            close_old = old is not None and old.readers == 0
            if old is not None and not close_old:
                old.retired = True  # closed by its last reader (lmdb's map may wait for it to grow)
        if close_old and old is not None:
            old.close()
        try:
            newer = _Opened(self._open_view(), position)
        except BaseException:
            with self._changed:  # no view to read from: the materialization fails instead of waiting for one
                self._finished = True
                self._changed.notify_all()
            raise
        with self._changed:
            publish = not self._finished
            if publish:
                self._current = newer
                self._changed.notify_all()
        if not publish:
            newer.close()

    def close(self) -> None:
        """The materialization is over: close the view (idempotent; any thread)."""
        with self._changed:
            self._finished = True
            current, self._current = self._current, None
            self._changed.notify_all()
        if current is not None:
            self._release(current, retire=True)

    def _release(self, opened: _Opened, retire: bool = False) -> None:
        with self._changed:
            if retire:
                opened.retired = True
            else:
                opened.readers -= 1
            last = opened.retired and opened.readers == 0
        if last:
            opened.close()


def trimmed(handle: ChangeSetHandle, positions: dict[int, int]) -> ChangeSetHandle | None:
    """``handle`` without the key groups a materialization read at a later position than its sequence number
    (their materialized frame holds its changes already); None if none is left."""
    if not positions:
        return handle
    sqn = handle.sqn
    keep = {kg: o for kg, o in handle.offsets.items() if positions.get(kg, sqn) <= sqn}
    if len(keep) == len(handle.offsets):
        return handle
    if not keep:
        return None
    return ChangeSetHandle(handle.path, handle.log_id, handle.sqn, keep, handle.states, handle.file_offset,
                           handle.segment.length)
