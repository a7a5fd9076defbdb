"""Ranged reads that open each file once: :class:`OpenFiles`, for a restore and for a verification of a checkpoint.

pyarrow opens an object-store file (S3, GCS) with a request for its size (S3: a ``HEAD``) and then reads each
range with one more (a ranged ``GET``). A restore makes thousands of ranged reads of a few files (each change
set's key groups, a materialized snapshot in chunks), so opening the file for every read doubles its requests,
each a round trip to the store. Within one restore the files read are those of the checkpoint being restored,
which nothing rewrites while it is restored (spate names every data file anew), so a file is opened at its first
read and kept open until the restore ends. A read through a kept file that fails or comes back short is made
again the ordinary way (open, then read), which reports a missing or truncated file as it always did.

A local disk opens a file without a request: there every read is the storage's own.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from types import TracebackType
from typing import Any

from spate.fs import CheckpointStorage

MAX_OPEN = 64  # files kept open at once (a restore reads a few segment files; the least recently read go first)


class OpenFiles:
    """Ranged reads of ``storage`` (a :class:`~spate.frames.RangeReader`) for one bulk read, each file opened
    once while at most ``most`` are open; a context manager that closes them. Safe to use from several threads."""

    def __init__(self, storage: CheckpointStorage, most: int = MAX_OPEN) -> None:
        self._storage = storage
        self._most = most
        self._lock = threading.Lock()
        self._open: OrderedDict[str, Any] = OrderedDict()  # rel -> pyarrow NativeFile, least recently read first

    def path(self, rel: str) -> str:
        return self._storage.path(rel)

    def read_range(self, rel: str, offset: int, length: int, context: str = "") -> bytes:
        """``length`` bytes at ``offset`` of ``rel``, as :meth:`CheckpointStorage.read_range` reads them
        (raising :class:`~spate.errors.MissingFileError` or :class:`~spate.errors.CorruptFileError` alike)."""
        if not self._storage.opens_with_a_request:
            return self._storage.read_range(rel, offset, length, context)
        try:
            file = self._kept(rel) or self._opened(rel)
            data = file.read_at(length, offset)
        except (OSError, ValueError):  # ValueError: closed by close() under a late read
            file, data = None, b""
        if len(data) == length:
            return data
        self._forget(rel, file)
        return self._storage.read_range(rel, offset, length, context)  # the ordinary read says what went wrong

    def size(self, rel: str) -> int:
        """The size of ``rel``, as :meth:`CheckpointStorage.size` tells it; on an object store from the file
        opened for the reads that follow (one request for both)."""
        if self._storage.opens_with_a_request:
            try:
                return int((self._kept(rel) or self._opened(rel)).size())
            except (OSError, ValueError):
                self._forget(rel, None)
        return self._storage.size(rel)  # the ordinary way says what went wrong

    def _kept(self, rel: str) -> Any:
        with self._lock:
            file = self._open.get(rel)
            if file is not None:
                self._open.move_to_end(rel)
            return file

    def _opened(self, rel: str) -> Any:
        # the storage's own checks (links, a path inside the root) hold: an object store has no links, and the
        # path is the storage's; a file it cannot open is read the ordinary way, which reports why
        file = self._storage.fs.open_input_file(self._storage.path(rel))
        with self._lock:
            self._open[rel] = file
            while len(self._open) > self._most:
                self._open.popitem(last=False)  # not closed: a thread may be reading through it (no OS resource)
        return file

    def _forget(self, rel: str, file: Any) -> None:
        with self._lock:
            if file is None or self._open.get(rel) is file:
                self._open.pop(rel, None)

    def close(self) -> None:
        with self._lock:
            files, self._open = list(self._open.values()), OrderedDict()
        for file in files:
            file.close()

    def __enter__(self) -> OpenFiles:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()
