"""The checkpoint coordinator: runs on the driver, one per query (checkpoint root), and runs the checkpoint
protocol, composed of the parts that own the other lifecycles of a root.

A checkpoint is complete iff its metadata file exists and verifies. ``start`` takes the root over
(:class:`~spate.checkpoint.takeover.TakeOver`: claim the next fencing epoch, find the latest complete
checkpoint visible under the epochs' seals) and removes orphan files
(:class:`~spate.checkpoint.cleanup.RootCleanup`). ``begin`` plans a checkpoint for every subtask, at the
parallelism the caller gives (the coordinator keeps none of its own: a query's parallelism is its driver's,
:class:`~spate.runtime.query.QueryDriver`); ``acknowledge`` accepts exactly one ack per subtask; ``complete``
checks the fence, writes the metadata with put-if-absent and checks the fence again (a commit that raced a
take-over is reported as fenced, and the new driver's seal keeps it from ever being restored;
:mod:`~spate.checkpoint.completion`), registers the logical files it references, subsumes
checkpoints beyond the retention and has the :class:`~spate.checkpoint.janitor.Janitor` delete every physical
file that is closed and holds nothing a retained checkpoint references (the file registry, shared with file
merging). The sink's side is :class:`~spate.checkpoint.delivery.SinkDelivery`.
"""

from __future__ import annotations

import logging
import posixpath
import time
from dataclasses import dataclass
from typing import Any

from spate.checkpoint.assignment import assign_keyed_state, assign_operator_state, rescale_sources
from spate.checkpoint.cleanup import RootCleanup, live_dirs
from spate.checkpoint.completion import PlannedCheckpoint, completed_metadata, list_change_sets, write_metadata
from spate.checkpoint.delivery import SinkDelivery
from spate.checkpoint.discovery import list_complete_checkpoints
from spate.checkpoint.epochs import EpochLog
from spate.checkpoint.janitor import Janitor
from spate.checkpoint.metadata import CheckpointMetadata, QueryInfo
from spate.checkpoint.protocol import SubtaskAck, SubtaskPlan
from spate.checkpoint.savepoint import restore_source, take_savepoint
from spate.checkpoint.takeover import TakeOver
from spate.errors import CheckpointError, InvalidParallelismError, SettingError
from spate.filemerging.manager import in_grant_scope
from spate.filemerging.registry import FileRegistry
from spate.fs import CheckpointStorage
from spate.keygroups import MAX_MAX_PARALLELISM, check_parallelism
from spate.layout import in_worker_dir, metadata_path, subtask_dir, worker_dir

__all__ = ["DEFAULT_RETAINED", "Coordinator", "list_complete_checkpoints"]

log = logging.getLogger(__name__)
DEFAULT_RETAINED = 3


@dataclass
class _Pending:
    planned: PlannedCheckpoint
    acks: dict[int, SubtaskAck]
    unused: set[str]  # physical files an ack of this checkpoint (accepted or not) reported no longer in use

    @property
    def checkpoint_id(self) -> int:
        return self.planned.checkpoint_id

    @property
    def parallelism(self) -> int:
        return self.planned.parallelism


def _referenced(paths: list[str], handles: list[Any]) -> list[str]:
    """The ``paths`` that ``handles`` reference (a plan needs no others)."""
    used = {h.path for h in handles}
    return [path for path in paths if path in used]


class Coordinator:
    """Driver-side checkpoint coordination for one checkpoint root.

    Raises:
        InvalidParallelismError: ``max_parallelism`` not in ``1..32768``, or a parallelism given to :meth:`start`
            or :meth:`begin` below 1 (both ``ValueError``); beyond the max parallelism: IncompatibleStateError.
        SettingError: ``retained`` below 1; a ``root`` that is not a path or URI, or a file.
        FencedError: another driver took the root over (from :meth:`complete` and the protocol's writes).
        CheckpointError: a protocol step out of order (``begin`` before ``start``, ``complete`` of a checkpoint
            that is not pending or lacks acks), a root or ``restore_from`` that cannot be used (NotARootError,
            IncompatibleStateError for another max parallelism); CorruptFileError, MissingFileError: a
            checkpoint file that does not verify or is gone.
    """

    def __init__(self, root: str | CheckpointStorage, *, max_parallelism: int | None = None,
                 retained: int = DEFAULT_RETAINED, restore_from: str | None = None,
                 watermark_delay_ms: int | None = None, max_space_amplification: float = 2.0) -> None:
        self.storage = root if isinstance(root, CheckpointStorage) else CheckpointStorage(root)
        if max_parallelism is not None and not 1 <= max_parallelism <= MAX_MAX_PARALLELISM:
            raise InvalidParallelismError(f"max_parallelism must be in 1..{MAX_MAX_PARALLELISM}, got "
                                          f"{max_parallelism}: pass a number of key groups in that range, or None")
        if retained < 1:
            raise SettingError(f"retained must be >= 1, got {retained}: keep at least one complete checkpoint "
                               f"(default {DEFAULT_RETAINED})")
        self.requested_max_parallelism = max_parallelism
        self.retained = retained
        self.restore_from = restore_from
        self.watermark_delay_ms = watermark_delay_ms
        self.completed: list[CheckpointMetadata] = []
        self.base: CheckpointMetadata | None = None
        self._base_storage: CheckpointStorage | None = None
        self._pending: _Pending | None = None
        self._planned: PlannedCheckpoint | None = None  # the latest checkpoint planned: its subtasks may be writing
        self.epochs = EpochLog(self.storage)
        self.take_over = TakeOver(self.storage, self.epochs, retained, restore_from)
        self.janitor = Janitor(self.storage)
        self.cleanup = RootCleanup(self.storage, self.janitor)
        self.delivery = SinkDelivery(self.storage, self.take_over)
        self.registry = FileRegistry(self.janitor.discard, max_space_amplification)
        self.live_workers: set[str] = set()
        self.run_workers: set[str] = set()  # every worker whose ack a checkpoint of this driver's run holds

    @property
    def query(self) -> QueryInfo | None:
        """The query this driver runs, under the epoch it claimed (None before :meth:`start`)."""
        return self.take_over.query

    @property
    def files_deleted(self) -> int:
        """Files this driver deleted or queued for deletion."""
        return self.janitor.files_deleted

    # -- start ----------------------------------------------------------------------------------------
    def start(self, parallelism: int) -> CheckpointMetadata | None:
        """Take over the root for a query starting at ``parallelism`` subtasks (claim the next epoch, fencing older
        drivers), discover the latest complete checkpoint, remove orphans. Returns the checkpoint the query
        resumes from (None for a fresh start). A new root's max parallelism follows from ``parallelism`` unless
        one was asked for; a root's refuses a larger ``parallelism``."""
        if parallelism < 1:
            raise InvalidParallelismError(f"parallelism must be >= 1, got {parallelism}: pass the number of subtasks "
                                          "as a positive int")
        resumed = self.take_over.start(parallelism, self.requested_max_parallelism, self.delivery.delivered_upto)
        assert self.query is not None
        self.completed, savepoint = resumed.completed, resumed.savepoint
        for meta in self.completed:
            self._register(meta)
        for rel, size in self.cleanup.remove_orphans(self.completed, self.epochs, self.query.epoch):
            self.registry.track(rel, size)
        self.base = self.completed[-1] if self.completed else savepoint
        self._base_storage = self.storage if self.completed or savepoint is None else \
            restore_source(self.restore_from)[0]  # type: ignore[arg-type]
        self.take_over.prune(self.completed)
        return self.base

    def _register(self, meta: CheckpointMetadata) -> None:
        for ref in meta.segments():
            self.registry.register(ref, meta.checkpoint_id)

    # -- one checkpoint -------------------------------------------------------------------------------
    @property
    def max_parallelism(self) -> int:
        assert self.query is not None, "call start() first"
        return self.query.max_parallelism

    @property
    def latest(self) -> CheckpointMetadata | None:
        return self.completed[-1] if self.completed else None

    @property
    def next_checkpoint_id(self) -> int:
        return self.base.checkpoint_id + 1 if self.base is not None else 0

    def begin(self, checkpoint_id: int, parallelism: int, processing_time_ms: int | None = None,
              rescale_reason: str | None = None) -> list[SubtaskPlan]:
        """Plan checkpoint ``checkpoint_id`` (= micro-batch) for each of ``parallelism`` subtasks. At another
        parallelism than the base's, the base's state is redistributed as on a restart (keyed state by key group,
        operator state by the FLIP-8 rules); ``rescale_reason`` (why the parallelism changed while the query ran,
        None: at its start) is recorded in the metadata of the checkpoint that rescales.

        Raises:
            CheckpointError: :meth:`start` was not called, or ``checkpoint_id`` is not newer than the base.
            InvalidParallelismError: ``parallelism`` is not an int >= 1.
            IncompatibleStateError: ``parallelism`` exceeds the max parallelism.
        """
        if self.query is None:
            raise CheckpointError("Coordinator.start() must be called before begin()")
        check_parallelism(parallelism, self.max_parallelism)
        if self._pending is not None:
            self._abort(self._pending, "superseded by a new checkpoint", writing=parallelism)
        restored_elsewhere = self._base_storage is not None and self._base_storage is not self.storage
        if self.base is not None and not restored_elsewhere and checkpoint_id <= self.base.checkpoint_id:
            # a base restored from another root (restore_from): this root's ids start anew, as Spark's batch ids
            raise CheckpointError(f"checkpoint {checkpoint_id} is not newer than the latest complete "
                                  f"checkpoint {self.base.checkpoint_id}")
        now = int(time.time() * 1000) if processing_time_ms is None else processing_time_ms
        p, base = parallelism, self.base
        keyed: list[list] = [[] for _ in range(p)]
        changelog: list[list] = [[] for _ in range(p)]
        operator: list[list] = [[] for _ in range(p)]
        sources: list[list] = [[] for _ in range(p)]
        if base is not None:
            keyed = assign_keyed_state([s.keyed for s in base.subtasks], base.max_parallelism, p)
            changelog = assign_keyed_state([s.changelog for s in base.subtasks], base.max_parallelism, p)
            operator = assign_operator_state([s.operator for s in base.subtasks], p)
            if not base.is_savepoint and self._base_storage is self.storage:  # local copies exist of this root only
                sources = rescale_sources([(s.keyed, s.changelog) for s in base.subtasks], base.max_parallelism, p)
        self._planned = PlannedCheckpoint(checkpoint_id, p, now, rescale_reason)
        self._pending = _Pending(self._planned, {}, set())
        open_files, non_reusable = self.registry.open_files, self.registry.non_reusable
        return [SubtaskPlan(
            checkpoint_id=checkpoint_id, index=i, parallelism=p, max_parallelism=self.max_parallelism,
            query_id=self.query.query_id, epoch=self.query.epoch, checkpoint_uri=self.storage.uri,
            base_checkpoint_id=base.checkpoint_id if base else None,
            base_uri=self._base_storage.uri if base and self._base_storage else None,
            base_is_savepoint=bool(base and base.is_savepoint), keyed=keyed[i], changelog=changelog[i],
            operator=operator[i],
            processing_time_ms=now, watermark_ms=base.watermark_ms if base else None,
            late_watermark_ms=base.batch_watermark_ms if base else None,
            open_files=[f for f in open_files if in_grant_scope(f, subtask_dir(i, p))],
            non_reusable=_referenced(non_reusable, keyed[i] + changelog[i])
            + self._other_runs_files(keyed[i] + changelog[i], p),
            base_parallelism=base.parallelism if base else None, rescale_sources=sources[i],
            base_state_entries=base.subtasks[i].state_entries if base and base.parallelism == p else None)
            for i in range(p)]

    def _other_runs_files(self, handles: list[Any], parallelism: int) -> list[str]:
        """After a rescale (the base has another parallelism): the files of ``handles`` in the private
        directories of workers not of this run, whose segments a subtask re-writes into its own directories
        (within the rewrite budget per checkpoint, as those in another subtask's directory) so that the old
        directories go once nothing names them. Otherwise (a restart at the same parallelism, or
        a subtask moving between workers: Spark's Python workers are not sticky) they stay where they are,
        until the next materialization leaves them unreferenced: no copy per move or restart."""
        if self.base is None or self.base.parallelism == parallelism:
            return []
        mine = tuple(worker_dir(w) + "/" for w in self.run_workers)
        return sorted({h.path for h in handles if in_worker_dir(h.path) and not h.path.startswith(mine)})

    def acknowledge(self, ack: SubtaskAck) -> bool:
        """Accept the first ack of each subtask for the pending checkpoint; refuse any other. The files a
        refused attempt wrote are deleted once nothing references them, so a retried or speculative attempt
        can never leave two versions of a subtask."""
        pending = self._pending
        valid = (pending is not None and ack.checkpoint_id == pending.checkpoint_id
                 and self.query is not None and ack.epoch == self.query.epoch
                 and 0 <= ack.index < pending.parallelism and ack.index not in pending.acks)
        for path, (size, _in_use) in ack.files.items():
            self.registry.track(path, size)
        unused = [path for path, (_size, in_use) in ack.files.items() if not in_use]
        if not valid:
            if pending is not None:
                pending.unused.update(unused)
            else:
                self._sweep(unused, self._planned.parallelism if self._planned is not None else 0)
            return False
        pending.acks[ack.index] = ack  # type: ignore[union-attr]
        pending.unused.update(unused)  # type: ignore[union-attr]
        return True

    def complete(self, checkpoint_id: int) -> CheckpointMetadata:
        """Write ``chk-<n>/_metadata``; afterwards checkpoint n is the one any restart resumes from."""
        pending = self._pending
        if pending is None or pending.checkpoint_id != checkpoint_id:
            raise CheckpointError(f"checkpoint {checkpoint_id} is not pending")
        missing = sorted(set(range(pending.parallelism)) - set(pending.acks))
        if missing:
            raise CheckpointError(f"checkpoint {checkpoint_id} lacks acks of subtasks {missing}")
        assert self.query is not None
        self.take_over.check()
        acks = [pending.acks[i] for i in range(pending.parallelism)]
        meta = completed_metadata(pending.planned, acks, self.query, self.base, self.watermark_delay_ms)
        base = self.base
        same = base is not None and self._base_storage is self.storage and base.parallelism == meta.parallelism
        list_change_sets(self.storage, meta, base if same else None)
        write_metadata(self.storage, self.take_over, meta)
        self.take_over.check()  # a take-over that raced the write: the new driver's seal decides
        self._pending = None
        self.take_over.mark_completed()
        self.completed.append(meta)
        self.base, self._base_storage = meta, self.storage
        self._register(meta)
        self.live_workers = {a.worker for a in acks if a.worker}
        self.run_workers |= self.live_workers
        deleted = self.registry.set_open({p for a in acks for p, (_size, in_use) in a.files.items() if in_use})
        deleted += self._subsume()
        deleted += self.registry.sweep(pending.unused)
        self.registry.control_space()
        self._remove_dead_dirs(deleted, pending.parallelism)
        return meta

    def fail(self, checkpoint_id: int, error: BaseException) -> None:
        """A batch failed: abort its checkpoint, and raise :class:`FencedError` instead if a newer driver took
        the root over (the failure is then a consequence of the take-over). The caller re-raises ``error``."""
        self.abort(checkpoint_id, f"batch failed: {type(error).__name__}")
        if isinstance(error, Exception):
            self.take_over.raise_if_fenced(error)

    def abort(self, checkpoint_id: int, reason: str = "") -> None:
        """Give up checkpoint ``checkpoint_id``: delete the files its acks wrote."""
        pending = self._pending
        if pending is None or pending.checkpoint_id != checkpoint_id:
            return
        self._abort(pending, reason, writing=pending.parallelism)

    def _abort(self, pending: _Pending, reason: str, writing: int) -> None:
        """Abort ``pending``; ``writing``: the parallelism whose subtasks may write next (their directories stay)."""
        log.info("aborting checkpoint %d: %s", pending.checkpoint_id, reason)
        self._pending = None
        if self.storage.exists(metadata_path(pending.checkpoint_id)):
            return  # the metadata write went through (e.g. it timed out after the PUT): keep every file
        self._sweep(list(pending.unused), writing)

    def _subsume(self) -> list[str]:
        while len(self.completed) > self.retained:
            self.janitor.drop_checkpoint(self.completed.pop(0).checkpoint_id)
        return self.registry.unregister_unused(self.completed[0].checkpoint_id)

    def _sweep(self, paths: list[str], writing: int) -> None:
        """Delete those of ``paths`` that nothing references and no worker appends to."""
        self._remove_dead_dirs(self.registry.sweep(paths), writing)

    def _remove_dead_dirs(self, deleted: list[str], writing: int) -> None:
        """Remove the directories the deletion of ``deleted`` may have emptied, if no worker writes there: the
        subtasks at parallelism ``writing`` (those planned), the workers of the latest checkpoint."""
        self.cleanup.remove_dead_dirs([posixpath.dirname(p) for p in deleted], self.registry.directories(),
                                      live_dirs(writing, self.live_workers))

    # -- sink delivery --------------------------------------------------------------------------------
    def undelivered(self) -> list[CheckpointMetadata]:
        """Retained complete checkpoints with staged outputs the sink has not confirmed, oldest first."""
        return self.delivery.undelivered(self.completed)

    def staged_outputs(self, meta: CheckpointMetadata, allow_pickle: bool = False) -> list[Any]:
        """The output rows checkpoint ``meta``'s subtasks staged for the sink, in subtask order."""
        return self.delivery.staged_outputs(meta, allow_pickle)

    def mark_delivered(self, checkpoint_id: int) -> None:
        """Record that the sink received checkpoint ``checkpoint_id``'s outputs (and every earlier one's)."""
        self.delivery.mark_delivered(checkpoint_id)

    # -- background deletion --------------------------------------------------------------------------
    def drain(self) -> None:
        """Wait until every discarded file is deleted."""
        self.janitor.drain()

    def close(self) -> None:
        self.janitor.close()

    # -- savepoints -----------------------------------------------------------------------------------
    def savepoint(self, target_uri: str | None = None, checkpoint_id: int | None = None) -> str:
        """Copy a retained checkpoint (default: the latest) into a self-contained, relocatable directory
        (default ``<root>/savepoints/savepoint-<n>-<random>``). Returns its URI.

        Raises:
            CheckpointError: no such retained complete checkpoint.
            SettingError: ``target_uri`` is inside the checkpoint root (outside ``savepoints/``), where orphan
                cleanup would delete it.
        """
        metas = {m.checkpoint_id: m for m in self.completed}
        cid = checkpoint_id if checkpoint_id is not None else (self.latest.checkpoint_id if self.latest else None)
        if cid is None or cid not in metas:
            raise CheckpointError(f"no retained complete checkpoint {cid if cid is not None else ''} to take a "
                                  f"savepoint of; retained: {sorted(metas)}")
        return take_savepoint(self.storage, metas[cid], target_uri)
