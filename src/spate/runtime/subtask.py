"""One subtask: open or restore its state for a plan, process a batch, snapshot, acknowledge.

Transport-agnostic: the in-process runner calls it directly; the Spark transport calls it inside a Python
worker. Live state is tagged with the checkpoint it reflects and exactly which state that is; it is reused when
that is the plan's base, a local lmdb copy of an earlier checkpoint of the base's lineage is caught up by
replaying the change sets since (:mod:`spate.runtime.recovery`), and otherwise the state is restored from
checkpoint storage (keyed state by key-group intersection, operator state by the FLIP-8 pieces the
coordinator assigned).
"""

from __future__ import annotations

import copy
import functools
import logging
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import lmdb

from spate.changelog.state import ChangelogConfig, ChangelogKeyedState, restore_keyed_state
from spate.checkpoint.ackinfo import CAUGHT_UP, NEW, RESCALED, REUSED
from spate.checkpoint.metadata import checkpoint_dir, staged_dir
from spate.checkpoint.protocol import SubtaskAck, SubtaskPlan
from spate.errors import SpateError
from spate.filemerging.config import FileMergingConfig
from spate.filemerging.manager import FileMergingManager, subtask_dir
from spate.runtime.batch import BatchProcessor, KeyedBatch, KeyedRow
from spate.runtime.localstate import local_state_dir
from spate.runtime.outputs import NO_KEY, OutputBuffer, Outputs
from spate.runtime.processor import Context, Processor, Row
from spate.runtime.recovery import (
    LINEAGE_META,
    TAG_META,
    Lineage,
    Recovery,
    bytes_to_read,
    catch_up_start,
    full_restore,
    recovery_kind,
)
from spate.runtime.rescale import FOLD_PER_BATCH, LocalRescale, missing_parts
from spate.runtime.services import WorkerServices
from spate.segments import FileRef, SegmentWriter, WholeFileWriter
from spate.serde import check_pickle_allowed, resolve_serializer
from spate.snapshot.handles import ChangeSetHandle, KeyGroupsHandle
from spate.snapshot.keyed import write_keyed_snapshot
from spate.snapshot.operator import read_operator_piece, write_operator_snapshot
from spate.snapshot.outputs import write_outputs
from spate.snapshot.relocate import H, relocate
from spate.snapshot.verify import verify_handles
from spate.state.heap import HeapTable
from spate.state.keyed import KeyedStateBackend
from spate.state.lmdb_table import LmdbTable
from spate.state.operator import OperatorStateBackend, RestoredOperatorState
from spate.state.overlay import OverlayTable, open_local_table
from spate.state.table import StateTable
from spate.state.timed import TimedTable
from spate.state.timers import EVENT_TIME, PROCESSING_TIME

log = logging.getLogger(__name__)
TABLE_KINDS = ("heap", "lmdb")
_DIRTY = b"dirty"
_EMPTY = -1  # tag of state that reflects "no checkpoint yet"


@dataclass
class SubtaskConfig:
    """Settings of a subtask's state (shared by every subtask of a query)."""

    table: str = "heap"
    local_dir: str | None = None
    sticky: bool = True  # a subtask's next batch runs in this process (False on Spark: Python workers hop)
    allow_pickle: bool = False
    compress: bool = False
    key_types: Any = None
    event_time_column: str | None = None
    stage_outputs: bool = False
    output_serializer: str = "msgpack"
    changelog: ChangelogConfig | None = None
    file_merging: FileMergingConfig | None = None
    output_schema: Any = None  # a pyarrow.Schema the output rows must match (checked before each checkpoint)
    profile: bool = False  # time the state table's reads and writes (ack stats "profile": "table_ms")
    fold_per_batch: int = FOLD_PER_BATCH  # entries moved from a rescaled table's bases into it per batch

    def __post_init__(self) -> None:
        if self.table not in TABLE_KINDS:
            raise ValueError(f"unknown state table {self.table!r}: use one of {TABLE_KINDS}")
        if self.table == "lmdb" and not self.local_dir:
            raise ValueError("the lmdb table needs local_dir (a directory on local disk for live state)")
        check_pickle_allowed(self.output_serializer, self.allow_pickle, "output_serializer")


AnyProcessor = Processor | BatchProcessor
ProcessorFactory = Callable[[], AnyProcessor]


def _floored(watermark_ms: int | None, floor_ms: int | None) -> int | None:
    """A watermark with the processor's floor under it (the floor itself before any event time)."""
    if floor_ms is None:
        return watermark_ms
    return floor_ms if watermark_ms is None else max(watermark_ms, floor_ms)


def processor_factory(processor: AnyProcessor | type[AnyProcessor] | ProcessorFactory) -> ProcessorFactory:
    """Accept a Processor or BatchProcessor instance (deep-copied per subtask), a class, or a zero-argument
    factory."""
    if isinstance(processor, (Processor, BatchProcessor)):
        return lambda: copy.deepcopy(processor)
    if callable(processor):
        return processor  # type: ignore[return-value]
    raise TypeError(f"processor must be a Processor, a Processor class or a factory, got {processor!r}")


@dataclass
class BatchOutput:
    ack: SubtaskAck
    outputs: Outputs

    @property
    def rows(self) -> list[Row]:
        return self.outputs.rows


class Subtask:
    """Subtask ``index`` of ``parallelism``: owns the key groups ``key_group_range(maxP, P, index)``.

    ``services`` are its worker's services for the checkpoint root (storage, file merging, changelog uploads
    and materializations), made for ``config``; the worker owns and closes them, the subtask only uses them."""

    def __init__(self, index: int, parallelism: int, factory: ProcessorFactory, config: SubtaskConfig,
                 services: WorkerServices) -> None:
        _check_services(config, services)
        self.index, self.parallelism = index, parallelism
        self.factory = factory
        self.config = config
        self.services = services
        self.keyed: KeyedStateBackend | None = None
        self.operator: OperatorStateBackend | None = None
        self.processor: AnyProcessor | None = None
        self.ctx: Context | None = None
        self._tag: int | None = None  # checkpoint the live state reflects; None = unknown/dirty
        self._lineage: Lineage | None = None  # exactly which state that is (see spate.runtime.recovery)
        self._handles: tuple[int, list] | None = None  # (checkpoint, keyed handles) equal to the live state
        self.recovery = Recovery(NEW)  # how the state of the current batch got to its plan's base
        self.clog: ChangelogKeyedState | None = None
        self._unsynced: list[FileRef] = []  # segments this attempt wrote that no ack named yet (file merging)

    # -- the batch ------------------------------------------------------------------------------------
    def run(self, plan: SubtaskPlan, batch: KeyedBatch | Sequence[KeyedRow],
            initial: KeyedBatch | None = None) -> BatchOutput:
        """Process one micro-batch: this subtask's rows grouped by key, or (key group, key, row) triples;
        ``initial``: its rows of the query's initial state (first batch of a new query only)."""
        return self.start(plan, batch, initial)()

    def start(self, plan: SubtaskPlan, batch: KeyedBatch | Sequence[KeyedRow],
              initial: KeyedBatch | None = None) -> Callable[[], BatchOutput]:
        """Process the batch and start its snapshot; the returned function waits until the snapshot is
        durable and gives the ack (a runner starts every subtask before waiting for any)."""
        if not isinstance(batch, KeyedBatch):
            batch = KeyedBatch.from_rows(batch)
        self._check_plan(plan)
        clock = _PhaseClock()
        self._prepare(plan)
        clock.lap("prepare_ms")
        table_s = self._table_seconds()
        out = self._process(plan, self._without_late_rows(plan, batch), clock, initial)
        clock.phases["table_ms"] = (self._table_seconds() - table_s) * 1000
        finish = self._snapshot(plan, batch, out)
        clock.lap("snapshot_start_ms")

        def done() -> BatchOutput:
            ack = finish()
            clock.lap("snapshot_wait_ms")
            if self.config.profile:
                ack.stats["profile"] = clock.rounded()
            return BatchOutput(ack, out)

        return done

    def _check_plan(self, plan: SubtaskPlan) -> None:
        if (plan.index, plan.parallelism) != (self.index, self.parallelism):
            raise ValueError(f"plan for subtask {plan.index}/{plan.parallelism} given to subtask "
                             f"{self.index}/{self.parallelism}")
        if plan.checkpoint_uri != self.services.uri:
            raise ValueError(f"plan for checkpoint root {plan.checkpoint_uri} given to a subtask serving "
                             f"{self.services.uri}")

    def _prepare(self, plan: SubtaskPlan) -> None:
        manager = self.services.merging
        if manager is not None:
            self._give_up_unsynced(manager)
            same_root = plan.base_uri == plan.checkpoint_uri and not plan.base_is_savepoint
            manager.begin(plan.checkpoint_id, plan.base_checkpoint_id if same_root else None, plan.open_files,
                          plan.epoch, scope=subtask_dir(plan.index, plan.parallelism))
        self.recovery = Recovery(REUSED)
        lmdb = self._lmdb()
        if lmdb is not None:
            lmdb.lock()
        live = self._live_at_base(plan)
        if not live and lmdb is not None:  # e.g. another process moved this subtask's local state on
            self._drop_live_state(plan, destroy=False)
        if not live and self.config.table == "lmdb":
            live = self._open_local_lmdb(plan) or self._rescale_from_local_copies(plan)
        if not live:
            self._restore(plan)
        elif self.clog is not None and plan.base_checkpoint_id is not None:
            self.clog.checkpoint_completed(plan.base_checkpoint_id)
        assert self.keyed is not None
        if self.clog is not None:
            self.clog.begin(plan.checkpoint_id)
        self._mark_dirty()

    def _live_at_base(self, plan: SubtaskPlan) -> bool:
        """Whether the state this object holds is exactly the plan's base: tagged with it, of its lineage (not
        an attempt whose ack was not the one accepted), and for lmdb not moved on by another process since."""
        if self.keyed is None or plan.base_is_savepoint:
            return False
        if plan.base_checkpoint_id is None:
            return self._tag == _EMPTY
        if self._tag != plan.base_checkpoint_id or catch_up_start(self._tag, self._lineage, plan) != len(
                plan.changelog):
            return False
        lmdb = self._lmdb()
        return lmdb is None or _read_tag(lmdb) == (self._tag, self._lineage) and not lmdb.linked_elsewhere()

    def _open_local_lmdb(self, plan: SubtaskPlan) -> bool:
        """Take over this subtask's lmdb directory if its tag shows the state of a completed checkpoint that
        leads to the plan's base, replaying the change sets since (see :mod:`spate.runtime.recovery`): local
        recovery, keyed state is not downloaded (operator state, being small, always is). Otherwise delete it.
        Returns whether the state is at the base now."""
        started = time.perf_counter()
        try:
            table = open_local_table(self._lmdb_dir(plan), self.services.readers)
        except FileNotFoundError:  # a base it reads from is gone
            shutil.rmtree(self._lmdb_dir(plan), ignore_errors=True)
            return False
        except (SpateError, lmdb.Error) as e:  # e.g. a base it reads from cannot be opened in this process
            log.info("subtask %d: local state not reused: %s", self.index, e)
            return False
        inner = table.inner if isinstance(table, OverlayTable) else table
        if inner.linked_elsewhere():  # a stale attempt at the old parallelism: a rescaled subtask reads this file
            table.destroy()
            return False
        tag = _read_tag(table)
        start = catch_up_start(*tag, plan) if tag is not None else None
        if start is None or not self._intact(table):
            table.destroy()
            return False
        assert tag is not None and plan.base_checkpoint_id is not None
        state = self._with_changelog(plan, table)
        replay = plan.changelog[start:]
        try:
            if replay:
                self._catch_up(plan, state, replay)
            self._install(plan, state, self._read_operator_state(plan))
        except BaseException:
            self.close()  # the directory is not left locked by this process: a retry opens it afresh
            state.close()
            raise
        if self.clog is not None:
            self.clog.restored(plan.keyed, plan.changelog)
            self._replace_damaged_handles(plan, [*plan.keyed, *plan.changelog[:start]])
        self._tag, self._handles = plan.base_checkpoint_id, None
        self._lineage = Lineage.of(plan.key_groups, plan.keyed, plan.changelog)
        kind = recovery_kind(tag[0], start, plan)
        caught_up = kind == CAUGHT_UP
        self.recovery = Recovery(kind, plan.base_checkpoint_id if caught_up else None, tag[0] if caught_up else None,
                                 bytes_to_read(replay, plan.operator), (time.perf_counter() - started) * 1000,
                                 len(replay))
        return True

    def _rescale_from_local_copies(self, plan: SubtaskPlan) -> bool:
        """At a new parallelism: build the state from the old subtasks' local copies on this machine, reading
        checkpoint storage only for key groups no usable copy holds (:mod:`spate.runtime.rescale`). Returns
        whether the state is at the base now (False: no copy was usable, restore everything)."""
        if not plan.rescale_sources or plan.base_checkpoint_id is None or plan.base_uri is None:
            return False
        started = time.perf_counter()
        assert self.config.local_dir is not None
        rescale = LocalRescale(plan, self.config.local_dir, self.services.trusted_local, self.services.readers)
        table = rescale.build(self._lmdb_dir(plan))
        if table is None:
            return False
        state = self._with_changelog(plan, table)
        try:
            backend = self._keyed_backend(plan, state)
            rescale.merge_into(backend)
            keyed, changelog = missing_parts(plan, rescale.missing)
            restore_keyed_state(backend, self.services.storage_of(plan.base_uri), keyed, changelog,
                                self._restore_context(plan))
            self._install(plan, state, self._read_operator_state(plan))
        except BaseException:
            self.close(destroy=True)
            state.close()
            raise
        if self.clog is not None:
            self.clog.restored(plan.keyed, plan.changelog)
        self._tag, self._handles = plan.base_checkpoint_id, None
        self._lineage = Lineage.of(plan.key_groups, plan.keyed, plan.changelog)
        self.recovery = Recovery(RESCALED, plan.base_checkpoint_id, None, bytes_to_read([*keyed, *changelog],
                                 plan.operator), (time.perf_counter() - started) * 1000, len(changelog),
                                 rescale.copied_bytes, rescale.moved_bytes)
        return True

    def _catch_up(self, plan: SubtaskPlan, table: StateTable, change_sets: list[ChangeSetHandle]) -> None:
        """Replay ``change_sets`` (the base's change sets the local copy lacks) into it. Untagged meanwhile: a
        copy left half caught up is never trusted."""
        assert plan.base_checkpoint_id is not None and plan.base_uri is not None
        table.put_meta(TAG_META, _DIRTY)
        table.commit()
        restore_keyed_state(self._keyed_backend(plan, table), self.services.storage_of(plan.base_uri), [],
                            change_sets, self._restore_context(plan))
        _write_tag(table, plan.base_checkpoint_id, Lineage.of(plan.key_groups, plan.keyed, plan.changelog))

    def _intact(self, table: LmdbTable | OverlayTable) -> bool:
        """Whether the local table still holds exactly what it held at its last commit. Checked once per
        process: the check reads the whole table, and on Spark a subtask's table moves between the Python
        workers of an executor every few batches (each keeps the digest up to date as it writes)."""
        if table.path in self.services.trusted_local:
            return True
        problem = table.verify()
        if problem is None:
            self.services.trusted_local.add(table.path)
        if problem is not None:
            log.warning("subtask %d: local state %s failed its integrity check: %s; discarding it and restoring "
                        "from checkpoint storage", self.index, table.path, problem)
        return problem is None

    def _replace_damaged_handles(self, plan: SubtaskPlan, carried: list[KeyGroupsHandle | ChangeSetHandle]) -> None:
        """The reused state is carried on with the handles it was restored from: check the files of those not
        read to get here (``carried``; once per process), and if one is damaged materialize the intact local
        state now, so that no new checkpoint references the damaged file."""
        assert self.clog is not None and self.keyed is not None and plan.base_uri is not None
        problems = verify_handles(self.services.storage_of(plan.base_uri), carried, self._restore_context(plan))
        if problems:
            log.warning("subtask %d: checkpoint files its local state references are damaged (%s); materializing "
                        "the local state anew instead of referencing them", self.index, "; ".join(problems))
            self.clog.materialize_now(self.keyed, referenced_by=plan.checkpoint_id)

    def _lmdb(self) -> LmdbTable | None:
        table = self.keyed.table if self.keyed is not None else None
        while hasattr(table, "inner"):  # under the changelog and the profiling wrappers
            table = getattr(table, "inner")  # noqa: B009
        return table if isinstance(table, LmdbTable) else None

    def _table_seconds(self) -> float:
        """Seconds spent in the state table's reads and writes so far (profiling only, else 0)."""
        table = self.keyed.table if self.keyed is not None else None
        while table is not None and not isinstance(table, TimedTable):
            table = getattr(table, "inner", None)
        return table.seconds if table is not None else 0.0

    def release_local_state(self) -> None:
        """Between batches: let another process (another Spark Python worker) take this subtask's lmdb state;
        the next batch here takes it back, or reopens it if someone else moved it on."""
        lmdb = self._lmdb()
        if lmdb is not None:
            lmdb.unlock()

    def _read_operator_state(self, plan: SubtaskPlan) -> dict[str, RestoredOperatorState]:
        restored: dict[str, RestoredOperatorState] = {}
        if plan.base_checkpoint_id is None:
            return restored
        assert plan.base_uri is not None
        storage = self.services.storage_of(plan.base_uri)
        for piece in plan.operator:
            elems = read_operator_piece(storage, piece, self._restore_context(plan))
            state = restored.setdefault(piece.name, RestoredOperatorState(piece.mode, piece.serializer, []))
            state.encoded.extend(elems)
        return restored

    def _restore_context(self, plan: SubtaskPlan) -> str:
        return f"restoring subtask {self.index} from checkpoint {plan.base_checkpoint_id}"

    def _lmdb_dir(self, plan: SubtaskPlan) -> str:
        assert self.config.local_dir
        return local_state_dir(self.config.local_dir, plan.query_id, self.index, self.parallelism)

    def _new_table(self, plan: SubtaskPlan) -> StateTable:
        if self.config.table == "heap":
            return self._with_changelog(plan, HeapTable())
        path = self._lmdb_dir(plan)
        shutil.rmtree(path, ignore_errors=True)
        return self._with_changelog(plan, LmdbTable(path))

    def _with_changelog(self, plan: SubtaskPlan, table: StateTable) -> StateTable:
        """With the changelog on, wrap ``table`` so every change is also logged (and, profiling, timed)."""
        if self.config.profile:
            table = TimedTable(table)
        cfg = self.config.changelog
        if cfg is None:
            return table
        manager, materialized = self.services.merging, None
        if manager is not None:
            materialized = functools.partial(manager.shared_writer, self.index, self.parallelism)
        self.clog = ChangelogKeyedState(table, self.services.storage, cfg, self.index, self.parallelism,
                                        self.services.scheduler, materialized, self.services.materializers)
        return self.clog.table

    def _drop_live_state(self, plan: SubtaskPlan, destroy: bool) -> None:
        if self.clog is not None and plan.base_checkpoint_id is not None:
            # checkpoints this subtask took after the base were aborted: let close() delete their changes
            self.clog.abandon_after(plan.base_checkpoint_id)
        if self.keyed is not None:
            self.close(destroy=destroy)

    def _restore(self, plan: SubtaskPlan) -> None:
        self._drop_live_state(plan, destroy=True)
        table = self._new_table(plan)
        started = time.perf_counter()
        restored_ops = self._read_operator_state(plan)
        if plan.base_checkpoint_id is not None:
            # keyed state first, so the processor's open() is checked against the restored state registry
            backend = self._keyed_backend(plan, table)
            restore_keyed_state(backend, self.services.storage_of(plan.base_uri),  # type: ignore[arg-type]
                                plan.keyed, plan.changelog, self._restore_context(plan))
            if self.clog is not None:
                if plan.base_uri == plan.checkpoint_uri:
                    self.clog.restored(plan.keyed, plan.changelog)
                else:  # a savepoint elsewhere: this root must hold its own copy before the first checkpoint
                    self.clog.materialize_now(backend)
        self._install(plan, table, restored_ops)
        assert self.keyed is not None
        self.recovery = full_restore(plan, (time.perf_counter() - started) * 1000)
        self._tag = _EMPTY if plan.base_checkpoint_id is None else plan.base_checkpoint_id
        self._lineage = Lineage.of(plan.key_groups, plan.keyed, plan.changelog)
        # the restored handles describe the state only if there is no changelog part to them
        reusable = plan.base_checkpoint_id is not None and not plan.base_is_savepoint and not plan.changelog
        self._handles = (plan.base_checkpoint_id, list(plan.keyed)) if reusable else None  # type: ignore[assignment]
        self.keyed.dirty = False

    def _keyed_backend(self, plan: SubtaskPlan, table: StateTable) -> KeyedStateBackend:
        cfg = self.config
        return KeyedStateBackend(table, plan.max_parallelism, plan.key_groups, allow_pickle=cfg.allow_pickle,
                                 key_types=cfg.key_types)

    def _install(self, plan: SubtaskPlan, table: StateTable, restored_ops: dict[str, RestoredOperatorState]) -> None:
        """Create the backends over ``table`` (which already holds the state) and open the processor."""
        cfg = self.config
        self.keyed = self._keyed_backend(plan, table)
        self.operator = OperatorStateBackend(restored_ops, allow_pickle=cfg.allow_pickle)
        self.ctx = Context(self.keyed, self.operator, self.index, self.parallelism, plan.max_parallelism)
        self.processor = self.factory()
        self.processor.open(self.ctx)

    def _mark_dirty(self) -> None:
        """From here on the live state no longer equals any checkpoint until the next snapshot."""
        assert self.keyed is not None
        self.keyed.table.put_meta(TAG_META, _DIRTY)
        self.keyed.table.commit()
        self._tag = None

    def _without_late_rows(self, plan: SubtaskPlan, batch: KeyedBatch) -> KeyedBatch:
        """``batch`` without its late rows, for a processor that asks to drop them (Spark's semantics)."""
        proc, column = self.processor, self.config.event_time_column
        if not isinstance(proc, Processor) or not proc.drop_late_rows or column is None:
            return batch
        bound = _floored(plan.late_watermark_ms, proc.watermark_floor_ms)
        return batch if bound is None else batch.without_late_rows(column, bound)

    def _process(self, plan: SubtaskPlan, batch: KeyedBatch, clock: _PhaseClock,
                 initial: KeyedBatch | None = None) -> Outputs:
        keyed, ctx, proc = self.keyed, self.ctx, self.processor
        assert keyed is not None and ctx is not None and proc is not None
        keyed.now_ms = ctx.processing_time_ms = plan.processing_time_ms
        ctx.batch_id = plan.checkpoint_id
        out = OutputBuffer(proc, self.config.output_schema)
        if isinstance(proc, BatchProcessor):
            if initial is not None and len(initial):
                raise ValueError("a BatchProcessor takes no initial state: bootstrap its state with a savepoint")
            ctx.watermark_ms = plan.watermark_ms
            out.add_columns(proc.process_batch(batch, ctx), "process_batch")
        else:
            ctx.watermark_ms = watermark = _floored(plan.watermark_ms, proc.watermark_floor_ms)
            proc.start_batch(ctx)
            if proc.processing_timers_first:
                self._fire(PROCESSING_TIME, plan.processing_time_ms, out)
            if initial is not None:
                self._for_each_key(proc.process_initial, "process_initial", initial, out)
            self._for_each_key(proc.process, "process", batch, out)
            if not proc.processing_timers_first:
                self._fire(PROCESSING_TIME, plan.processing_time_ms, out)
            if watermark is not None:
                self._fire(EVENT_TIME, watermark, out)
        keyed.clear_current_key()
        out.extend(proc.end_batch(ctx), "end_batch", NO_KEY)
        clock.lap("process_ms")
        outputs = out.finish()
        clock.lap("outputs_ms")
        return outputs

    def _for_each_key(self, hook: Callable[..., Any], name: str, batch: KeyedBatch, out: OutputBuffer) -> None:
        """``hook`` (``process``, ``process_initial``) once per key of the batch, in key-group order."""
        keyed, ctx = self.keyed, self.ctx
        assert keyed is not None and ctx is not None
        enter, rows_of, extend = keyed.enter_key, batch.rows_of, out.extend
        for i, (key, kg, kb) in enumerate(zip(batch.keys, batch.key_groups, batch.encoded_keys, strict=True)):
            enter(key, kg, kb)
            extend(hook(key, rows_of(i), ctx), name, key)

    def _fire(self, domain: str, up_to: int, out: OutputBuffer) -> None:
        keyed, ctx, proc = self.keyed, self.ctx, self.processor
        assert keyed is not None and ctx is not None and isinstance(proc, Processor)
        ctx.timer_domain = domain
        due = keyed.timers.fire_then_delete if proc.timers_deleted_after_firing else keyed.timers.pop_due
        for ts, namespace in due(domain, up_to):
            ctx.timer_namespace = namespace
            out.extend(proc.on_timer(keyed.current_key, ts, ctx), "on_timer", keyed.current_key)
        ctx.timer_domain = ctx.timer_namespace = None

    def _snapshot(self, plan: SubtaskPlan, batch: KeyedBatch, out: Outputs) -> Callable[[], SubtaskAck]:
        keyed, operator = self.keyed, self.operator
        assert keyed is not None and operator is not None
        started = time.perf_counter()
        manager = self.services.merging
        keyed_out, op_out, staged_out = self._writers(plan, manager)
        new_files: list[FileRef] = []
        fix = self._relocator(plan, manager, keyed_out)
        # reuse only what the coordinator recorded for this subtask in the base checkpoint: an attempt whose
        # ack was rejected must not reuse its (deleted) files
        reuse = (self.clog is None and self._handles is not None and self._handles[0] == plan.base_checkpoint_id
                 and self._handles[1] == plan.keyed and not keyed.dirty and not keyed.has_ttl_state()
                 and (fix is None or not any(fix.needed(h) for h in plan.keyed)))
        clog_finish = None
        keyed_handles: list = []
        if self.clog is not None and not self.config.sticky:
            self.clog.materialize_if_due(keyed, plan.processing_time_ms, plan.checkpoint_id)
        if self.clog is not None:
            clog_finish = self.clog.start_snapshot(plan.checkpoint_id, keyed, fix)
        elif reuse:
            keyed_handles = self._handles[1]  # type: ignore[index]
        else:
            handle = write_keyed_snapshot(keyed, keyed_out, self.config.compress)
            keyed_handles = [handle] if handle else []
            new_files += [h.segment for h in keyed_handles]
        op_handle = write_operator_snapshot(operator, op_out)
        staged = None
        if self.config.stage_outputs:
            staged = write_outputs(out.table if out.table is not None else out.rows, staged_out,
                                   resolve_serializer(self.config.output_serializer))
        new_files += [h.segment for h in (op_handle, staged) if h is not None]
        start_ms = (time.perf_counter() - started) * 1000
        return lambda: self._acknowledge(plan, batch, start_ms, keyed_handles, clog_finish, op_handle, staged,
                                         new_files, reuse)

    def _writers(self, plan: SubtaskPlan, manager: FileMergingManager | None) -> tuple[SegmentWriter, ...]:
        """Writers of (keyed snapshots, operator state, staged outputs): segments of merged files, or whole
        files in the subtask's directory, the checkpoint's directory and the staged-outputs directory."""
        cp = plan.checkpoint_id
        if manager is not None:
            private = _Recording(manager.private_writer(cp), self._unsynced)
            return _Recording(manager.shared_writer(self.index, self.parallelism, cp), self._unsynced), private, private
        storage = self.services.storage
        return (WholeFileWriter(storage, subtask_dir(self.index, self.parallelism), ".kg", cp),
                WholeFileWriter(storage, checkpoint_dir(cp), ".op", cp),
                WholeFileWriter(storage, staged_dir(cp), ".out", cp))

    def _relocator(self, plan: SubtaskPlan, manager: FileMergingManager | None,
                   out: SegmentWriter) -> Relocator | None:
        if manager is None:
            return None
        return Relocator(self.services.storage, out, plan.non_reusable, subtask_dir(self.index, self.parallelism))

    def _acknowledge(self, plan: SubtaskPlan, batch: KeyedBatch, start_ms: float,
                     keyed_handles: list, clog_finish: Callable[[], tuple[list, list, dict]] | None,
                     op_handle: Any, staged: Any, new_files: list[FileRef], reuse: bool) -> SubtaskAck:
        """Once everything is durable: tag the live state with the checkpoint and build the ack."""
        keyed = self.keyed
        assert keyed is not None
        started = time.perf_counter()
        changelog: list = []
        clog_stats: dict = {}
        if clog_finish is not None:
            keyed_handles, changelog, clog_stats = clog_finish()
        manager = self.services.merging
        if manager is not None:
            refs = [h.segment for h in (*keyed_handles, *changelog, *(x for x in (op_handle, staged) if x))]
            manager.sync(refs, plan.checkpoint_id)
            self._give_up_unsynced(manager, keep=refs)
            files = manager.report(plan.checkpoint_id)
        else:
            files = {ref.path: [ref.length, False] for ref in new_files}
        self._lineage = Lineage.of(plan.key_groups, keyed_handles, changelog)  # the ack describes the state
        _write_tag(keyed.table, plan.checkpoint_id, self._lineage)
        keyed.dirty = False
        self._tag = plan.checkpoint_id
        self._handles = (plan.checkpoint_id, keyed_handles)
        finish_ms = (time.perf_counter() - started) * 1000
        stats = {"snapshot_ms": round(start_ms + finish_ms, 3), "snapshot_start_ms": round(start_ms, 3),
                 "keyed_bytes": sum(h.state_bytes for h in keyed_handles), "snapshot_reused": reuse,
                 "operator_bytes": op_handle.size if op_handle else 0}
        r = self.recovery
        if r.replayed:
            stats["replayed_change_sets"] = r.replayed
        if r.local_bytes:
            stats["local_copy_bytes"] = r.local_bytes
        if r.local_moved_bytes:
            stats["local_moved_bytes"] = r.local_moved_bytes
        lmdb = self._lmdb()
        if lmdb is not None:
            self.services.trusted_local.add(lmdb.path)  # this process wrote it
            overlay = self._overlay()
            if overlay is not None and r.kind != RESCALED:  # not in the rescaling batch: it has enough to do
                folded = overlay.fold(self.config.fold_per_batch)
                if folded:
                    stats["folded_entries"] = folded
        stats.update(clog_stats)
        rows = keyed.table.entry_count()
        if rows is not None:
            stats["state_rows"] = rows
        if self.clog is not None and self.config.sticky and self.clog.maybe_materialize(keyed, plan.processing_time_ms):
            stats["materialization_started"] = True
        timers = keyed.timers
        return SubtaskAck(plan.checkpoint_id, self.index, plan.epoch, keyed_handles, changelog, op_handle, staged,
                          files, self._max_event_time(batch), stats, manager.worker_id if manager else None,
                          rows=batch.num_rows, staged=self.config.stage_outputs, recovery=r.kind,
                          restored_from=r.restored_from, caught_up_from=r.caught_up_from,
                          restore_bytes=r.restore_bytes, restore_ms=round(r.restore_ms, 3),
                          next_processing_timer_ms=timers.earliest(PROCESSING_TIME),
                          next_event_timer_ms=timers.earliest(EVENT_TIME))

    def _overlay(self) -> OverlayTable | None:
        table = self.keyed.table if self.keyed is not None else None
        while table is not None and not isinstance(table, OverlayTable):
            table = getattr(table, "inner", None)
        return table

    def _max_event_time(self, batch: KeyedBatch) -> int | None:
        col = self.config.event_time_column
        return batch.max_event_time(col) if col is not None else None

    def _give_up_unsynced(self, manager: FileMergingManager, keep: list[FileRef] | None = None) -> None:
        """Segments an attempt wrote but no ack named (the attempt failed, or a copy was not needed): they no
        longer keep their files in use."""
        named = set(keep or ())
        manager.settle([ref for ref in self._unsynced if ref not in named])
        self._unsynced.clear()

    def close(self, destroy: bool = False) -> None:
        """Close the processor and the table (``destroy`` also deletes local state)."""
        if self._unsynced and self.services.merging is not None:
            self._give_up_unsynced(self.services.merging)
        if self.processor is not None:
            self.processor.close()
        if self.clog is not None:
            self.clog.close()
            self.clog = None
        if self.keyed is not None:
            if destroy:
                self.keyed.table.destroy()
            else:
                self.keyed.table.close()
        self.keyed = self.operator = self.processor = self.ctx = None
        self._tag, self._handles, self._lineage = None, None, None


def _read_tag(table: LmdbTable | OverlayTable) -> tuple[int, Lineage | None] | None:
    """(checkpoint, lineage) a local table's state was committed as (None: unknown or changed since)."""
    raw = table.committed_meta(TAG_META)
    if raw is None or raw == _DIRTY:
        return None
    try:
        checkpoint_id = int(raw)
    except ValueError:
        return None
    return checkpoint_id, Lineage.from_bytes(table.committed_meta(LINEAGE_META))


def _write_tag(table: StateTable, checkpoint_id: int, lineage: Lineage) -> None:
    """Commit the table as the state of ``checkpoint_id`` with ``lineage``, in one transaction."""
    table.put_meta(TAG_META, str(checkpoint_id).encode())
    table.put_meta(LINEAGE_META, lineage.to_bytes())
    table.commit()


def _check_services(config: SubtaskConfig, services: WorkerServices) -> None:
    """The services must have been made for ``config``: a scheduler iff the changelog is on, a file-merging
    manager iff merging is on."""
    for name, wanted, made in (("the changelog", config.changelog, services.scheduler),
                               ("file merging", config.file_merging, services.merging)):
        if (wanted is None) != (made is None):
            raise ValueError(f"the worker services of {services.uri} were made with {name} "
                             f"{'off' if made is None else 'on'}, the subtask has it "
                             f"{'off' if wanted is None else 'on'}")


class _Recording:
    """A segment writer that notes what it wrote in ``written``."""

    def __init__(self, out: SegmentWriter, written: list[FileRef]) -> None:
        self.out, self.written = out, written

    def write(self, data: bytes) -> FileRef:
        ref = self.out.write(data)
        self.written.append(ref)
        return ref

    def discard(self, ref: FileRef) -> None:
        self.out.discard(ref)


class Relocator:
    """With file merging: gives a handle's re-written copy if new checkpoints must not reference where it is,
    else the handle itself. Re-written: segments in another subtask's directory (state restored after a
    rescale: each subtask owns what it needs), and the files the plan names as not reusable (wasting too much
    space, or in the private directory of a worker of an earlier run)."""

    def __init__(self, storage: Any, out: SegmentWriter, non_reusable: list[str], own_dir: str) -> None:
        self.storage, self.out = storage, out
        self.bad, self.mine = frozenset(non_reusable), own_dir + "/"

    def needed(self, h: KeyGroupsHandle | ChangeSetHandle) -> bool:
        other_subtask = h.path.startswith("shared/subtask-") and not h.path.startswith(self.mine)
        return other_subtask or h.path in self.bad

    def __call__(self, h: H) -> H:
        return relocate(self.storage, h, self.out) if self.needed(h) else h


class _PhaseClock:
    """Milliseconds of each phase of a subtask's batch (reported in the ack's stats as ``profile``)."""

    def __init__(self) -> None:
        self.phases: dict[str, float] = {}
        self._at = time.perf_counter()

    def lap(self, phase: str) -> None:
        now = time.perf_counter()
        self.phases[phase] = self.phases.get(phase, 0.0) + (now - self._at) * 1000
        self._at = now

    def rounded(self) -> dict[str, float]:
        return {k: round(v, 3) for k, v in self.phases.items()}
