"""The services a worker process keeps for one checkpoint root, shared by its subtasks of that root.

One :class:`WorkerServices` per (checkpoint root, worker process), owned by whoever owns the worker: a
:class:`~spate.runtime.local.LocalRunner` makes one and closes it in ``close()``; on Spark the Python worker's
registry (:class:`spate.spark.task.WorkerSubtasks`) keeps one per root and closes it with the subtasks it
served. Nothing here is process-wide: closing the services stops every thread they started, and a later owner
of the same root starts afresh (a new worker directory for merged files).
"""

from __future__ import annotations

import functools
from concurrent.futures import Executor, ThreadPoolExecutor

from spate.changelog.state import ChangelogConfig, ChangelogServices
from spate.changelog.upload import BatchingUploadScheduler
from spate.filemerging.config import FileMergingConfig
from spate.filemerging.manager import FileMergingManager
from spate.fs import CheckpointStorage
from spate.snapshot.verify import VerifiedSpans
from spate.state.overlay import SharedReaders

MATERIALIZER_THREADS = 2  # materializations of one worker's subtasks that run at once


class WorkerServices:
    """Storage, file-merging manager, changelog upload scheduler and materializer threads of one checkpoint
    root in one worker process.

    Args:
        uri: the checkpoint root.
        file_merging: the file-merging settings (None: merging off, no manager).
        changelog: the changelog settings (None: changelog off, no scheduler and no materializer threads).
        readers: the process's :class:`SharedReaders`, when several workers are simulated in one process.
    """

    def __init__(self, uri: str, file_merging: FileMergingConfig | None = None,
                 changelog: ChangelogConfig | None = None, readers: SharedReaders | None = None) -> None:
        self.storage = CheckpointStorage(uri)
        self.merging = FileMergingManager(self.storage, file_merging) if file_merging is not None else None
        # what the changelogs of the worker's subtasks share (None: changelog off)
        self.changelog_services: ChangelogServices | None = None
        if changelog is not None:
            merging = self.merging
            self.changelog_services = ChangelogServices(
                BatchingUploadScheduler(self.storage, changelog.upload,
                                        merging.changelog_writer if merging is not None else None),
                ThreadPoolExecutor(MATERIALIZER_THREADS, thread_name_prefix="spate-materialize"),
                functools.partial(merging.shared_writer, alone=True) if merging is not None else None)
        self._read_only: dict[str, CheckpointStorage] = {}
        self._verified: dict[str, VerifiedSpans] = {}  # per checkpoint URI read: spans checked (bounded each)
        self.trusted_local: set[str] = set()  # local lmdb directories this worker wrote or checked (digest)
        # read-only lmdb files open in this worker (bases of rescaled tables); lmdb opens a file once per process,
        # so workers simulated in one process pass one
        self.readers = readers or SharedReaders()
        self.closed = False

    @property
    def uri(self) -> str:
        return self.storage.uri

    @property
    def scheduler(self) -> BatchingUploadScheduler | None:
        """The changelog upload scheduler of the worker's subtasks (None: changelog off)."""
        return self.changelog_services.scheduler if self.changelog_services is not None else None

    @property
    def materializers(self) -> Executor | None:
        """The threads that write the worker's subtasks' materializations (None: changelog off)."""
        return self.changelog_services.materializers if self.changelog_services is not None else None

    def storage_of(self, uri: str) -> CheckpointStorage:
        """Storage to read ``uri`` (the root itself, or a savepoint a query was restored from)."""
        if uri == self.storage.uri:
            return self.storage
        storage = self._read_only.get(uri)
        if storage is None:
            storage = self._read_only[uri] = CheckpointStorage(uri)
        return storage

    def verified_spans(self, uri: str) -> VerifiedSpans:
        """The spans of ``uri``'s files this worker checked already (:func:`~spate.snapshot.verify.verify_handles`):
        each is read once while remembered."""
        spans = self._verified.get(uri)
        if spans is None:
            spans = self._verified[uri] = VerifiedSpans()
        return spans

    def checkpoint_completed(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` of this root completed (a driver in this process learned it)."""
        if self.merging is not None:
            self.merging.checkpoint_completed(checkpoint_id)

    def close(self, latest_completed: int | None = None) -> None:
        """Stop every service, after the subtasks using them closed: materializations finish, pending uploads
        are written (through the file-merging manager, which closes last). ``latest_completed``: the newest
        checkpoint known complete, so the manager knows the coordinator owns its files."""
        if self.closed:
            return
        self.closed = True
        if self.materializers is not None:
            self.materializers.shutdown(wait=True)
        if self.scheduler is not None:
            self.scheduler.close()
        if self.merging is not None:
            if latest_completed is not None:
                self.merging.checkpoint_completed(latest_completed)
            self.merging.close()
