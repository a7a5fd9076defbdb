"""``ChangelogWriter``: the per-subtask log of state changes (FLIP-158 / Flink's FsStateChangelogWriter).

Changes go into the active change set; ``next_sequence_number`` closes it (if non-empty) so later changes get
the next sequence number. ``persist(from)`` uploads every change set from ``from`` on that is not uploaded yet
and returns a future of their handles; ``truncate(to)`` forgets what is before ``to`` (deleting files no
completed checkpoint took over); ``confirm`` hands files to the coordinator. Once the active change set passes
the pre-emptive threshold it is uploaded right away, so most bytes are durable before the checkpoint asks.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field

from spate.changelog.changeset import ChangeSet
from spate.changelog.upload import BatchingUploadScheduler, UploadStats, UploadTask
from spate.errors import CheckpointError, StorageError
from spate.snapshot.handles import ChangeSetHandle

MB = 1 << 20


@dataclass
class WriterStats:
    """Since the last ``take_stats``: bytes handed to uploads at checkpoint (persist) or pre-emptively, and the
    records of the change sets closed."""

    persisted_at_checkpoint: int = 0
    persisted_preemptively: int = 0
    records: int = 0
    uploads: list[UploadStats] = field(default_factory=list)


class ChangelogWriter:
    """The change log of one subtask (``log_id``), uploaded through a per-process scheduler."""

    def __init__(self, log_id: str, scheduler: BatchingUploadScheduler, preemptive_threshold: int = 5 * MB,
                 coalesce: bool = True) -> None:
        self.log_id = log_id
        self.scheduler = scheduler
        self.preemptive_threshold = preemptive_threshold
        self.coalesce = coalesce
        self.active = ChangeSet(coalesce)
        self.active_sqn = 0
        self.lowest = 0
        self.highest_failed = -1
        self._not_uploaded: dict[int, ChangeSet] = {}
        self._in_flight: set[int] = set()
        self._uploaded: dict[int, ChangeSetHandle] = {}
        self._confirmed: set[int] = set()
        self._failures: dict[int, BaseException] = {}
        self._waiters: list[tuple[int, int, Future[list[ChangeSetHandle]]]] = []
        self._lock = threading.RLock()
        self.stats = WriterStats()
        self.closed = False
        self.checkpoint_id = 0  # the checkpoint uploads belong to (picks the file pool with file merging)
        scheduler.register(log_id)

    # -- appending --------------------------------------------------------------------------------------
    def after_append(self) -> None:
        """Called after changes were added to :attr:`active`: upload pre-emptively past the threshold."""
        if self.active.size >= self.preemptive_threshold:
            with self._lock:
                self._roll_over()
                task = self._take_upload(self.lowest, preemptive=True)
            self._send(task)

    def next_sequence_number(self) -> int:
        """Close the active change set if it holds changes; the number later changes will get."""
        with self._lock:
            self._roll_over()
            return self.active_sqn

    def _roll_over(self) -> None:
        if self.active:
            self.stats.records += self.active.record_count()
            self._not_uploaded[self.active_sqn] = self.active
            self.active = ChangeSet(self.coalesce)
            self.active_sqn += 1

    # -- persisting -------------------------------------------------------------------------------------
    def persist(self, from_sqn: int) -> Future[list[ChangeSetHandle]]:
        """Upload what is not uploaded yet from ``from_sqn`` on; the future gives the handles of every change
        set in ``[from_sqn, next_sequence_number())`` once all are durable."""
        with self._lock:
            if self.highest_failed >= from_sqn:
                raise StorageError(f"changelog {self.log_id}: changes from sequence number {from_sqn} failed to upload "
                                   f"({self._failures.get(self.highest_failed)!r}); restore from the last checkpoint")
            if self.lowest > from_sqn:
                raise CheckpointError(f"changelog {self.log_id}: requested changes from {from_sqn} were truncated "
                                      f"(lowest is {self.lowest})")
            if self.active_sqn < from_sqn:
                raise CheckpointError(f"changelog {self.log_id}: changes from {from_sqn} not yet appended "
                                      f"(next is {self.active_sqn})")
            self._roll_over()
            future: Future[list[ChangeSetHandle]] = Future()
            self._waiters.append((from_sqn, self.active_sqn, future))
            task = self._take_upload(from_sqn, preemptive=False)
            self._check_waiters()
        if task is None:
            self.scheduler.asked(self.log_id, self.checkpoint_id)
        self._send(task)
        return future

    def _send(self, task: UploadTask | None) -> None:
        # outside the writer lock: the scheduler may block (back-pressure) until uploads complete, and
        # their callbacks need this lock
        if task is not None:
            self.scheduler.upload(task)

    def _take_upload(self, from_sqn: int, preemptive: bool) -> UploadTask | None:
        """Move every not-uploaded change set from ``from_sqn`` on into one upload task (caller holds the lock)."""
        batch = {sqn: cs for sqn, cs in self._not_uploaded.items() if sqn >= from_sqn}
        if not batch:
            return None
        for sqn in batch:
            del self._not_uploaded[sqn]
            self._in_flight.add(sqn)
        task = UploadTask(self.log_id, batch, self._uploaded_cb, functools.partial(self._failed_cb, tuple(batch)),
                          self.checkpoint_id, at_checkpoint=not preemptive)
        if preemptive:
            self.stats.persisted_preemptively += task.size
        else:
            self.stats.persisted_at_checkpoint += task.size
        return task

    def _uploaded_cb(self, handles: dict[int, ChangeSetHandle], stats: UploadStats) -> None:
        release = []
        with self._lock:
            self.stats.uploads.append(stats)
            for sqn, handle in handles.items():
                self._in_flight.discard(sqn)
                if sqn < self.lowest or self.closed:
                    release.append(handle.segment)  # truncated or closed meanwhile: nobody will reference it
                else:
                    self._uploaded[sqn] = handle
            self._check_waiters()
        for ref in release:
            self.scheduler.registry.release(ref)

    def _failed_cb(self, sqns: tuple[int, ...], error: BaseException) -> None:
        with self._lock:
            for sqn in sqns:
                self._in_flight.discard(sqn)
                self._failures[sqn] = error
            self.highest_failed = max(self.highest_failed, *sqns)
            self._check_waiters()

    def _check_waiters(self) -> None:
        still = []
        for start, end, future in self._waiters:
            failed = [s for s in range(start, end) if s in self._failures]
            if failed:
                future.set_exception(self._failures[failed[0]])
            elif all(s in self._uploaded for s in range(start, end)):
                future.set_result([self._uploaded[s] for s in range(start, end)])
            else:
                still.append((start, end, future))
        self._waiters = still

    # -- after checkpoints ------------------------------------------------------------------------------
    def confirm(self, sqns: Iterable[int]) -> None:
        """Change sets ``sqns`` are part of a completed checkpoint: the coordinator owns their files from now
        on."""
        with self._lock:
            for sqn in sqns:
                handle = self._uploaded.get(sqn)
                if handle is not None and sqn not in self._confirmed:
                    self._confirmed.add(sqn)
                    self.scheduler.registry.stop_tracking(handle.segment)

    def replace_uploaded(self, handles: list[ChangeSetHandle]) -> list[ChangeSetHandle]:
        """Use ``handles`` (re-written copies) instead of the uploaded change sets of the same sequence numbers
        from now on; this log releases the originals (they stay as long as a completed checkpoint references
        them)."""
        release = []
        with self._lock:
            for h in handles:
                old = self._uploaded.get(h.sqn)
                if old is not None and old is not h:
                    if h.sqn not in self._confirmed:
                        release.append(old.segment)
                    self._uploaded[h.sqn] = h
        for ref in release:
            self.scheduler.registry.release(ref)
        return handles

    def truncate(self, to_sqn: int) -> None:
        """Forget change sets before ``to_sqn`` (materialized and no longer needed by new checkpoints)."""
        with self._lock:
            if to_sqn > self.active_sqn:
                raise CheckpointError(f"changelog {self.log_id}: cannot truncate to {to_sqn}, beyond the next "
                                      f"sequence number {self.active_sqn}")
            self.lowest = max(self.lowest, to_sqn)
            for sqn in [s for s in self._not_uploaded if s < to_sqn]:
                del self._not_uploaded[sqn]
            release = [self._uploaded.pop(s).segment for s in sorted(self._uploaded) if s < to_sqn
                       and s not in self._confirmed]
            for s in [s for s in self._uploaded if s < to_sqn]:
                del self._uploaded[s]
            self._confirmed = {s for s in self._confirmed if s >= to_sqn}
        for ref in release:
            self.scheduler.registry.release(ref)

    def close(self) -> None:
        """Release every file no completed checkpoint took over (it would be an orphan)."""
        self.scheduler.unregister(self.log_id)
        with self._lock:
            self.closed = True
            release = [h.segment for s, h in self._uploaded.items() if s not in self._confirmed]
            self._uploaded.clear()
            self._not_uploaded.clear()
        for ref in release:
            self.scheduler.registry.release(ref)

    def take_stats(self) -> WriterStats:
        with self._lock:
            stats, self.stats = self.stats, WriterStats()
            return stats
