"""What a checkpoint storage counts of the data files written through it."""

from __future__ import annotations

import threading

from spate.layout import is_marker


class FileCounts:
    """Data files (not ``_``-prefixed markers such as ``_metadata``) created and deleted through a storage,
    and the bytes written to them."""

    def __init__(self) -> None:
        self.created = 0
        self.deleted = 0
        self.bytes_written = 0
        self._lock = threading.Lock()

    def add(self, rel: str, created: int = 0, deleted: int = 0, written: int = 0) -> None:
        if is_marker(rel):
            return
        with self._lock:
            self.created += created
            self.deleted += deleted
            self.bytes_written += written
