"""The janitor: deletes what no retained checkpoint needs any more, in the background and in order.

Deleting big files must not hold up the checkpoint that subsumed them, so the coordinator hands deletions to
its :class:`Janitor`, which runs them one at a time, in submission order, on a worker thread of its own (a
directory is emptied only after the file deletions queued before it). A crash before a deletion happens
leaves an orphan for the next start's cleanup.

The queue is bounded: a submitter finding it full waits for room (a deletion is never dropped). The worker
starts with the first deletion and ends when the queue is empty, so an idle janitor holds no thread;
:meth:`Janitor.drain` waits for every queued deletion and raises the first one that failed,
:meth:`Janitor.close` drains and joins the worker.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from spate.fs import CheckpointStorage
from spate.layout import checkpoint_dir, is_spate_file, metadata_path, staged_dir

log = logging.getLogger(__name__)
QUEUE_SIZE = 1024  # deletions waiting for the worker before a submitter waits for room


class Janitor:
    """Deletes the files and directories of one checkpoint root that nothing needs any more."""

    def __init__(self, storage: CheckpointStorage, queue_size: int = QUEUE_SIZE) -> None:
        if queue_size < 1:
            raise ValueError(f"queue_size must be >= 1, got {queue_size}")
        self.storage = storage
        self.queue_size = queue_size
        self.files_deleted = 0  # files deleted or queued for deletion
        self._tasks: deque[tuple[Callable[..., Any], tuple[Any, ...]]] = deque()
        self._changed = threading.Condition()
        self._worker: threading.Thread | None = None
        self._busy = False  # the worker runs a task taken off the queue
        self._failure: BaseException | None = None  # the first failed deletion since the last drain
        self._closed = False

    # -- what gets deleted ----------------------------------------------------------------------------
    def discard(self, rel: str) -> None:
        """Delete a physical file no retained checkpoint needs, in the background (:meth:`delete_file`)."""
        self._count(1)
        self._submit(self.delete_file, rel)

    def drop_checkpoint(self, checkpoint_id: int) -> None:
        """Delete a subsumed checkpoint: its metadata now (from then on it is not complete, whatever happens
        next), its own directories in the background. The state files it referenced go by the registry."""
        self._count(int(self.storage.delete(metadata_path(checkpoint_id))))
        self._submit(self._delete_dirs, checkpoint_id)

    def remove_empty_dirs(self, directory: str) -> None:
        """Remove ``directory`` and the empty directories below it, after the deletions queued before."""
        self._submit(self.storage.remove_empty_dirs, directory)

    def delete_now(self, rels: list[str]) -> None:
        """Delete ``rels`` in the caller's thread (orphans, whose removal must precede new writes)."""
        for rel in rels:
            self.storage.delete(rel)
        self._count(len(rels))

    def delete_file(self, rel: str) -> None:
        """Delete ``rel`` now, if spate's layout names it."""
        if is_spate_file(rel):  # a path from metadata: never delete what spate does not name so
            self.storage.delete(rel)
        else:
            log.warning("not deleting %s: not a file spate writes", self.storage.path(rel))

    def _delete_dirs(self, checkpoint_id: int) -> None:
        for directory in (checkpoint_dir(checkpoint_id), staged_dir(checkpoint_id)):
            self.storage.delete_dir(directory)

    def _count(self, files: int) -> None:
        with self._changed:
            self.files_deleted += files

    # -- the worker -----------------------------------------------------------------------------------
    def _submit(self, fn: Callable[..., Any], *args: Any) -> None:
        with self._changed:
            if self._closed:
                raise RuntimeError(f"the janitor of {self.storage.uri} is closed")
            while len(self._tasks) >= self.queue_size:
                self._changed.wait()
            self._tasks.append((fn, args))
            if self._worker is None:
                worker = threading.Thread(target=self._work, name="spate-janitor")
                try:
                    worker.start()
                except BaseException:  # no thread, no queued work that would wait for one forever
                    self._tasks.pop()
                    raise
                self._worker = worker

    def _work(self) -> None:
        while True:
            with self._changed:
                if not self._tasks:
                    self._worker = None
                    self._changed.notify_all()
                    return
                fn, args = self._tasks.popleft()
                self._busy = True
                self._changed.notify_all()  # room in the queue
            try:
                fn(*args)
            except BaseException as e:  # kept for drain(); the next deletions still run
                with self._changed:
                    self._failure = self._failure or e
            finally:
                with self._changed:
                    self._busy = False

    def drain(self) -> None:
        """Wait until every queued deletion ran; raise the first that failed since the last drain."""
        with self._changed:
            while self._tasks or self._busy:
                self._changed.wait()
            failure, self._failure = self._failure, None
        if failure is not None:
            raise failure

    def close(self) -> None:
        """Refuse new deletions, let the queued ones run and join the worker; raise the first that failed."""
        with self._changed:
            self._closed = True
        try:
            self.drain()
        finally:
            with self._changed:
                worker = self._worker
            if worker is not None:
                worker.join()
