"""Fencing epochs: which driver owns a checkpoint root, and which checkpoints of fenced drivers count.

A driver takes a root over by *claiming* the next epoch: it creates ``_epochs/<e>`` with put-if-absent
(an exclusive local create, a conditional PUT on S3). Of two drivers that claim the same epoch exactly one
succeeds; the other gets :class:`FencedError` before it has written anything. A driver still runs under its
epoch as long as ``_epochs/<e+1>`` does not exist.

An older driver may have passed its fence check just before the take-over and write a checkpoint's metadata
afterwards. So after claiming, the new driver lists the complete checkpoints and *seals* its epoch
(``_epochs/<e>.seal``): the highest checkpoint id it saw. A checkpoint written under epoch ``w`` counts
(is *visible*) only if every sealed epoch after ``w`` saw it: ``checkpoint_id <= seal`` for each seal of an
epoch ``> w``. A commit that lands after the new driver looked is therefore never restored from, and the new
driver may delete it. Seals are put-if-absent and never change: a driver also seals every earlier claimed
epoch whose driver has not sealed yet (that driver did nothing so far, and is fenced now), so a fenced
driver's late seal can never make a checkpoint invisible that a newer driver already resumed from.

``_epochs/<e>.completed`` marks that a checkpoint completed under epoch e; with the seals it tells that a root
had checkpoints, so losing them all is an error instead of a silent restart from batch 0.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass

from spate.errors import CorruptFileError, FencedError
from spate.frames import FrameKind, frame, read_single_frame
from spate.fs import CheckpointStorage
from spate.layout import (
    COMPLETED_SUFFIX,
    EPOCHS_DIR,
    SEAL_SUFFIX,
    claim_path,
    completed_path,
    epoch_file_of,
    epoch_of,
    seal_path,
)

KEEP_EPOCHS = 16  # the newest epochs' files are never pruned


@dataclass(frozen=True)
class Seal:
    """The highest checkpoint visible when epoch ``epoch`` (or a later one, for an epoch whose driver never
    sealed) took over."""

    epoch: int
    sealed: int  # -1: none

    def to_bytes(self) -> bytes:
        return frame(FrameKind.EPOCH, json.dumps(self.__dict__).encode())

    @staticmethod
    def parse(data: bytes, where: str) -> Seal:
        try:
            d = json.loads(read_single_frame(data, where, FrameKind.EPOCH))
            return Seal(int(d["epoch"]), int(d["sealed"]))
        except (KeyError, TypeError, ValueError) as e:
            raise CorruptFileError(f"{where}: epoch seal is malformed ({e!r})") from e


@dataclass(frozen=True)
class EpochState:
    """The claimed epochs of a root and their seals, as listed once."""

    claimed: tuple[int, ...]
    seals: dict[int, Seal]
    completed: frozenset[int] = frozenset()

    @property
    def latest(self) -> int:
        return self.claimed[-1] if self.claimed else 0

    def visible(self, checkpoint_id: int, written_by: int) -> bool:
        """Whether a checkpoint written under epoch ``written_by`` counts (every later seal saw it)."""
        return all(checkpoint_id <= s.sealed for e, s in self.seals.items() if e > written_by)

    def lowest_later_seal(self, written_by: int) -> int | None:
        later = [s.sealed for e, s in self.seals.items() if e > written_by]
        return min(later) if later else None

    @property
    def had_checkpoints(self) -> bool:
        """Whether any driver saw or completed a checkpoint on this root."""
        return bool(self.completed) or any(s.sealed >= 0 for s in self.seals.values())

    def unsealed_before(self, epoch: int) -> list[int]:
        """Claimed epochs older than ``epoch`` whose drivers never sealed."""
        return [e for e in self.claimed if e < epoch and e not in self.seals]


class EpochLog:
    """The ``_epochs/`` directory of one checkpoint root."""

    def __init__(self, storage: CheckpointStorage) -> None:
        self.storage = storage

    def read(self) -> EpochState:
        claimed, seal_names, completed = [], [], set()
        for rel, _size in self.storage.list_files(EPOCHS_DIR):
            found = epoch_file_of(rel.rpartition("/")[2])
            if found is None:
                continue
            epoch, kind = found
            if kind == SEAL_SUFFIX:
                seal_names.append(epoch)
            elif kind == COMPLETED_SUFFIX:
                completed.add(epoch)
            else:
                claimed.append(epoch)
        seals = {}
        for e in seal_names:
            path = seal_path(e)
            seals[e] = Seal.parse(self.storage.read(path, "epoch seal"), self.storage.path(path))
        return EpochState(tuple(sorted(claimed)), seals, frozenset(completed))

    def claim(self, after: int) -> int:
        """Claim epoch ``after + 1`` (``after``: the highest epoch known to exist). Raises FencedError if
        another driver claimed it first or a later one exists."""
        epoch = after + 1
        try:
            self.storage.create_exclusive(claim_path(epoch), b"")
        except FileExistsError as e:
            raise FencedError(f"another driver took over checkpoint root {self.storage.uri} at the same time "
                              f"(epoch {epoch} is claimed); only one driver may run per checkpoint root") from e
        self.check(epoch)
        return epoch

    def check(self, epoch: int) -> None:
        """Raise FencedError if a driver claimed an epoch after ``epoch``."""
        if self.storage.exists(claim_path(epoch + 1)):
            raise FencedError(f"checkpoint root {self.storage.uri} was taken over by another driver (epoch "
                              f"{epoch + 1} is claimed, this driver has {epoch}); stop this query, only one "
                              "driver may run per checkpoint root")

    def claim_time_ns(self, epoch: int) -> int:
        return self.storage.mtime_ns(claim_path(epoch))

    def seal(self, seal: Seal) -> None:
        """Write a seal with put-if-absent; ``FileExistsError`` if that epoch is sealed already."""
        self.storage.create_exclusive(seal_path(seal.epoch), seal.to_bytes())

    def mark_completed(self, epoch: int) -> None:
        """Record that a checkpoint completed under ``epoch`` (idempotent)."""
        with contextlib.suppress(FileExistsError):
            self.storage.create_exclusive(completed_path(epoch), b"")

    def prune(self, below: int, current: int) -> int:
        """Delete the files of epochs older than ``below`` (no metadata on the root was written under them),
        keeping the newest :data:`KEEP_EPOCHS` epochs up to ``current`` whatever ``below`` says. Their seals
        can no longer decide what counts: every checkpoint left was written later, and the current seal bounds
        any late commit of theirs. Returns the number of files deleted."""
        limit = min(below, current - KEEP_EPOCHS + 1)
        doomed = [rel for rel, _size in self.storage.list_files(EPOCHS_DIR)
                  if (epoch := epoch_of(rel.rpartition("/")[2])) is not None and epoch < limit]
        return sum(self.storage.delete(rel) for rel in doomed)
