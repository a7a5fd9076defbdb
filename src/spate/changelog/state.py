"""Keyed state of one subtask with the changelog on: a materialized part (full snapshots taken in the
background now and then) plus the change sets logged since. A checkpoint only waits for the change sets not
yet uploaded; restore = materialized snapshot + replay of the change sets, filtered by key group."""

from __future__ import annotations

import contextlib
import logging
import queue
import time
import zlib
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

from spate.changelog.materialized import Materialized, MaterializedPart
from spate.changelog.process_view import NATIVE, MaterializationReads, MaterializationView, NativePace
from spate.changelog.table import ChangelogTable
from spate.changelog.upload import MB, BatchingUploadScheduler, UploadConfig
from spate.changelog.writer import ChangelogWriter
from spate.errors import CheckpointError, SettingError
from spate.fs import CheckpointStorage
from spate.heap import return_free_heap
from spate.layout import KEY_GROUPS_SUFFIX, NATIVE_SNAPSHOT_SUFFIX, random_name, subtask_dir
from spate.segments import SegmentWriter, WholeFileWriter
from spate.snapshot.handles import ChangeSetHandle, KeyedHandle
from spate.snapshot.keyed import SnapshotScope
from spate.state.keyed import KeyedStateBackend
from spate.state.table import StateTable

log = logging.getLogger(__name__)
Relocate = Callable[[Any], Any]


@dataclass(frozen=True)
class ChangelogConfig:
    """Changelog settings (Flink defaults where Flink has one).

    Raises:
        SettingError: a materialization interval, threshold, pace or part size that is not positive.
    """

    materialization_interval_ms: int = 600_000
    # beyond Flink: also materialize once the log since the last materialization is this long, so that a
    # restore replays, and a checkpoint's metadata lists, a bounded number of change sets whatever the interval
    materialize_after_change_sets: int = 50
    materialize_after_bytes: int = 64 * MB
    max_materialization_failures: int = 3
    # an lmdb table this large (bytes in use) is read for a materialization by a process of its own, where no
    # thread of the subtask's competes for the GIL at every entry (spate.changelog.process_view)
    materialize_in_process_from_bytes: int = 64 * MB
    # an lmdb table the reader process materializes is written as an lmdb file of its own (spate.snapshot.native):
    # restored by taking the file, not entry by entry, so that a restore from it and its log costs less than a
    # full snapshot's
    native_materialization: bool = True
    # beyond Flink (as RocksDB's rate limiter paces its compactions): while the kernel's write-back is behind (a
    # table larger than its background threshold: every batch writes back), a native materialization puts its
    # entries into its file at most this many MB a second, and reads the file to copy it to checkpoint storage
    # that is not its file system (a local root on it takes a hard link) at most that many, so that the batches
    # keep the disk (at 10 GB on the benchmark's machine: unpaced, a materialization doubled the batches' p99; at
    # 50 MB/s it slowed them by a quarter; at 35 they were as fast while it ran as while it was stopped; the longer
    # log it leaves a restore to replay restored 1.4x slower than a full snapshot 90 % of the way through the next
    # materialization, and 0.8x once materializations were written in parts; docs/benchmarks.md).
    # None: as fast as the disk goes
    materialization_write_mb_per_s: float | None = 35.0
    materialization_read_mb_per_s: float | None = 200.0
    # beyond Flink: a native materialization in the background is written in parts of about this many MB of entries,
    # each taking its key groups' place in the checkpoints as soon as it is placed, so that a restore replays per key
    # group the log since its own part, not since the previous materialization began (at 10 GB near the worst point
    # of the cycle: 3.4 GB of log instead of about 8, a restore 0.8x a full snapshot's instead of 1.4x;
    # docs/benchmarks.md). None: one file
    materialization_part_mb: float | None = 1024
    preemptive_threshold: int = 5 * MB
    coalesce: bool = True  # log an entry changed many times between uploads once (beyond Flink)
    persist_timeout_s: float = 60.0
    upload: UploadConfig = field(default_factory=UploadConfig)

    def __post_init__(self) -> None:
        if self.materialization_interval_ms <= 0:
            raise SettingError(f"materialization_interval_ms must be > 0, got {self.materialization_interval_ms}: "
                               "pass a positive number of milliseconds (default 600000)")
        if self.materialize_after_change_sets <= 0 or self.materialize_after_bytes <= 0:
            raise SettingError("materialize_after_change_sets and materialize_after_bytes must be > 0, got "
                               f"{self.materialize_after_change_sets} and {self.materialize_after_bytes}: pass "
                               "positive limits (defaults: 50 change sets, 64 MB)")
        for name in ("materialization_write_mb_per_s", "materialization_read_mb_per_s"):
            rate = getattr(self, name)
            if rate is not None and not rate > 0:
                raise SettingError(f"{name} must be > 0 or None, got {rate}: pass a positive number of MB a second, "
                                   "or None for as fast as the disk goes")
        part = self.materialization_part_mb
        if part is not None and not part > 0:
            raise SettingError(f"materialization_part_mb must be > 0 or None, got {part}: pass a positive number of MB "
                               "(a native materialization's part), or None for one file")

    def native_pace(self) -> NativePace | None:
        """The native materialization's pace in bytes a second (None: the native materialization is off)."""
        if not self.native_materialization:
            return None
        w, r, part = self.materialization_write_mb_per_s, self.materialization_read_mb_per_s, \
            self.materialization_part_mb
        return NativePace(None if w is None else w * MB, None if r is None else r * MB,
                          None if part is None else max(1, int(part * MB)))


def _log_length(change_sets: list[ChangeSetHandle]) -> tuple[int, int]:
    """How many change sets, and how many bytes of them, a log holds."""
    return len(change_sets), sum(n for h in change_sets for _o, n in h.offsets.values())


@dataclass
class _Materialization:
    sqn: int
    started: float
    future: Future[KeyedHandle | None]
    out: SegmentWriter
    view: MaterializationView
    key_groups: range
    parts: queue.SimpleQueue[MaterializedPart]  # placed while the rest is read, not yet taken


@dataclass(frozen=True)
class ChangelogServices:
    """What the changelogs of one worker's subtasks share, made once by the worker's services
    (:class:`spate.runtime.services.WorkerServices`), which own them: the upload scheduler their uploads batch
    into (one file), the threads that write their materializations and, with file merging, the writer of a
    subtask's materializations (``materialized(index, parallelism, checkpoint_id)``; None: a file of its own in
    the subtask's directory)."""

    scheduler: BatchingUploadScheduler
    materializers: Executor
    materialized: Callable[[int, int, int], SegmentWriter] | None = None


class ChangelogKeyedState:
    """The changelog side of a subtask's keyed state: writer, materialized handles, materialization.

    A worker's subtasks share its :class:`ChangelogServices`. Without them (tests, tools) it makes and closes its
    own."""

    def __init__(self, inner: StateTable, storage: CheckpointStorage, config: ChangelogConfig, index: int,
                 parallelism: int, *, services: ChangelogServices | None = None) -> None:
        self.config = config
        self.storage = storage
        self.index, self.parallelism = index, parallelism
        self._owns_services = services is None
        if services is None:
            services = ChangelogServices(BatchingUploadScheduler(storage, config.upload),
                                         ThreadPoolExecutor(1, thread_name_prefix="spate-materialize"))
        self._materializers = services.materializers
        self._reads = MaterializationReads(config.materialize_in_process_from_bytes, config.native_pace())
        self.writer = ChangelogWriter(f"{index}-{parallelism}-{random_name()[:12]}", services.scheduler,
                                      config.preemptive_threshold, config.coalesce)
        self._merged_materializations = services.materialized
        self.checkpoint_id = 0  # the checkpoint being taken (or next to be)
        self.table = ChangelogTable(inner, self.writer)
        self.base = Materialized()
        self._included: dict[int, list[int]] = {}  # checkpoint -> sequence numbers of the change sets it lists
        self._running: _Materialization | None = None
        self._failures = 0
        self._next_due_ms: int | None = None
        self._log_since_materialization = (0, 0)  # change sets and bytes a checkpoint lists since then
        self._retry_after = 0.0  # monotonic time before which no materialization starts (after a failure)
        self.last_materialization: dict[str, Any] = {}

    @property
    def materialized(self) -> list[KeyedHandle]:
        """The snapshot handles a restore starts from."""
        return self.base.handles

    @property
    def materialized_to(self) -> int:
        """The sequence number the last complete materialization began at (0: none)."""
        return self.base.to

    def restored(self, materialized: list[KeyedHandle], changelog: list[ChangeSetHandle]) -> None:
        """Record what the state was restored from: it is part of every checkpoint until the next
        materialization (the new log starts at sequence number 0)."""
        self.base.restored(materialized, changelog)
        self._log_since_materialization = _log_length(changelog)  # a long restored log materializes soon

    # -- checkpoints ------------------------------------------------------------------------------------
    def begin(self, checkpoint_id: int) -> None:
        """The batch of checkpoint ``checkpoint_id`` starts: uploads from now on belong to it."""
        self.checkpoint_id = self.writer.checkpoint_id = checkpoint_id
        if self._running is not None and not self.writer.active:
            # nothing changed since the last boundary (the table was only tagged since): the same boundary again,
            # for a reader process, whose snapshot must be the newest when it opens it, and missed the last one
            # behind the tag's commit
            self._running.view.advance(self.writer.active_sqn)

    def snapshot(self, checkpoint_id: int, backend: KeyedStateBackend) -> tuple[list[KeyedHandle],
                                                                                 list[ChangeSetHandle], dict]:
        """Persist the log's tail; returns (materialized handles, change-set handles, statistics)."""
        return self.start_snapshot(checkpoint_id, backend)()

    def start_snapshot(self, checkpoint_id: int, backend: KeyedStateBackend, fix: Relocate | None = None
                       ) -> Callable[[], tuple[list[KeyedHandle], list[ChangeSetHandle], dict]]:
        """Start persisting the log's tail without waiting; the returned function waits and gives the
        handles. Subtasks of one process start theirs together, so their uploads share a file. ``fix``
        replaces handles that must be re-written (file merging) by their copies, once."""
        self._collect_materialization()
        started = time.perf_counter()
        future = self.writer.persist(self.materialized_to)
        if self._running is not None:  # a boundary: the rest of the materialization reads the table as of now
            self._running.view.advance(self.writer.active_sqn)
        states = tuple(m.to_dict() for m in backend.state_metas)
        if fix is not None:
            self.base.relocate(fix)
        materialized, restored = list(self.base.handles), list(self.base.restored_changelog)

        def finish() -> tuple[list[KeyedHandle], list[ChangeSetHandle], dict]:
            try:
                handles = future.result(timeout=self.config.persist_timeout_s)
            except TimeoutError as e:
                raise CheckpointError(f"changelog of subtask {self.index} not durable after "
                                      f"{self.config.persist_timeout_s} s") from e
            if fix is not None:
                handles = self.writer.replace_uploaded([fix(h) for h in handles])
            if self.base.handles == materialized:
                self.base.referenced()  # the ack references them: the coordinator owns them
            listed = [h for h in (self.base.listed(h, states) for h in handles) if h is not None]
            self._included[checkpoint_id] = [h.sqn for h in listed]
            stats = self._stats((time.perf_counter() - started) * 1000, handles)
            log = restored + listed
            self._log_since_materialization = _log_length(log)
            return materialized, log, stats

        return finish

    def _stats(self, persist_ms: float, handles: list[ChangeSetHandle]) -> dict[str, Any]:
        w = self.writer.take_stats()
        return {"changelog_persist_ms": round(persist_ms, 3),
                "changelog_bytes_at_checkpoint": w.persisted_at_checkpoint,
                "changelog_bytes_preemptive": w.persisted_preemptively,
                "changelog_change_sets": len(handles), "changelog_records": w.records,
                "changelog_uploads": len(w.uploads),
                "upload_bytes": sum(u.bytes for u in w.uploads),
                "upload_latency_ms_max": max((u.latency_ms for u in w.uploads), default=0.0),
                "upload_attempts": sum(u.attempts for u in w.uploads),
                "upload_errors": sum(u.errors for u in w.uploads),
                "materialized_to": self.materialized_to, **self._take_materialization_stats()}

    def _take_materialization_stats(self) -> dict[str, Any]:
        stats, self.last_materialization = self.last_materialization, {}
        return stats

    def checkpoint_completed(self, checkpoint_id: int) -> None:
        """The coordinator completed ``checkpoint_id``: its change sets belong to it now; what lies before
        the materialization point is no longer needed by new checkpoints."""
        listed = self._included.pop(checkpoint_id, None)
        if listed is not None:
            self.writer.confirm(listed)
        for cid in [c for c in self._included if c < checkpoint_id]:
            del self._included[cid]  # older attempts were aborted
        if not self._included:
            self.writer.truncate(self.materialized_to)

    def abandon_after(self, checkpoint_id: int) -> None:
        """Checkpoints after ``checkpoint_id`` (the latest complete one) were aborted: forget what they
        included, so closing the writer deletes those change files instead of keeping them."""
        for cid in [c for c in self._included if c > checkpoint_id]:
            del self._included[cid]

    # -- materialization --------------------------------------------------------------------------------
    def maybe_materialize(self, backend: KeyedStateBackend, now_ms: int) -> bool:
        """Start a background materialization if one is due and none is running."""
        self._collect_materialization()
        if self._running is not None or not self._due(now_ms):
            return False
        self.start_materialization(backend, self.writer.next_sequence_number(), in_parts=True)
        return True

    def materialize_if_due(self, backend: KeyedStateBackend, now_ms: int, referenced_by: int) -> bool:
        """Materialize now, within the batch, if due: for a subtask whose next batch may run in another
        process (Spark's Python workers), where a background materialization would finish in a process that
        no longer serves the subtask and be thrown away."""
        self._collect_materialization(wait=True)
        if not self._due(now_ms):
            return False
        self.start_materialization(backend, self.writer.next_sequence_number(), referenced_by)
        self._collect_materialization(wait=True)  # applied, or a failure counted (and retried later)
        return True

    def _due(self, now_ms: int) -> bool:
        """The timer fired, or the log since the last materialization reached a bound (both staggered per
        subtask, so subtasks do not all write their state in one batch; the bound not while backing off after
        a failure), and something changed since."""
        interval = self.config.materialization_interval_ms
        stagger = zlib.crc32(f"{self.index}/{self.parallelism}".encode())
        if self._next_due_ms is None:
            self._next_due_ms = now_ms + interval + stagger % interval
        change_sets, size = self._log_since_materialization
        most = self.config.materialize_after_change_sets
        long_log = (change_sets >= most + stagger % max(1, most // 4) or size >= self.config.materialize_after_bytes) \
            and time.monotonic() >= self._retry_after  # a long log stays long: after a failure, back off
        if not (now_ms >= self._next_due_ms or long_log):
            return False
        self._next_due_ms = now_ms + interval
        return self.writer.next_sequence_number() != self.base.to or bool(self.base.restored_changelog)

    def start_materialization(self, backend: KeyedStateBackend, sqn: int, referenced_by: int | None = None, *,
                              in_parts: bool = False) -> None:
        """Materialize in the background; checkpoint ``referenced_by`` (default: the next one) references it.
        ``in_parts``: a native materialization's parts take their key groups' place as they are placed (collected at
        the next checkpoint or materialization check), not all at once when it completes."""
        scope = SnapshotScope.of(backend)
        view = self._reads.open(backend.table, scope, sqn, in_parts)  # opened now, atomically with ``sqn``; read later
        out = self._materialization_out(self.checkpoint_id + 1 if referenced_by is None else referenced_by,
                                        view.read_by == NATIVE)
        parts: queue.SimpleQueue[MaterializedPart] = queue.SimpleQueue()

        def with_states(handle: KeyedHandle) -> KeyedHandle:
            # read from views renewed up to now, the frames may hold states registered since the start: the handle
            # names every state there is now, or a restore would not know theirs (their change sets are trimmed)
            return replace(handle, states=tuple(m.to_dict() for m in tuple(backend.state_metas)))

        def placed(part: MaterializedPart) -> None:
            parts.put(part if part.handle is None else replace(part, handle=with_states(part.handle)))

        def work() -> KeyedHandle | None:
            try:
                handle = view.write(scope, out, placed if in_parts else None)
            finally:
                view.close()
                return_free_heap()  # the frames it wrote (no GC pause here: the batches run meanwhile)
            return None if handle is None else with_states(handle)

        self._running = _Materialization(sqn, time.perf_counter(), self._materializers.submit(work), out, view,
                                         scope.key_groups, parts)

    def _materialization_out(self, checkpoint_id: int, native: bool) -> SegmentWriter:
        """Where a materialization that checkpoint ``checkpoint_id`` references first is written: a segment of the
        worker's merged files, or a file of its own in the subtask's directory."""
        if self._merged_materializations is not None:
            return self._merged_materializations(self.index, self.parallelism, checkpoint_id)
        suffix = NATIVE_SNAPSHOT_SUFFIX if native else KEY_GROUPS_SUFFIX
        return WholeFileWriter(self.storage, subtask_dir(self.index, self.parallelism), suffix, checkpoint_id)

    def _collect_materialization(self, wait: bool = False) -> None:
        run = self._running
        if run is None:
            return
        self._take_parts(run)
        if not wait and not run.future.done():
            return
        self._running = None
        try:
            handle = run.future.result()
        except Exception as e:  # noqa: BLE001 - tolerated up to a limit
            self._take_parts(run)  # placed before it failed: whole and checked, they stand
            self._reads.failed(run.view)
            self._materialization_failed(e)
            return
        self._take_parts(run)
        self._apply(run, handle)

    def _take_parts(self, run: _Materialization) -> None:
        """The parts of ``run`` placed since the last look take their key groups' place."""
        while True:
            try:
                part = run.parts.get_nowait()
            except queue.Empty:
                return
            self.base.take_part(part, run.out)
            run.key_groups = range(part.key_groups.stop, run.key_groups.stop)  # what the rest of it holds

    def _materialization_failed(self, error: Exception) -> None:
        """Count a failed materialization; retry after a back-off (not at once: a long log stays long), and
        give up after ``max_materialization_failures`` in a row."""
        self._failures += 1
        log.warning("materialization of subtask %d failed (%d in a row): %s", self.index, self._failures, error)
        if self._failures > self.config.max_materialization_failures:
            raise CheckpointError(f"materialization of subtask {self.index} failed {self._failures} times in a "
                                  f"row (limit {self.config.max_materialization_failures}): {error}") from error
        self._retry_after = time.monotonic() + min(self.config.materialization_interval_ms / 1000,
                                                   2.0 ** self._failures)

    def _apply(self, run: _Materialization, handle: KeyedHandle | None) -> None:
        self._failures = 0
        self.base.complete(MaterializedPart(handle, run.key_groups, {}), run.out, run.sqn, run.view.positions)
        self._log_since_materialization = (0, 0)
        self.last_materialization = {"materialization_ms": round((time.perf_counter() - run.started) * 1000, 3),
                                     "materialization_bytes": handle.size if handle else 0,
                                     "materialized_sqn": run.sqn, "materialization_read_by": run.view.read_by}

    def materialize_now(self, backend: KeyedStateBackend, referenced_by: int | None = None) -> None:
        """Materialize synchronously (after restoring from a savepoint that lives outside this root, or when the
        files the restored handles name are damaged), replacing what the state was restored from."""
        self.base.restored_changelog = []
        self._stop_materialization()  # superseded: one still waiting for a boundary would wait for ever
        self.start_materialization(backend, self.writer.next_sequence_number(), referenced_by)
        run, self._running = self._running, None
        assert run is not None
        self._apply(run, run.future.result())

    def _stop_materialization(self) -> None:
        """Stop a running materialization after the key group it is reading, before the table goes: no checkpoint
        can reference it any more, so finishing it (minutes for a large state) would only write a file to delete.
        What it wrote is deleted (a finished one's file, its parts not yet taken, or the part its writer had written);
        the parts taken are the state's, deleted with it if no checkpoint references them."""
        run, self._running = self._running, None
        if run is None:
            return
        run.view.close()  # its next key group read fails: the write stops there
        with contextlib.suppress(Exception):
            handle = run.future.result()
            if handle is not None:
                run.out.discard(handle.segment)
        while not run.parts.empty():
            part = run.parts.get_nowait()
            if part.handle is not None:
                run.out.discard(part.handle.segment)

    def wait_for_materialization(self) -> None:
        """Block until a running materialization is done and applied (tests, shutdown)."""
        self._collect_materialization(wait=True)

    def close(self) -> None:
        self._stop_materialization()
        self.base.drop_unreferenced()
        for listed in self._included.values():
            # a checkpoint that included these may have completed without telling us yet: keep the files
            # (if it did not, orphan cleanup removes them on the next start)
            self.writer.confirm(listed)
        self.writer.close()
        if self._owns_services:
            self.writer.scheduler.close()
            self._materializers.shutdown(wait=True)
