"""The worker side of file merging: physical files, their pools, and what a worker tells the coordinator.

One :class:`FileMergingManager` per worker process and checkpoint root, owned by the worker's services
(:class:`spate.runtime.services.WorkerServices`). Shared state (keyed snapshots, materializations) is merged
per subtask under ``shared/subtask-<i>-<P>/``; private state (operator state, staged outputs) and change files
per worker under ``taskowned/<worker-id>/``, in separate physical files: private state dies with its
checkpoint's retention, change sets only after the next materialization, and mixing lifetimes in one file
would leave it half dead for long. Physical files get random names and are created exclusively, so nothing is
ever overwritten.

The coordinator decides when a physical file can go: no live segment references it and it is not in use.
A worker reports each file as in use while it is open for appends or holds a segment not yet settled: written
but neither discarded by its owner nor referenced by a completed checkpoint (a materialization for a later
checkpoint, change sets an aborted checkpoint included and the retry will include again). Workers append only
to files the coordinator still grants them in the plan (a worker that missed checkpoints, or whose file became
non-reusable, closes it). Notifications are watermarks: a plan says which checkpoint completed last, and
everything up to it is settled, however many plans a worker missed.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Collection, Iterable
from typing import Any

from spate.errors import CheckpointError, naming_disk_full
from spate.filemerging.config import FileMergingConfig
from spate.fs import CheckpointStorage
from spate.layout import (
    SEGMENT_FILE_SUFFIX,
    data_file,
    in_worker_dir,
    random_name,
    subtask_dir,
    worker_dir,
)
from spate.segments import FileRef


def in_grant_scope(path: str, subtask_directory: str) -> bool:
    """Whether a plan for the subtask owning ``subtask_directory`` grants or revokes ``path``: the subtask's
    own shared files and every worker's private files (the worker that will run the subtask is not known)."""
    return path.startswith(subtask_directory + "/") or in_worker_dir(path)


class PhysicalFile:
    """A physical file open for appending. Local files are written unbuffered, so every segment is readable
    (and survives a crash of this process) as soon as ``append`` returns; object-store files become readable
    when closed."""

    def __init__(self, storage: CheckpointStorage, path: str, checkpoint_id: int, linked: int | None = None) -> None:
        self.path = path
        self.created_in = checkpoint_id
        self.created_epoch = 0  # the driver epoch whose plan was current when it was created
        self.size = 0 if linked is None else linked
        self.closed = linked is not None  # ``linked``: the size of a whole file linked in (closed, nothing to append)
        self.revoked = False  # the coordinator no longer grants it: appends must stop
        self.lock = threading.Lock()
        self._out: Any = storage.open_new(path) if linked is None else None
        self._counts = storage.counts
        self.readable_while_open = storage.open_files_readable
        self.held: dict[int, int | None] = {}  # offset of an unsettled segment -> latest checkpoint including it

    @property
    def in_use(self) -> bool:
        return not self.closed or bool(self.held)

    def append(self, data: bytes) -> int:
        """Write ``data`` at the end; returns its offset (caller holds the file from its pool)."""
        offset = self.size
        view = memoryview(data)
        while view:
            n = self._out.write(view)
            view = view[n if n is not None else len(view):]
        self.size += len(data)
        self._counts.add(self.path, written=len(data))
        return offset

    def append_parts(self, parts: Iterable[bytes]) -> tuple[int, int]:
        """Append ``parts`` one after the other: (offset of the first, their total size)."""
        offset = self.size
        for part in parts:
            self.append(part)
            del part  # not kept while the next part is made (a large state's key group)
        return offset, self.size - offset

    def close(self) -> None:
        with self.lock:
            if not self.closed:
                self.closed = True
                self._out.close()


class FilePool:
    """Physical files of one directory (and, merging within checkpoints, of one checkpoint) taking segments.

    Non-blocking: a writer takes a free file or creates one; blocking: at most one file, writers wait for it.
    A file returns to the pool only while below the maximum size."""

    def __init__(self, manager: FileMergingManager, directory: str, checkpoint_id: int) -> None:
        self.manager, self.directory, self.checkpoint_id = manager, directory, checkpoint_id
        self._free: list[PhysicalFile] = []
        self._busy: set[PhysicalFile] = set()
        self._cond = threading.Condition()
        self.closed = False

    def take(self, checkpoint_id: int) -> PhysicalFile | None:
        """A file to append to, or None if the pool closed (the caller asks the manager for the current one)."""
        blocking = self.manager.config.blocking_pool
        with self._cond:
            while True:
                if self.closed:
                    return None
                self._free = [f for f in self._free if not f.closed]
                if self._free:
                    f = self._free.pop()
                    break
                if not blocking or not self._busy:
                    f = self.manager.new_file(self.directory, checkpoint_id)
                    break
                self._cond.wait()
            self._busy.add(f)
            return f

    def give_back(self, f: PhysicalFile) -> None:
        with self._cond:
            self._busy.discard(f)
            keep = not (self.closed or f.revoked or f.closed or f.size >= self.manager.config.max_file_size)
            if keep:
                self._free.append(f)
            self._cond.notify_all()
        if not keep:
            f.close()

    def files(self) -> list[PhysicalFile]:
        with self._cond:
            return [*self._free, *self._busy]

    def revoke(self, f: PhysicalFile) -> None:
        """Stop using ``f``: closed now if free, when given back if busy."""
        with self._cond:
            f.revoked = True
            busy = f in self._busy
            if not busy and f in self._free:
                self._free.remove(f)
        if not busy:
            f.close()

    def close(self) -> None:
        with self._cond:
            self.closed = True
            free, self._free = self._free, []
            self._cond.notify_all()
        for f in free:
            f.close()


class PooledWriter:
    """Writes logical files as segments of the physical files of one directory's pool (of checkpoint
    ``checkpoint_id`` when merging within checkpoints: a write that comes after that checkpoint's pool closed,
    such as a long materialization, goes to the current checkpoint's pool).

    ``alone``: each logical file gets a physical file of its own, closed once written (materializations: large,
    and dead all at once when the next one replaces them; sharing a file would leave the next materialization
    beside a dead one, and space control would then copy the whole live state out of it)."""

    def __init__(self, manager: FileMergingManager, directory: str, kind: str, checkpoint_id: int,
                 alone: bool = False) -> None:
        self.manager, self.directory, self.kind, self.checkpoint_id = manager, directory, kind, checkpoint_id
        self.alone = alone

    @property
    def pool(self) -> FilePool:
        cp = max(self.checkpoint_id, self.manager.current_checkpoint)
        return self.manager.pool(self.directory, cp, self.kind)

    def write(self, data: bytes) -> FileRef:
        return self.write_parts((data,))

    def write_parts(self, parts: Iterable[bytes]) -> FileRef:
        """One logical file from ``parts`` as they come, appended to one physical file."""
        if self.alone:
            return self._write_alone(parts)
        while True:
            pool = self.pool
            f = pool.take(self.checkpoint_id)
            if f is None:
                continue
            try:
                with f.lock:  # the hold is taken before anyone can close the file and report it unused
                    if f.closed:
                        continue  # closed meanwhile (object stores close files at acknowledgement)
                    try:
                        with naming_disk_full(self.manager.storage.path(f.path), self.checkpoint_id):
                            offset, size = f.append_parts(parts)
                    except BaseException:
                        f.revoked = True  # part of the data may be in the file: never append after it
                        raise
                    with self.manager.lock:
                        f.held[offset] = None
                    return FileRef(f.path, offset, size)
            finally:
                pool.give_back(f)

    def _write_alone(self, parts: Iterable[bytes]) -> FileRef:
        f = self.manager.new_file(self.directory, self.checkpoint_id)
        try:
            with f.lock:
                with naming_disk_full(self.manager.storage.path(f.path), self.checkpoint_id):
                    offset, size = f.append_parts(parts)
                with self.manager.lock:
                    f.held[offset] = None
        except BaseException:
            f.revoked = True
            raise
        finally:
            f.close()
        return FileRef(f.path, offset, size)

    def link_in(self, local_path: str) -> FileRef | None:
        """Writing each logical file alone: ``local_path`` linked in as a physical file of its own."""
        if not self.alone:
            return None
        f = self.manager.link_file(self.directory, self.checkpoint_id, local_path)
        return None if f is None else FileRef(f.path, 0, f.size)

    def discard(self, ref: FileRef) -> None:
        """No checkpoint will reference ``ref``: its bytes are waste until the coordinator deletes the file."""
        self.manager.settle([ref])


class FileMergingManager:
    """Pools, physical files and directory ownership of one worker process for one checkpoint root."""

    def __init__(self, storage: CheckpointStorage, config: FileMergingConfig, worker_id: str | None = None) -> None:
        self.storage, self.config = storage, config
        self.worker_id = worker_id or random_name()[:16]
        self.worker_dir = worker_dir(self.worker_id)
        self._pools: dict[tuple[str, str, int], FilePool] = {}
        self._files: dict[str, PhysicalFile] = {}  # open, or closed but not yet reported in a completed checkpoint
        self._reported: dict[str, int] = {}  # closed file -> latest checkpoint whose ack reported it
        self._created: list[str] = []
        self._first_checkpoint: int | None = None
        self.coordinator_owns = False  # a checkpoint completed after this manager started writing
        self.current_checkpoint = -1  # the newest checkpoint a plan arrived for
        self.current_epoch = 0  # the newest driver epoch a plan arrived from
        self.closed = False
        self._named: set[str] = set()  # files an ack named: a checkpoint that completed may reference them
        self.lock = threading.Lock()

    # -- writing ---------------------------------------------------------------------------------------
    def shared_writer(self, index: int, parallelism: int, checkpoint_id: int, alone: bool = False) -> PooledWriter:
        """Writer for subtask ``index``'s shared state (keyed snapshots) in checkpoint ``checkpoint_id``;
        ``alone``: a physical file per logical file (materializations)."""
        return PooledWriter(self, subtask_dir(index, parallelism), "shared", checkpoint_id, alone)

    def private_writer(self, checkpoint_id: int) -> PooledWriter:
        """Writer for this worker's private state (operator state, staged outputs) in ``checkpoint_id``."""
        return PooledWriter(self, self.worker_dir, "private", checkpoint_id)

    def changelog_writer(self, checkpoint_id: int) -> PooledWriter:
        """Writer for this worker's change files in checkpoint ``checkpoint_id``."""
        return PooledWriter(self, self.worker_dir, "changelog", checkpoint_id)

    def pool(self, directory: str, checkpoint_id: int, kind: str) -> FilePool:
        key = (directory, kind, -1 if self.config.across else checkpoint_id)
        with self.lock:
            if self.closed:
                raise CheckpointError(f"the file-merging manager of worker {self.worker_id} is closed")
            if self._first_checkpoint is None:
                self._first_checkpoint = checkpoint_id
            pool = self._pools.get(key)
            if pool is None or pool.closed:
                pool = self._pools[key] = FilePool(self, directory, checkpoint_id)
            return pool

    def new_file(self, directory: str, checkpoint_id: int) -> PhysicalFile:
        path = data_file(directory, SEGMENT_FILE_SUFFIX)
        with naming_disk_full(self.storage.path(path), checkpoint_id):
            f = PhysicalFile(self.storage, path, checkpoint_id)
        self._add(f)
        return f

    def link_file(self, directory: str, checkpoint_id: int, local_path: str) -> PhysicalFile | None:
        """The finished local file ``local_path`` linked in as a closed physical file of ``directory`` holding one
        segment (None: the storage cannot link it)."""
        path = data_file(directory, SEGMENT_FILE_SUFFIX)
        with naming_disk_full(self.storage.path(path), checkpoint_id):  # a new directory entry may not fit
            size = self.storage.link_in(path, local_path)
        if size is None:
            return None
        f = PhysicalFile(self.storage, path, checkpoint_id, linked=size)
        f.held[0] = None
        self._add(f)
        return f

    def _add(self, f: PhysicalFile) -> None:
        with self.lock:
            f.created_epoch = self.current_epoch
            self._files[f.path] = f
            self._created.append(f.path)

    # -- the checkpoint protocol ------------------------------------------------------------------------
    def begin(self, checkpoint_id: int, completed: int | None, granted: Collection[str] | None = None,
              epoch: int = 0, scope: str | None = None) -> None:
        """A plan for ``checkpoint_id`` of driver epoch ``epoch`` arrived, based on the latest completed
        checkpoint ``completed``.

        Within-checkpoint pools of earlier checkpoints close (they completed or were aborted). Files created
        before ``checkpoint_id``, or under an older driver (whose restart may have deleted them as orphans,
        for the same checkpoint id), that the coordinator does not grant (``granted``: None = all) are
        closed. A subtask's plan grants only files of its own shared directory ``scope`` and workers' files:
        files of other subtasks' directories are then left alone."""
        if completed is not None:
            self.checkpoint_completed(completed)
        with self.lock:
            self.current_checkpoint = max(self.current_checkpoint, checkpoint_id)
            self.current_epoch = max(self.current_epoch, epoch)
            pools = list(self._pools.items())
        for key, pool in pools:
            if key[2] != -1 and key[2] < checkpoint_id:
                pool.close()
                with self.lock:
                    self._pools.pop(key, None)
            elif granted is not None:
                for f in pool.files():
                    if (f.created_in < checkpoint_id or f.created_epoch < epoch) and f.path not in granted \
                            and (scope is None or in_grant_scope(f.path, scope)):
                        pool.revoke(f)

    def checkpoint_completed(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` completed: from now on the coordinator owns this worker's files; closed
        files already reported in an ack of it (or earlier) need no more reports."""
        with self.lock:
            if self._first_checkpoint is not None and checkpoint_id >= self._first_checkpoint:
                self.coordinator_owns = True
            for f in self._files.values():  # included in a checkpoint up to this one: completed or aborted
                for offset in [o for o, cp in f.held.items() if cp is not None and cp <= checkpoint_id]:
                    del f.held[offset]
            for path, cp in list(self._reported.items()):
                if cp <= checkpoint_id and not self._files[path].in_use:
                    del self._reported[path]
                    del self._files[path]

    def sync(self, refs: Iterable[FileRef], checkpoint_id: int) -> None:
        """The ack of ``checkpoint_id`` references ``refs``: make their physical files durable and readable
        (local files already are: unbuffered writes; object-store files are closed) and note the inclusion."""
        by_path: dict[str, list[FileRef]] = {}
        for r in refs:
            by_path.setdefault(r.path, []).append(r)
        for path, mine in by_path.items():
            f = self._files.get(path)
            if f is None:
                continue  # not written by this worker, or settled long ago
            with self.lock:
                for r in mine:
                    if r.offset in f.held:
                        f.held[r.offset] = checkpoint_id
                self._named.add(path)
            if not f.readable_while_open:
                f.revoked = True  # readable only once closed: it takes no more segments
                f.close()

    def settle(self, refs: Iterable[FileRef]) -> None:
        """Their owner gave ``refs`` up: they no longer keep their files in use."""
        with self.lock:
            for r in refs:
                f = self._files.get(r.path)
                if f is not None:
                    f.held.pop(r.offset, None)

    def report(self, checkpoint_id: int) -> dict[str, list]:
        """Every physical file this worker has in use, or stopped using since the last completed checkpoint:
        path → [size, in use]. Carried in each ack of ``checkpoint_id``."""
        with self.lock:
            out = {}
            for f in self._files.values():
                out[f.path] = [f.size, f.in_use]
                self._named.add(f.path)
                if not f.in_use:
                    self._reported[f.path] = checkpoint_id
        return out

    def close(self) -> None:
        """Close every file. If no checkpoint completed since this manager started writing, the files no ack
        ever named cannot be referenced: delete them, and the worker directory if nothing else is in it.
        Otherwise (or for named files: a checkpoint may have completed without this worker hearing of it)
        the coordinator owns them; what no checkpoint references goes by its orphan cleanup."""
        with self.lock:
            self.closed = True
            pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            pool.close()
        for f in list(self._files.values()):
            f.close()
        if not self.coordinator_owns:
            for path in self._created:
                if path not in self._named:
                    self.storage.delete(path)
            if not self._named & set(self._created):
                with contextlib.suppress(OSError):
                    self.storage.delete_dir(self.worker_dir)
        self._created = []

