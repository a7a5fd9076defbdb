"""One subtask's batch: bring its state to the plan's base, process the batch, snapshot, acknowledge.

Transport-agnostic: the in-process runner calls it directly; the Spark transport calls it inside a Python
worker. The subtask holds one :class:`~spate.runtime.recovery.live.LiveState` (its backends, the processor open
on them, the checkpoint they reflect and how they got to the plan's base); before the batch the recovery ladder
(:func:`spate.runtime.recovery.recover`) brings it to the plan's base: reused as it is, a local copy caught up,
the old subtasks' local copies at a rescale, or checkpoint storage. Snapshots write through
:mod:`spate.runtime.snapshot_files`.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from spate.changelog.state import ChangelogKeyedState
from spate.checkpoint.ackinfo import RecoveryInfo
from spate.checkpoint.protocol import SubtaskAck, SubtaskPlan
from spate.errors import ProcessorError, short_repr
from spate.runtime.batch import AnyProcessor, BatchProcessor, KeyedBatch, KeyedRow, ProcessorFactory
from spate.runtime.fired_timers import FiredTimers
from spate.runtime.outputs import NO_KEY, OutputBuffer, Outputs
from spate.runtime.processor import Context, Processor, Row
from spate.runtime.profile import PhaseClock, table_seconds
from spate.runtime.recovery import LiveState, StateOwner, recover
from spate.runtime.services import WorkerServices
from spate.runtime.snapshot_files import SnapshotFiles
from spate.runtime.subtask_config import TABLE_KINDS, SubtaskConfig, check_services  # noqa: F401  (re-exported)
from spate.segments import FileRef, SegmentWriter
from spate.serde import resolve_serializer
from spate.sinks.table_sink import SinkFile
from spate.snapshot.handles import KeyedHandle
from spate.snapshot.keyed import write_keyed_snapshot
from spate.snapshot.native_write import native_table, write_native_snapshot
from spate.snapshot.operator import write_operator_snapshot
from spate.snapshot.outputs import PARQUET, OutputsHandle, write_outputs, write_outputs_parquet
from spate.state.keyed import KeyedStateBackend
from spate.state.operator import OperatorStateBackend
from spate.state.timers import EVENT_TIME, PROCESSING_TIME


def _floored(watermark_ms: int | None, floor_ms: int | None) -> int | None:
    """A watermark with the processor's floor under it (the floor itself before any event time)."""
    if floor_ms is None:
        return watermark_ms
    return floor_ms if watermark_ms is None else max(watermark_ms, floor_ms)


def processor_factory(processor: AnyProcessor | type[AnyProcessor] | ProcessorFactory) -> ProcessorFactory:
    """Accept a Processor or BatchProcessor instance (deep-copied per subtask), a class, or a zero-argument
    factory.

    Raises:
        ProcessorError: (a ``TypeError``) anything else.
    """
    if isinstance(processor, (Processor, BatchProcessor)):
        return lambda: copy.deepcopy(processor)
    if callable(processor):
        return processor  # type: ignore[return-value]
    raise ProcessorError(f"processor must be a Processor, a Processor class or a factory, got {processor!r}: pass "
                         "an instance or subclass of spate.Processor or spate.BatchProcessor, or a function making one")


@dataclass
class BatchOutput:
    ack: SubtaskAck
    outputs: Outputs

    @property
    def rows(self) -> list[Row]:
        return self.outputs.rows


@dataclass
class _Snapshot:
    """A batch's snapshot once started: what its ack needs when it is durable."""

    keyed_handles: list = field(default_factory=list)  # without the changelog: written, or the base's reused
    clog_finish: Callable[[], tuple[list, list, dict]] | None = None  # with it: waits, gives (keyed, log, stats)
    op_handle: Any = None
    staged: OutputsHandle | None = None
    own: list[FileRef] = field(default_factory=list)  # files of their own among the staged outputs
    sink_file: SinkFile | None = None  # a table sink's data file
    written: list[FileRef] = field(default_factory=list)  # whole files (without file merging)
    reuse: bool = False  # the keyed handles are the base's, named again (after a rescale, copied)
    start_ms: float = 0.0


class Subtask:
    """Subtask ``index`` of ``parallelism``: owns the key groups ``key_group_range(maxP, P, index)``.

    ``services`` are its worker's services for the checkpoint root (storage, file merging, changelog uploads
    and materializations), made for ``config``; the worker owns and closes them, the subtask only uses them.
    Its state is one :class:`~spate.runtime.recovery.live.LiveState` (``live``); ``keyed``, ``operator``,
    ``clog``, ``processor``, ``ctx`` and ``recovery`` are its parts."""

    def __init__(self, index: int, parallelism: int, factory: ProcessorFactory, config: SubtaskConfig,
                 services: WorkerServices) -> None:
        check_services(config, services)
        self.index, self.parallelism = index, parallelism
        self.factory = factory
        self.config = config
        self.services = services
        self.live = LiveState(StateOwner(index, parallelism, config, services, factory))
        self._files = SnapshotFiles(index, parallelism, services)

    @property
    def keyed(self) -> KeyedStateBackend | None:
        return self.live.keyed

    @property
    def operator(self) -> OperatorStateBackend | None:
        return self.live.operator

    @property
    def clog(self) -> ChangelogKeyedState | None:
        return self.live.clog

    @property
    def processor(self) -> AnyProcessor | None:
        return self.live.processor

    @property
    def ctx(self) -> Context | None:
        return self.live.ctx

    @property
    def recovery(self) -> RecoveryInfo:
        """How the state of the current batch got to its plan's base."""
        return self.live.info

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
        clock = PhaseClock()
        self._prepare(plan)
        clock.lap("prepare_ms")
        table_s = table_seconds(self.live.table)
        try:
            out = self._process(plan, self._without_late_rows(plan, batch), clock, initial)
        except Exception as e:
            e.add_note(self._where(plan))  # shown under the error, on Spark too (Python tracebacks print notes)
            raise
        clock.phases["table_ms"] = (table_seconds(self.live.table) - table_s) * 1000
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
        """Bring the live state to the plan's base (:func:`spate.runtime.recovery.recover`) and start the batch
        on it."""
        self._files.begin(plan)
        self.live = recover(plan, self.live)
        self.live.begin(plan)

    def release_local_state(self) -> None:
        """Between batches: let another process (another Spark Python worker) take this subtask's lmdb state;
        the next batch here takes it back, or reopens it if someone else moved it on."""
        self.live.release()

    def _where(self, plan: SubtaskPlan) -> str:
        """Where processing failed: the processor, the batch, the subtask and the key it was processing."""
        key = self.keyed.current_key if self.keyed is not None else None
        at_key = f", key {short_repr(key)}" if key is not None else ""
        return (f"spate: in {type(self.processor).__name__}, batch {plan.checkpoint_id}, subtask {self.index} of "
                f"{self.parallelism}{at_key}")

    def _without_late_rows(self, plan: SubtaskPlan, batch: KeyedBatch) -> KeyedBatch:
        """``batch`` without its late rows, for a processor that asks to drop them (Spark's semantics)."""
        proc, column = self.processor, self.config.event_time_column
        if not isinstance(proc, Processor) or not proc.drop_late_rows or column is None:
            return batch
        bound = _floored(plan.late_watermark_ms, proc.watermark_floor_ms)
        return batch if bound is None else batch.without_late_rows(column, bound)

    def _process(self, plan: SubtaskPlan, batch: KeyedBatch, clock: PhaseClock,
                 initial: KeyedBatch | None = None) -> Outputs:
        keyed, ctx, proc = self.keyed, self.ctx, self.processor
        assert keyed is not None and ctx is not None and proc is not None
        keyed.now_ms = ctx.processing_time_ms = plan.processing_time_ms
        ctx.batch_id = plan.checkpoint_id
        out = OutputBuffer(proc, self.config.output_schema, self.config.output_serializer)
        if isinstance(proc, BatchProcessor):
            if initial is not None and len(initial):
                raise ProcessorError("a BatchProcessor takes no initial state: bootstrap its state with a savepoint")
            ctx.watermark_ms = plan.watermark_ms
            out.add_columns(proc.process_batch(batch, ctx), "process_batch")
            self._fire_bulk(PROCESSING_TIME, plan.processing_time_ms, out)
            if plan.watermark_ms is not None:
                self._fire_bulk(EVENT_TIME, plan.watermark_ms, out)
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

    def _fire_bulk(self, domain: str, up_to: int, out: OutputBuffer) -> None:
        """A ``BatchProcessor``'s due timers of ``domain``, all at once (again while ``on_timers`` registers
        timers that are already due)."""
        keyed, ctx, proc = self.keyed, self.ctx, self.processor
        assert keyed is not None and ctx is not None and isinstance(proc, BatchProcessor)
        ctx.timer_domain = domain
        while len(fired := FiredTimers.take(keyed.timers, domain, up_to)):
            out.add_columns(proc.on_timers(fired, ctx), "on_timers")
        ctx.timer_domain = None

    def _snapshot(self, plan: SubtaskPlan, batch: KeyedBatch, out: Outputs) -> Callable[[], SubtaskAck]:
        """Start writing the batch's snapshot; the returned function waits until it is durable and acks."""
        live = self.live
        keyed, operator, clog = live.keyed, live.operator, live.clog
        assert keyed is not None and operator is not None
        started = time.perf_counter()
        keyed_out, op_out, staged_out = self._files.writers(plan)
        snap = _Snapshot()
        fix = self._files.relocator(plan, keyed_out)
        snap.reuse = live.may_reuse_handles(plan, fix)
        if clog is not None and not self.config.sticky:
            clog.materialize_if_due(keyed, plan.processing_time_ms, plan.checkpoint_id)
        if clog is not None:
            snap.clog_finish = clog.start_snapshot(plan.checkpoint_id, keyed, fix)
        elif snap.reuse:
            reused = live.handles[1]  # type: ignore[index]
            snap.keyed_handles = reused if fix is None else [fix(h) for h in reused]
        else:
            handle = self._full_snapshot(plan, keyed, keyed_out)
            snap.keyed_handles = [handle] if handle else []
            snap.written += [h.segment for h in snap.keyed_handles]
        snap.op_handle = write_operator_snapshot(operator, op_out)
        snap.staged, snap.own, snap.sink_file = self._stage_outputs(plan, out, staged_out)
        snap.written += [h.segment for h in (snap.op_handle, snap.staged)
                         if h is not None and h.segment not in snap.own]
        snap.start_ms = (time.perf_counter() - started) * 1000
        return lambda: self._acknowledge(plan, batch, snap)

    def _full_snapshot(self, plan: SubtaskPlan, keyed: KeyedStateBackend, out: SegmentWriter) -> KeyedHandle | None:
        """A full snapshot of the keyed state: a large lmdb table's as a native file, else key-group frames."""
        table = native_table(keyed, self.config.native_snapshots_from_bytes)
        if table is None:
            return write_keyed_snapshot(keyed, out, self.config.compress)
        return write_native_snapshot(keyed, table, self._files.native_writer(plan))

    def _stage_outputs(self, plan: SubtaskPlan, out: Outputs, staged_out: SegmentWriter
                       ) -> tuple[OutputsHandle | None, list[FileRef], SinkFile | None]:
        """The batch's outputs where the sink takes them: (staged outputs, the files of their own among them,
        a table sink's data file). With a table sink they are its data file (pre-commit); else, with a sink,
        staged in the checkpoint, as a Parquet file of their own where Spark reads them."""
        if self.config.table_sink is not None:
            return None, [], self.config.table_sink.write(out.table, plan.checkpoint_id, self.index)
        if not self.config.stage_outputs:
            return None, [], None
        if self.config.staged_format == PARQUET and out.table is not None:
            staged = write_outputs_parquet(out.table, self._files.staged_parquet_writer(plan))
            return staged, [staged.segment] if staged else [], None
        rows = out.table if out.table is not None else out.rows
        return write_outputs(rows, staged_out, resolve_serializer(self.config.output_serializer)), [], None

    def _acknowledge(self, plan: SubtaskPlan, batch: KeyedBatch, snap: _Snapshot) -> SubtaskAck:
        """Once everything is durable: tag the live state with the checkpoint and build the ack."""
        live = self.live
        keyed, clog = live.keyed, live.clog
        assert keyed is not None
        started = time.perf_counter()
        keyed_handles = snap.keyed_handles
        changelog: list = []
        clog_stats: dict = {}
        if snap.clog_finish is not None:
            keyed_handles, changelog, clog_stats = snap.clog_finish()
        op_handle, staged = snap.op_handle, snap.staged
        named = [h.segment for h in (*keyed_handles, *changelog, *(x for x in (op_handle, staged) if x))]
        files = self._files.report(plan, named, snap.written, snap.own)
        live.tag_as(plan, keyed_handles, changelog)
        finish_ms = (time.perf_counter() - started) * 1000
        stats = {"snapshot_ms": round(snap.start_ms + finish_ms, 3), "snapshot_start_ms": round(snap.start_ms, 3),
                 "keyed_bytes": sum(h.state_bytes for h in keyed_handles), "snapshot_reused": snap.reuse,
                 "operator_bytes": op_handle.size if op_handle else 0, **live.stats}
        stats.update(live.after_snapshot())
        stats.update(clog_stats)
        rows = keyed.table.entry_count()
        if rows is not None:
            stats["state_rows"] = rows
        if clog is not None and self.config.sticky and clog.maybe_materialize(keyed, plan.processing_time_ms):
            stats["materialization_started"] = True
        timers = keyed.timers
        return SubtaskAck(plan.checkpoint_id, self.index, plan.epoch, keyed_handles, changelog, op_handle, staged,
                          files, self._max_event_time(batch), stats, self._files.worker,
                          rows=batch.num_rows, staged=self.config.stage_outputs, **live.info.recovery_info(),
                          next_processing_timer_ms=timers.earliest(PROCESSING_TIME),
                          next_event_timer_ms=timers.earliest(EVENT_TIME), sink_file=snap.sink_file,
                          state_entries=rows)

    def _max_event_time(self, batch: KeyedBatch) -> int | None:
        col = self.config.event_time_column
        return batch.max_event_time(col) if col is not None else None

    def close(self, destroy: bool = False) -> None:
        """Close the processor and the table (``destroy`` also deletes local state)."""
        self._files.give_up_unsynced()
        self.live.close(destroy=destroy)
