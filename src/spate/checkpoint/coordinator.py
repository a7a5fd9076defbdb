"""The checkpoint coordinator: runs on the driver, one per query (checkpoint root).

A checkpoint is complete iff its metadata file exists and verifies. A metadata file that exists but fails
verification stops ``start`` with an error naming it, rather than silently falling back to an older
checkpoint (which would hide corruption); deleting that ``chk-<n>`` directory is the explicit fallback.

``start`` claims the next fencing epoch (put-if-absent: of two drivers starting at once exactly one wins),
then finds the latest complete checkpoint *visible* under the epochs' seals (:mod:`spate.checkpoint.epochs`)
and removes orphan files: only files spate's layout names, that no visible checkpoint references, and that
were written before the take-over. ``begin`` plans a checkpoint for every subtask; ``acknowledge`` accepts
exactly one ack per subtask; ``complete`` checks the fence, writes the metadata with put-if-absent and checks
the fence again (a commit that raced a take-over is reported as fenced, and the new driver's seal keeps it
from ever being restored), registers the logical files it references, subsumes checkpoints beyond the
retention and deletes every physical file that is closed and holds nothing a retained checkpoint references
(the file registry, shared with file merging).
"""

from __future__ import annotations

import contextlib
import logging
import posixpath
import re
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from spate.checkpoint.assignment import assign_keyed_state, assign_operator_state, rescale_sources
from spate.checkpoint.epochs import EPOCHS_DIR, EpochLog, EpochState, Seal
from spate.checkpoint.metadata import (
    DELIVERED_FILE,
    METADATA_FILE,
    QUERY_FILE,
    RESCALE_HISTORY,
    CheckpointMetadata,
    QueryInfo,
    SubtaskState,
    checkpoint_dir,
    delivered_path,
    metadata_path,
    read_delivered,
    read_metadata,
    staged_dir,
)
from spate.checkpoint.protocol import SubtaskAck, SubtaskPlan
from spate.checkpoint.savepoint import write_savepoint
from spate.errors import (
    CheckpointError,
    CorruptFileError,
    FencedError,
    IncompatibleStateError,
    MissingFileError,
    naming_disk_full,
)
from spate.filemerging.manager import in_grant_scope, subtask_dir, worker_dir
from spate.filemerging.registry import FileRegistry
from spate.fs import CheckpointStorage, FrameKind, frame, join_uri
from spate.keygroups import MAX_MAX_PARALLELISM, check_parallelism, default_max_parallelism
from spate.layout import is_engine_owned, is_spate_file
from spate.snapshot.outputs import read_outputs

log = logging.getLogger(__name__)
_CHK = re.compile(r"^chk-(\d+)$")
DEFAULT_RETAINED = 3


@dataclass
class _Pending:
    checkpoint_id: int
    parallelism: int
    processing_time_ms: int
    acks: dict[int, SubtaskAck]
    unused: set[str]  # physical files an ack of this checkpoint (accepted or not) reported no longer in use


def _metadata_ids(storage: CheckpointStorage) -> list[int]:
    """Ids of every ``chk-<n>`` directory holding a metadata file, ascending (not yet verified)."""
    ids = [int(m.group(1)) for name in storage.list_dirs() if (m := _CHK.match(name))]
    return sorted(n for n in ids if storage.exists(metadata_path(n)))


@dataclass
class _Discovery:
    """The complete checkpoints of a root as one driver saw them."""

    retained: list[CheckpointMetadata]  # the newest visible ones, ascending
    latest_id: int  # the newest visible id, -1 if none


def _written_by(storage: CheckpointStorage, checkpoint_id: int) -> CheckpointMetadata:
    return read_metadata(storage, metadata_path(checkpoint_id))


def _discover(storage: CheckpointStorage, epochs: EpochState, retained: int) -> _Discovery:
    """Read metadata newest first until ``retained`` visible checkpoints are found (metadata a fenced driver
    wrote after a take-over looked is skipped: it never counts)."""
    found: list[CheckpointMetadata] = []
    for n in reversed(_metadata_ids(storage)):
        if len(found) == retained:
            break
        try:
            meta = _written_by(storage, n)
        except MissingFileError:
            continue  # an older driver subsumed it while this one looked
        if epochs.visible(n, meta.epoch):
            found.append(meta)
    found.reverse()
    return _Discovery(found, found[-1].checkpoint_id if found else -1)


def _referenced(paths: list[str], handles: list[Any]) -> list[str]:
    """The ``paths`` that ``handles`` reference (a plan needs no others)."""
    used = {h.path for h in handles}
    return [path for path in paths if path in used]


def list_complete_checkpoints(storage: CheckpointStorage) -> list[int]:
    """Ids of the complete checkpoints of a root, ascending: those with a metadata file that counts under
    the epochs' seals (not yet verified). A metadata file needs reading only if a seal might exclude it."""
    epochs = EpochLog(storage).read()
    lowest_seal = min((s.sealed for s in epochs.seals.values()), default=None)
    out = []
    for n in _metadata_ids(storage):
        try:
            if lowest_seal is None or n <= lowest_seal or epochs.visible(n, _written_by(storage, n).epoch):
                out.append(n)
        except MissingFileError:
            continue  # subsumed while listing
    return out


class Coordinator:
    """Driver-side checkpoint coordination for one checkpoint root."""

    def __init__(self, root: str | CheckpointStorage, parallelism: int, *, max_parallelism: int | None = None,
                 retained: int = DEFAULT_RETAINED, restore_from: str | None = None,
                 watermark_delay_ms: int | None = None, max_space_amplification: float = 2.0) -> None:
        self.storage = root if isinstance(root, CheckpointStorage) else CheckpointStorage(root)
        if parallelism < 1:
            raise ValueError(f"parallelism must be >= 1, got {parallelism}")
        if max_parallelism is not None and not 1 <= max_parallelism <= MAX_MAX_PARALLELISM:
            raise ValueError(f"max_parallelism must be in 1..{MAX_MAX_PARALLELISM}, got {max_parallelism}")
        if retained < 1:
            raise ValueError(f"retained must be >= 1, got {retained}")
        self.parallelism = parallelism
        self.requested_max_parallelism = max_parallelism
        self.retained = retained
        self.restore_from = restore_from
        self.watermark_delay_ms = watermark_delay_ms
        self.rescale_reason: str | None = None  # why the parallelism changed while running (None: at the start)
        self.query: QueryInfo | None = None
        self.completed: list[CheckpointMetadata] = []
        self.base: CheckpointMetadata | None = None
        self._base_storage: CheckpointStorage | None = None
        self._pending: _Pending | None = None
        self.registry = FileRegistry(self._discard, max_space_amplification)
        self.epochs = EpochLog(self.storage)
        self._seal = Seal(0, -1)
        self._completed_marked = False
        self.live_workers: set[str] = set()
        self.run_workers: set[str] = set()  # every worker whose ack a checkpoint of this driver's run holds
        self.files_deleted = 0
        self._count_lock = threading.Lock()
        self._discarder = ThreadPoolExecutor(1, thread_name_prefix="spate-discard")
        self._discards: list[Future[None]] = []
        self._delivered_upto: int | None = None  # the sink received every checkpoint up to this one

    # -- start ----------------------------------------------------------------------------------------
    def start(self) -> CheckpointMetadata | None:
        """Take over the root (claim the next epoch, fencing older drivers), discover the latest complete
        checkpoint, remove orphans. Returns the checkpoint the query resumes from (None for a fresh start)."""
        self._refuse_foreign_root()
        savepoint = self._read_savepoint() if self.restore_from else None
        query = self._query_file(savepoint)
        self._check_parallelism(query)
        if savepoint is not None and not _metadata_ids(self.storage):
            self._check_savepoint(savepoint, query)  # before the take-over: a refused start fences nobody
        self.query = QueryInfo(query.query_id, query.max_parallelism,
                               self.epochs.claim(max(self.epochs.read().latest, query.epoch)))
        found, epochs = self._seal_take_over()
        self.completed = found.retained
        if self.completed:
            savepoint = None
        elif savepoint is None:
            self._refuse_lost_checkpoints(epochs)
        else:
            self._check_savepoint(savepoint, query)
        self.storage.replace(QUERY_FILE, self.query.to_bytes())  # informational; fences older spate versions
        for meta in self.completed:
            self._register(meta)
        for rel, size in self.remove_orphans():
            self.registry.track(rel, size)
        self.base = self.completed[-1] if self.completed else savepoint
        self._base_storage = self.storage if self.completed or savepoint is None else \
            CheckpointStorage(self.restore_from)  # type: ignore[arg-type]
        self.epochs.prune(min([m.epoch for m in self.completed], default=self.query.epoch), self.query.epoch)
        return self.base

    def _seal_take_over(self) -> tuple[_Discovery, EpochState]:
        """List the complete checkpoints after the claim and seal what was seen: this epoch, and every earlier
        claimed epoch whose driver never sealed (it did nothing yet, and is fenced now). Seals are put-if-absent,
        so a fenced driver's late seal can never change what counts."""
        assert self.query is not None
        epoch = self.query.epoch
        for _attempt in range(8):
            epochs = self.epochs.read()  # after the claim: every commit of an older driver seen now counts
            found = _discover(self.storage, epochs, self.retained)
            try:
                for older in epochs.unsealed_before(epoch):
                    self.epochs.seal(Seal(older, found.latest_id))
            except FileExistsError:
                continue  # that driver sealed meanwhile: look again
            try:
                self.epochs.seal(Seal(epoch, found.latest_id))
            except FileExistsError as e:
                raise FencedError(f"checkpoint root {self.storage.uri} was taken over by another driver while this "
                                  f"one (epoch {epoch}) was starting; only one driver may run per root") from e
            self._seal = Seal(epoch, found.latest_id)
            return found, epochs
        raise CheckpointError(f"could not seal the take-over of {self.storage.uri}: earlier drivers kept sealing; "
                              "is another driver restarting in a loop?")

    def _check_savepoint(self, savepoint: CheckpointMetadata, query: QueryInfo) -> None:
        if savepoint.max_parallelism != query.max_parallelism:
            raise IncompatibleStateError(
                f"savepoint {self.restore_from} was written with max parallelism {savepoint.max_parallelism}, "
                f"but {self.storage.uri} has {query.max_parallelism}; restore it into a new checkpoint root")

    def _refuse_foreign_root(self) -> None:
        """A root without ``_query`` must be empty but for engine directories: spate never adopts (and then
        cleans up) a directory holding someone else's files."""
        entries = self.storage.list_entries()
        if QUERY_FILE in entries:
            return
        if _metadata_ids(self.storage):
            raise CheckpointError(f"{self.storage.path(QUERY_FILE)} is missing but checkpoints exist; the root is "
                                  "damaged: restore it from a backup, or restore a savepoint into a new root")
        foreign = [e for e in entries if not e.startswith("_") and e != "savepoints"]
        if foreign:
            shown = ", ".join(foreign[:5]) + (", ..." if len(foreign) > 5 else "")
            raise CheckpointError(f"{self.storage.uri} is not empty and is not a spate checkpoint root (no "
                                  f"{QUERY_FILE}; it holds {shown}); spate deletes files it does not reference "
                                  "under its root, so give it an empty or new directory")

    def _query_file(self, savepoint: CheckpointMetadata | None) -> QueryInfo:
        """Read ``_query``, or create it (put-if-absent, so racing fresh starts agree on one query id)."""
        info = QueryInfo.read(self.storage)
        if info is not None:
            return info
        max_p = (savepoint.max_parallelism if savepoint else None) or self.requested_max_parallelism or \
            default_max_parallelism(self.parallelism)
        info = QueryInfo(uuid.uuid4().hex, max_p, 0)
        try:
            self.storage.create_exclusive(QUERY_FILE, info.to_bytes())
        except FileExistsError:
            return QueryInfo.read(self.storage) or info
        return info

    def _refuse_lost_checkpoints(self, epochs: EpochState) -> None:
        """A root that had complete checkpoints must not silently start over from batch 0."""
        if epochs.had_checkpoints or self._read_delivered() >= 0:
            seen = max([s.sealed for s in epochs.seals.values()] + [self._read_delivered()])
            upto = f" (up to chk-{seen} at least)" if seen >= 0 else ""
            raise CheckpointError(
                f"checkpoint root {self.storage.uri} had complete checkpoints{upto} "
                f"but none is left: no chk-<n>/{METADATA_FILE} that counts. They were deleted or "
                "damaged outside spate; restore a savepoint (restore_from=...) or start a new checkpoint root")

    def _check_parallelism(self, query: QueryInfo) -> None:
        """Settings that cannot work with the root are refused before taking it over."""
        stored, requested, source = query.max_parallelism, self.requested_max_parallelism, self.storage.uri
        if requested is not None and requested != stored:
            raise IncompatibleStateError(
                f"checkpoint state at {source} was written with max parallelism {stored}, but "
                f"max_parallelism={requested} was requested. Max parallelism (the number of key groups) "
                f"cannot change; set it to {stored} or leave it unset, or start a new checkpoint root")
        if self.parallelism > stored:
            raise IncompatibleStateError(f"parallelism {self.parallelism} exceeds max parallelism {stored} of "
                                         f"{source}; use at most {stored} subtasks")

    def _read_savepoint(self) -> CheckpointMetadata:
        sp = CheckpointStorage(self.restore_from)  # type: ignore[arg-type]
        if not sp.exists(METADATA_FILE):
            raise CheckpointError(f"no savepoint at {self.restore_from}: {sp.path(METADATA_FILE)} is missing")
        return read_metadata(sp, METADATA_FILE)

    def _register(self, meta: CheckpointMetadata) -> None:
        for ref in meta.segments():
            self.registry.register(ref, meta.checkpoint_id)

    def remove_orphans(self) -> list[tuple[str, int]]:
        """Delete the files under the root that are provably orphans: named as spate names its files, written
        before this driver's take-over (a newer driver's files are never touched), and referenced by no
        retained visible checkpoint (leftovers of failed attempts and crashes, half-written physical files,
        subsumed and fenced checkpoints). Savepoints, the query and epoch files, engine directories and files
        spate did not write are kept; links are not followed. Returns the referenced state files that remain,
        with their sizes."""
        assert self.query is not None
        markers = {QUERY_FILE, DELIVERED_FILE} | {metadata_path(m.checkpoint_id) for m in self.completed}
        markers |= {delivered_path(m.checkpoint_id) for m in self.completed}
        referenced = {path for meta in self.completed for path in meta.files()}
        claimed_ns = self.epochs.claim_time_ns(self.query.epoch)
        orphans, kept = [], []
        for f in self.storage.stat_files():
            rel = f.path
            if rel in markers or rel.startswith(("savepoints/", EPOCHS_DIR + "/")) or is_engine_owned(rel):
                continue
            if rel in referenced:
                kept.append((rel, f.size))
            elif is_spate_file(rel) and self._written_before(f.mtime_ns, claimed_ns):
                orphans.append(rel)
        orphans.sort(key=lambda rel: (not rel.endswith("/" + METADATA_FILE), rel))  # a checkpoint dies first
        self.epochs.check(self.query.epoch)
        for rel in orphans:
            self.storage.delete(rel)
        if self.storage.is_local:
            self.storage.remove_empty_dirs()
        if orphans:
            log.info("removed %d orphan files under %s", len(orphans), self.storage.uri)
        self.files_deleted += len(orphans)
        return kept

    def _written_before(self, mtime_ns: int, claimed_ns: int) -> bool:
        """Whether a file was written before the take-over. Object stores keep whole seconds, so a file of
        the take-over's second is kept (removed by a later start) rather than risk a newer driver's."""
        return mtime_ns <= claimed_ns if self.storage.is_local else mtime_ns < claimed_ns

    def _live_dirs(self) -> set[str]:
        """Directories a running worker may write to: this parallelism's subtask directories, the change-file
        directory without merging, and the private directories of the workers of the latest checkpoint."""
        live = {subtask_dir(i, self.parallelism) for i in range(self.parallelism)} | {"shared/changelog"}
        return live | {worker_dir(w) for w in self.live_workers}

    def _remove_dead_dirs(self, candidates: list[str], in_use: set[str], background: bool = True) -> None:
        """Remove directories no worker writes to any more and holding no file in use (an earlier
        parallelism's subtask directories, finished workers' directories) once the registry's deletions left
        them empty. Never their files: a newer driver may be writing into a directory of the same name (a
        subtask directory of its parallelism). Object stores have no directories."""
        if not self.storage.is_local:
            return
        live = self._live_dirs()
        for d in dict.fromkeys(candidates):
            managed = d.startswith(("shared/", "taskowned/"))
            if managed and d not in live and d not in in_use and not any(u.startswith(d + "/") for u in in_use):
                if background:  # after the file deletions queued before
                    self._discards.append(self._discarder.submit(self.storage.remove_empty_dirs, d))
                else:
                    self.storage.remove_empty_dirs(d)

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

    def begin(self, checkpoint_id: int, processing_time_ms: int | None = None) -> list[SubtaskPlan]:
        """Plan checkpoint ``checkpoint_id`` (= micro-batch) for every subtask."""
        if self.query is None:
            raise CheckpointError("Coordinator.start() must be called before begin()")
        if self._pending is not None:
            self.abort(self._pending.checkpoint_id, "superseded by a new checkpoint")
        restored_elsewhere = self._base_storage is not None and self._base_storage is not self.storage
        if self.base is not None and not restored_elsewhere and checkpoint_id <= self.base.checkpoint_id:
            # a base restored from another root (restore_from): this root's ids start anew, as Spark's batch ids
            raise CheckpointError(f"checkpoint {checkpoint_id} is not newer than the latest complete "
                                  f"checkpoint {self.base.checkpoint_id}")
        now = int(time.time() * 1000) if processing_time_ms is None else processing_time_ms
        p, base = self.parallelism, self.base
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
        self._pending = _Pending(checkpoint_id, p, now, {}, set())
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
            + self._other_runs_files(keyed[i] + changelog[i]),
            base_parallelism=base.parallelism if base else None, rescale_sources=sources[i]) for i in range(p)]

    def rescale(self, parallelism: int, reason: str = "requested") -> None:
        """From the next :meth:`begin` on, plan ``parallelism`` subtasks (an online rescale: the base's state is
        redistributed as on a restart, keyed state by key group and operator state by the FLIP-8 rules).
        ``reason`` is recorded in the metadata of the checkpoint that rescales."""
        if self.query is None:
            raise CheckpointError("Coordinator.start() must be called before rescale()")
        check_parallelism(parallelism, self.max_parallelism)
        if parallelism != self.parallelism:
            self.parallelism, self.rescale_reason = parallelism, reason

    def _other_runs_files(self, handles: list[Any]) -> list[str]:
        """After a rescale (the base has another parallelism): the files of ``handles`` in the private
        directories of workers not of this run, whose segments a subtask re-writes into its own directories so
        that the old directories go with the old checkpoints. Otherwise (a restart at the same parallelism, or
        a subtask moving between workers: Spark's Python workers are not sticky) they stay where they are,
        until the next materialization leaves them unreferenced: no copy per move or restart."""
        if self.base is None or self.base.parallelism == self.parallelism:
            return []
        mine = tuple(worker_dir(w) + "/" for w in self.run_workers)
        return sorted({h.path for h in handles if h.path.startswith("taskowned/") and not h.path.startswith(mine)})

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
                self._sweep(unused)
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
        self.epochs.check(self.query.epoch)
        meta = self._build_metadata(pending)
        self._write_metadata(meta)
        self.epochs.check(self.query.epoch)  # a take-over that raced the write: the new driver's seal decides
        self._pending = None
        self._mark_completed()
        self.completed.append(meta)
        self.base, self._base_storage = meta, self.storage
        self._register(meta)
        acks = pending.acks.values()
        self.live_workers = {a.worker for a in acks if a.worker}
        self.run_workers |= self.live_workers
        deleted = self.registry.set_open({p for a in acks for p, (_size, in_use) in a.files.items() if in_use})
        deleted += self._subsume()
        deleted += self.registry.sweep(pending.unused)
        self.registry.control_space()
        self._remove_dead_dirs([posixpath.dirname(p) for p in deleted], self.registry.directories())
        return meta

    def _build_metadata(self, pending: _Pending) -> CheckpointMetadata:
        assert self.query is not None
        acks = [pending.acks[i] for i in range(pending.parallelism)]
        events = [a.max_event_time_ms for a in acks if a.max_event_time_ms is not None]
        prev = self.base.max_event_time_ms if self.base else None
        max_event = max([*events, *([prev] if prev is not None else [])], default=None)
        watermark = self.base.watermark_ms if self.base else None
        if max_event is not None and self.watermark_delay_ms is not None:
            watermark = max(watermark if watermark is not None else max_event - self.watermark_delay_ms,
                            max_event - self.watermark_delay_ms)
        return CheckpointMetadata(
            pending.checkpoint_id, self.query.query_id, self.query.epoch, pending.parallelism,
            self.query.max_parallelism, pending.processing_time_ms,
            [SubtaskState(a.keyed, a.operator, a.outputs, a.stats, a.changelog, **a.ack_info()) for a in acks],
            max_event, watermark, batch_watermark_ms=self.base.watermark_ms if self.base else None,
            **self._rescale_record(pending.checkpoint_id, pending.parallelism))

    def _rescale_record(self, checkpoint_id: int, parallelism: int) -> dict[str, Any]:
        """``rescaled_from`` and ``rescale_reason`` of a checkpoint whose base had another parallelism, and the
        history of rescales it carries forward from its base."""
        if self.base is None:
            return {}
        history = list(self.base.rescales)
        if self.base.parallelism == parallelism:
            return {"rescales": history}
        reason = self.rescale_reason or "started at another parallelism"
        history.append({"checkpoint_id": checkpoint_id, "from": self.base.parallelism, "to": parallelism,
                        "reason": reason})
        return {"rescaled_from": self.base.parallelism, "rescale_reason": reason,
                "rescales": history[-RESCALE_HISTORY:]}

    def _mark_completed(self) -> None:
        """From the first commit of this epoch on, losing every checkpoint of the root is an error. Best
        effort: the checkpoint is complete already, a failure is retried at the next commit."""
        if self._completed_marked or self.query is None:
            return
        try:
            self.epochs.mark_completed(self.query.epoch)
            self._completed_marked = True
        except OSError as e:
            log.warning("could not mark epoch %d as having completed a checkpoint (retried): %s",
                        self.query.epoch, e)

    def _write_metadata(self, meta: CheckpointMetadata) -> None:
        """Create ``chk-<n>/_metadata`` with put-if-absent. One left there by a driver fenced before this one
        looked (an older epoch, above this epoch's seal) never counts, and is replaced."""
        rel = metadata_path(meta.checkpoint_id)
        for _attempt in range(2):
            try:
                with self.fenced_on_failure(), naming_disk_full(self.storage.path(rel), meta.checkpoint_id):
                    self.storage.create_exclusive(rel, meta.to_bytes())
                return
            except FileExistsError:
                if not self._fenced_commit(meta.checkpoint_id):
                    break
                log.warning("replacing %s, written by a fenced driver", self.storage.path(rel))
                self.epochs.check(self.query.epoch)  # a newer driver may have replaced it with its own
                self.storage.delete(rel)
        raise FencedError(f"{self.storage.path(rel)} already exists: another driver completed this checkpoint; "
                          "stop this query")

    @contextlib.contextmanager
    def fenced_on_failure(self) -> Iterator[None]:
        """A write that fails because a newer driver took the root over (its cleanup removed this driver's
        temporary file or directory) raises :class:`FencedError`, not the raw I/O error."""
        try:
            yield
        except OSError as e:
            self.raise_if_fenced(e)
            raise

    def fail(self, checkpoint_id: int, error: BaseException) -> None:
        """A batch failed: abort its checkpoint, and raise :class:`FencedError` instead if a newer driver took
        the root over (the failure is then a consequence of the take-over). The caller re-raises ``error``."""
        self.abort(checkpoint_id, f"batch failed: {type(error).__name__}")
        if isinstance(error, Exception):
            self.raise_if_fenced(error)

    def raise_if_fenced(self, error: Exception) -> None:
        """Raise :class:`FencedError` (from ``error``) if a newer driver took the root over: the failure is
        a consequence of the take-over, not a fault of its own."""
        if self.query is None or isinstance(error, (FencedError, FileExistsError)):
            return
        try:
            self.epochs.check(self.query.epoch)
        except FencedError as fenced:
            raise fenced from error

    def _fenced_commit(self, checkpoint_id: int) -> bool:
        assert self.query is not None
        try:
            other = _written_by(self.storage, checkpoint_id)
        except (CorruptFileError, CheckpointError):
            return False
        return other.epoch < self.query.epoch and checkpoint_id > self._seal.sealed

    def _subsume(self) -> list[str]:
        while len(self.completed) > self.retained:
            self._drop_checkpoint(self.completed.pop(0).checkpoint_id)
        return self.registry.unregister_unused(self.completed[0].checkpoint_id)

    def _drop_checkpoint(self, checkpoint_id: int) -> None:
        """Delete a subsumed checkpoint: its metadata first (from then on it is not complete, whatever happens
        next), then its own directories. The state files it referenced go by the registry, before or after."""
        deleted = int(self.storage.delete(metadata_path(checkpoint_id)))
        with self._count_lock:
            self.files_deleted += deleted
        self._discards.append(self._discarder.submit(self._delete_dirs, checkpoint_id))

    def _delete_dirs(self, checkpoint_id: int) -> None:
        for directory in (checkpoint_dir(checkpoint_id), staged_dir(checkpoint_id)):
            self.storage.delete_dir(directory)

    # -- sink delivery --------------------------------------------------------------------------------
    def undelivered(self) -> list[CheckpointMetadata]:
        """Retained complete checkpoints with staged outputs the sink has not confirmed, oldest first. The sink
        gets batches in order, so one watermark (``_delivered``: the newest delivered checkpoint) says it all."""
        upto = self._read_delivered()
        out = []
        for m in self.completed:
            if m.checkpoint_id <= upto or not any(st.staged for st in m.subtasks):
                continue
            if self.storage.exists(delivered_path(m.checkpoint_id)):  # a marker of an older spate
                continue
            out.append(m)
        return out

    def staged_outputs(self, meta: CheckpointMetadata, allow_pickle: bool = False) -> list[Any]:
        """The output rows checkpoint ``meta``'s subtasks staged for the sink, in subtask order."""
        return [r for st in meta.subtasks if st.outputs for r in read_outputs(self.storage, st.outputs, allow_pickle)]

    def _read_delivered(self) -> int:
        if self._delivered_upto is None:
            self._delivered_upto = read_delivered(self.storage)
        return self._delivered_upto

    def mark_delivered(self, checkpoint_id: int) -> None:
        """Record that the sink received checkpoint ``checkpoint_id``'s outputs (and every earlier one's)."""
        upto = max(self._read_delivered(), checkpoint_id)
        with self.fenced_on_failure(), naming_disk_full(self.storage.path(DELIVERED_FILE), checkpoint_id):
            self.storage.replace(DELIVERED_FILE, frame(FrameKind.DELIVERED, str(upto).encode()))
        self._delivered_upto = upto

    def abort(self, checkpoint_id: int, reason: str = "") -> None:
        """Give up checkpoint ``checkpoint_id``: delete the files its acks wrote."""
        pending = self._pending
        if pending is None or pending.checkpoint_id != checkpoint_id:
            return
        log.info("aborting checkpoint %d: %s", checkpoint_id, reason)
        self._pending = None
        if self.storage.exists(metadata_path(checkpoint_id)):
            return  # the metadata write went through (e.g. it timed out after the PUT): keep every file
        self._sweep(list(pending.unused))

    def _sweep(self, paths: list[str]) -> None:
        """Delete those of ``paths`` that nothing references and no worker appends to."""
        deleted = self.registry.sweep(paths)
        self._remove_dead_dirs([posixpath.dirname(p) for p in deleted], self.registry.directories())

    def _discard(self, rel: str) -> None:
        """Delete a physical file no retained checkpoint needs, in the background: deleting big files must not
        hold up the checkpoint that subsumed them (a crash before it happens leaves an orphan for cleanup)."""
        with self._count_lock:
            self.files_deleted += 1
        self._discards.append(self._discarder.submit(self._delete, rel))

    def _delete(self, rel: str) -> None:
        if is_spate_file(rel):  # a path from metadata: never delete what spate does not name so
            self.storage.delete(rel)
        else:
            log.warning("not deleting %s: not a file spate writes", self.storage.path(rel))

    def drain(self) -> None:
        """Wait until every discarded file is deleted."""
        pending, self._discards = self._discards, []
        for f in pending:
            f.result()

    def close(self) -> None:
        self.drain()
        self._discarder.shutdown(wait=True)

    # -- savepoints -----------------------------------------------------------------------------------
    def savepoint(self, target_uri: str | None = None, checkpoint_id: int | None = None) -> str:
        """Copy a retained checkpoint (default: the latest) into a self-contained, relocatable directory
        (default ``<root>/savepoints/savepoint-<n>-<random>``). Returns its URI."""
        metas = {m.checkpoint_id: m for m in self.completed}
        cid = checkpoint_id if checkpoint_id is not None else (self.latest.checkpoint_id if self.latest else None)
        if cid is None or cid not in metas:
            raise CheckpointError(f"no retained complete checkpoint {cid if cid is not None else ''} to take a "
                                  f"savepoint of; retained: {sorted(metas)}")
        target = target_uri or join_uri(self.storage.uri, f"savepoints/savepoint-{cid}-{uuid.uuid4().hex[:8]}")
        target_storage = CheckpointStorage(target)
        root = self.storage.root.rstrip("/") + "/"
        if (type(target_storage.fs) is type(self.storage.fs) and (target_storage.root + "/").startswith(root)
                and not (target_storage.root + "/").startswith(root + "savepoints/")):
            raise ValueError(f"savepoint target {target} is inside the checkpoint root {self.storage.uri}, where "
                             "orphan cleanup would delete it; use a directory under savepoints/ or outside the root")
        write_savepoint(self.storage, metas[cid], target_storage)
        return target
