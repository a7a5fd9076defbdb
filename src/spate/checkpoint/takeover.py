"""Take-over and fencing: one driver at a time runs a checkpoint root.

A driver starting on a root first refuses what cannot work (a directory that is not a spate root, a root
whose checkpoints were lost, settings the root's state cannot take), then claims the next fencing epoch
(put-if-absent: of two drivers starting at once exactly one wins) and *seals* what it saw: the latest
complete checkpoint visible under the earlier epochs' seals (:mod:`spate.checkpoint.epochs`). From then on
:class:`TakeOver` tells whether a newer driver took the root over, so that a failure caused by a take-over
is reported as :class:`~spate.errors.FencedError`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from spate.checkpoint.discovery import Discovery, discover, metadata_ids, written_by
from spate.checkpoint.epochs import EpochLog, EpochState, Seal
from spate.checkpoint.metadata import CheckpointMetadata, QueryInfo, read_metadata
from spate.checkpoint.savepoint import restore_source
from spate.errors import CheckpointError, CorruptFileError, FencedError, IncompatibleStateError, NotARootError
from spate.fs import CheckpointStorage
from spate.keygroups import default_max_parallelism
from spate.layout import EPOCHS_DIR, METADATA_FILE, QUERY_FILE, SAVEPOINTS_DIR

log = logging.getLogger(__name__)


@dataclass
class Resumed:
    """What a driver resumes from after taking a root over."""

    completed: list[CheckpointMetadata]  # the retained visible complete checkpoints, ascending
    savepoint: CheckpointMetadata | None  # the savepoint to restore, when the root has no checkpoint yet


class TakeOver:
    """Claims a checkpoint root for this driver and fences it afterwards.

    Args:
        storage: the checkpoint root.
        epochs: the root's fencing epochs.
        retained: how many complete checkpoints the driver keeps (and so looks for).
        restore_from: a savepoint to restore when the root has no checkpoint yet.
    """

    def __init__(self, storage: CheckpointStorage, epochs: EpochLog, retained: int,
                 restore_from: str | None = None) -> None:
        self.storage = storage
        self.epochs = epochs
        self.retained = retained
        self.restore_from = restore_from
        self.query: QueryInfo | None = None  # set by the claim
        self.seal = Seal(0, -1)
        self._completed_marked = False

    # -- the take-over --------------------------------------------------------------------------------
    def start(self, parallelism: int, requested_max_parallelism: int | None,
              delivered: Callable[[], int]) -> Resumed:
        """Claim the next epoch (fencing older drivers) and find what to resume from. ``delivered`` reads
        the newest checkpoint the sink received (a root that had some must not start over silently)."""
        self._refuse_foreign_root()
        savepoint = self._read_savepoint() if self.restore_from else None
        query = self._query_file(savepoint, parallelism, requested_max_parallelism)
        _check_parallelism(query, parallelism, requested_max_parallelism, self.storage.uri)
        if savepoint is not None and not metadata_ids(self.storage):
            self._check_savepoint(savepoint, query)  # before the take-over: a refused start fences nobody
        self.query = QueryInfo(query.query_id, query.max_parallelism,
                               self.epochs.claim(max(self.epochs.read().latest, query.epoch)))
        found, epochs = self._seal_take_over()
        if found.retained:
            savepoint = None
        elif savepoint is None:
            self._refuse_lost_checkpoints(epochs, delivered())
        else:
            self._check_savepoint(savepoint, query)
        self.storage.replace(QUERY_FILE, self.query.to_bytes())  # informational; fences older spate versions
        return Resumed(found.retained, savepoint)

    def _seal_take_over(self) -> tuple[Discovery, EpochState]:
        """List the complete checkpoints after the claim and seal what was seen: this epoch, and every earlier
        claimed epoch whose driver never sealed (it did nothing yet, and is fenced now). Seals are put-if-absent,
        so a fenced driver's late seal can never change what counts."""
        assert self.query is not None
        epoch = self.query.epoch
        for _attempt in range(8):
            epochs = self.epochs.read()  # after the claim: every commit of an older driver seen now counts
            found = discover(self.storage, epochs, self.retained)
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
            self.seal = Seal(epoch, found.latest_id)
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
        cleans up) a directory holding someone else's files. One that was a spate root (it has ``_epochs/``: every
        driver claims an epoch before anything else) but lost ``_query`` while checkpoints exist is damaged; one
        that never was (no ``_epochs/`` either) is named as such, whatever files it holds (a ``chk-1/_metadata``
        of another tool's, say). Nothing is written or deleted before these checks."""
        entries = self.storage.list_entries()
        if QUERY_FILE in entries:
            return
        if EPOCHS_DIR in entries and metadata_ids(self.storage):
            raise CheckpointError(f"{self.storage.path(QUERY_FILE)} is missing but checkpoints exist; the root is "
                                  "damaged: restore it from a backup, or restore a savepoint into a new root")
        foreign = [e for e in entries if not e.startswith("_") and e != SAVEPOINTS_DIR]
        if foreign:
            shown = ", ".join(foreign[:5]) + (", ..." if len(foreign) > 5 else "")
            never = f"no {QUERY_FILE}, no {EPOCHS_DIR}/: spate never ran a query here" \
                if EPOCHS_DIR not in entries else f"no {QUERY_FILE}"
            raise NotARootError(f"{self.storage.uri} is not a spate checkpoint root ({never}) and is not empty (it "
                                f"holds {shown}). spate deletes the files it does not reference under its root, so "
                                "it left this folder as it was: pick an empty or new folder as checkpoint_root")

    def _query_file(self, savepoint: CheckpointMetadata | None, parallelism: int,
                    requested_max_parallelism: int | None) -> QueryInfo:
        """Read ``_query``, or create it (put-if-absent, so racing fresh starts agree on one query id)."""
        info = QueryInfo.read(self.storage)
        if info is not None:
            return info
        max_p = (savepoint.max_parallelism if savepoint else None) or requested_max_parallelism or \
            default_max_parallelism(parallelism)
        info = QueryInfo(uuid.uuid4().hex, max_p, 0)
        try:
            self.storage.create_exclusive(QUERY_FILE, info.to_bytes())
        except FileExistsError:
            return QueryInfo.read(self.storage) or info
        return info

    def _refuse_lost_checkpoints(self, epochs: EpochState, delivered: int) -> None:
        """A root that had complete checkpoints must not silently start over from batch 0."""
        if epochs.had_checkpoints or delivered >= 0:
            seen = max([s.sealed for s in epochs.seals.values()] + [delivered])
            upto = f" (up to chk-{seen} at least)" if seen >= 0 else ""
            raise CheckpointError(
                f"checkpoint root {self.storage.uri} had complete checkpoints{upto} "
                f"but none is left: no chk-<n>/{METADATA_FILE} that counts. They were deleted or "
                "damaged outside spate; restore a savepoint (restore_from=...) or start a new checkpoint root")

    def _read_savepoint(self) -> CheckpointMetadata:
        assert self.restore_from is not None
        source, rel = restore_source(self.restore_from)
        if not source.exists(rel):
            raise CheckpointError(f"no savepoint or retained checkpoint at {self.restore_from}: {source.path(rel)} "
                                  "is missing (a checkpoint of another root is named <root>/chk-<n>; `spate "
                                  "checkpoints list <root>` shows the retained ones)")
        # a checkpoint of another root is restored as a savepoint: its files are that root's, never reused here
        return dataclasses.replace(read_metadata(source, rel), is_savepoint=True)

    # -- fencing --------------------------------------------------------------------------------------
    def check(self) -> None:
        """Raise :class:`FencedError` if a newer driver took the root over."""
        assert self.query is not None
        self.epochs.check(self.query.epoch)

    @contextlib.contextmanager
    def fenced_on_failure(self) -> Iterator[None]:
        """A write that fails because a newer driver took the root over (its cleanup removed this driver's
        temporary file or directory) raises :class:`FencedError`, not the raw I/O error."""
        try:
            yield
        except OSError as e:
            self.raise_if_fenced(e)
            raise

    def raise_if_fenced(self, error: Exception) -> None:
        """Raise :class:`FencedError` (from ``error``) if a newer driver took the root over: the failure is
        a consequence of the take-over, not a fault of its own."""
        if self.query is None or isinstance(error, (FencedError, FileExistsError)):
            return
        try:
            self.epochs.check(self.query.epoch)
        except FencedError as fenced:
            raise fenced from error

    def fenced_commit(self, checkpoint_id: int) -> bool:
        """Whether the metadata of ``checkpoint_id`` there is a fenced driver's that never counts (an older
        epoch's, written after this driver's seal), which this driver may replace."""
        assert self.query is not None
        try:
            other = written_by(self.storage, checkpoint_id)
        except (CorruptFileError, CheckpointError):
            return False
        return other.epoch < self.query.epoch and checkpoint_id > self.seal.sealed

    def mark_completed(self) -> None:
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

    def prune(self, completed: list[CheckpointMetadata]) -> None:
        """Forget the epochs older than every retained checkpoint's."""
        assert self.query is not None
        self.epochs.prune(min([m.epoch for m in completed], default=self.query.epoch), self.query.epoch)


def _check_parallelism(query: QueryInfo, parallelism: int, requested: int | None, source: str) -> None:
    """Settings that cannot work with the root are refused before taking it over."""
    stored = query.max_parallelism
    if requested is not None and requested != stored:
        raise IncompatibleStateError(
            f"checkpoint state at {source} was written with max parallelism {stored}, but "
            f"max_parallelism={requested} was requested. Max parallelism (the number of key groups) "
            f"cannot change; set it to {stored} or leave it unset, or start a new checkpoint root")
    if parallelism > stored:
        raise IncompatibleStateError(f"parallelism {parallelism} exceeds max parallelism {stored} of "
                                     f"{source}; use at most {stored} subtasks")
