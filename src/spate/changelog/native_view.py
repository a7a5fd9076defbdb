"""A materialization of an lmdb table as a native snapshot (:mod:`spate.snapshot.native`): one read transaction,
opened at the sequence-number boundary, that lmdb copies in the background.

Every key group is read at that one position, so a restore replays the change sets from the materialization's
sequence number on, none trimmed. The transaction is held while lmdb copies (seconds per GB): pages the batches
free meanwhile are reused only after it, as with any long reader.
"""

from __future__ import annotations

import threading

from spate.segments import SegmentWriter
from spate.snapshot.handles import NativeSnapshotHandle
from spate.snapshot.keyed import SnapshotScope
from spate.snapshot.native import CopyStopped, NativeCopy
from spate.state.lmdb_table import LmdbTable


class NativeView:
    """:class:`~spate.changelog.process_view.MaterializationView` of a native snapshot: :meth:`write` (the
    materialization's thread) copies the table as it was when the view opened; :meth:`close` (any thread) stops
    a copy under way, and the transaction ends when no copy uses it any more."""

    read_by = "native"

    def __init__(self, table: LmdbTable, key_groups: range, position: int) -> None:
        self._opened = table.consistent_view()  # commits the table first
        view = self._opened.__enter__()
        self._copy = NativeCopy(table.env, view.txn)
        self.positions = dict.fromkeys(key_groups, position)
        self._lock = threading.Lock()
        self._writing = self._closed = False

    def advance(self, position: int) -> None:
        """Nothing to do: the copy reads the table as it was at the start, whatever the position now."""

    def write(self, scope: SnapshotScope, out: SegmentWriter) -> NativeSnapshotHandle | None:
        with self._lock:
            if self._closed:
                raise CopyStopped("the materialization was stopped before its copy started")
            self._writing = True
        try:
            return self._copy.write(scope, out)
        finally:
            with self._lock:
                self._writing = False
                if self._closed:
                    self._end()

    def close(self) -> None:
        self._copy.stop()
        with self._lock:
            already, self._closed = self._closed, True
            if not already and not self._writing:
                self._end()

    def _end(self) -> None:
        self._opened.__exit__(None, None, None)
