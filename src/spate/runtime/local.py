"""``LocalRunner``: drives subtasks batch by batch in this process, with the same driver/task protocol the
Spark transport uses (plan → process → ack → complete → sink). No JVM needed.

Every batch is one checkpoint. A new runner on the same checkpoint root resumes after the latest complete
checkpoint, at any parallelism up to the max parallelism.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import pyarrow as pa

from spate.changelog.state import ChangelogConfig
from spate.checkpoint.ackinfo import RESTORED
from spate.checkpoint.coordinator import DEFAULT_RETAINED
from spate.checkpoint.metadata import CheckpointMetadata
from spate.checkpoint.protocol import SubtaskAck, SubtaskPlan
from spate.errors import TableSinkError
from spate.filemerging.config import FileMergingConfig
from spate.runtime.autoscale import AutoscalePolicy, Autoscaler, ScalingDecision
from spate.runtime.batch import BatchProcessor, KeyedBatch
from spate.runtime.idle import IdleBatches
from spate.runtime.local_input import KeySpec, Routed, RowRouter, key_columns, key_extractor
from spate.runtime.local_worker import LocalWorker
from spate.runtime.processor import Processor, Row
from spate.runtime.query import FaultInjector, QueryDriver
from spate.runtime.services import WorkerServices
from spate.runtime.settings import SpateSettings
from spate.runtime.subtask import AnyProcessor, ProcessorFactory, Subtask, SubtaskConfig, processor_factory
from spate.sinks.table_sink import TableSink

Sink = Callable[[list[Row], int], None]


@dataclass
class BatchResult:
    """What one micro-batch produced and what its checkpoint cost."""

    batch_id: int
    outputs: list[Row]
    checkpoint: CheckpointMetadata
    batch_ms: float
    checkpoint_ms: float  # snapshots of all subtasks + the coordinator's commit
    restored_subtasks: list[int] = field(default_factory=list)
    parallelism: int = 0  # the subtasks the batch ran on
    rescaled_from: int | None = None  # the parallelism before, if the batch rescaled the query online


def _is_factory(processor: Any) -> bool:
    return not isinstance(processor, (Processor, BatchProcessor, type))


class LocalRunner:
    """Run ``processor`` over micro-batches with ``parallelism`` in-process subtasks.

    Args:
        processor: a :class:`Processor` instance (copied per subtask), class, or zero-argument factory.
        key: the key column(s) or a function of the row.
        checkpoint_root: local path or URI of checkpoint storage.
        parallelism: number of subtasks; may differ on every restart (≤ max parallelism).
        max_parallelism: number of key groups; fixed for the life of the checkpoint root.
        table: "heap" (in memory) or "lmdb" (local disk under ``local_dir``).
        key_types: Spark types of the key columns when they are not Python's default mapping.
        event_time_column / watermark_delay_ms: event time; watermark = max event time − delay.
        restore_from: a savepoint to start from when the root has no checkpoint.
        initial_state: rows (dicts with the key columns) given to the processor's ``process_initial`` in the
            first batch of a new query only (no checkpoint and no savepoint to start from), before its input.
        sink: called with (outputs, batch_id) after the batch's checkpoint completed; outputs are staged in
            the checkpoint first and re-delivered on restart if the sink did not confirm them. Or a table sink
            (:class:`~spate.sinks.ParquetSink`, :class:`~spate.sinks.DeltaSink`,
            :class:`~spate.sinks.IcebergSink`; needs ``output_schema``): each subtask writes its outputs as a
            data file of the table in the batch, committed to the table once the checkpoint completed, exactly
            once (:mod:`spate.sinks.table_sink`).
        output_serializer: how staged outputs are stored ("msgpack" or, opted in, "pickle").
        output_schema: a ``pyarrow.Schema`` every output row must match (a dict with exactly its fields, values
            of its types; see :mod:`spate.runtime.outputs`); without it rows need only be dicts. A batch with a
            wrong row fails before its checkpoint.
        changelog: log every state change (FLIP-158) so a checkpoint only uploads what changed since the
            last one; ``True`` for the defaults or a :class:`ChangelogConfig`. May change on any restart.
        file_merging: write checkpoint files as segments of few physical files (FLIP-306): ``"within"`` (or
            ``True``) merges the files of one checkpoint, ``"across"`` also later checkpoints', or a
            :class:`FileMergingConfig`. May change on any restart.
        clock: processing time in ms (defaults to wall-clock time).
        autoscale: an :class:`AutoscalePolicy`: after each batch the runner rescales itself online when the
            policy decides so (``decisions`` lists what it decided, each checkpoint that rescaled records why).
        fault_injector: called at each protocol step of a batch (``"after_acks"``, ...; see
            :class:`~spate.runtime.query.QueryDriver`); may raise, as a crash there would. For fault injection.
        progress: a line on standard error before and after a batch that restores or rescales state (which can
            take long); None (the default): only when standard error is a terminal.

    Raises:
        ProcessorError: ``processor`` is not a processor, a processor class or a factory (a ``TypeError``).
        SettingError: an argument that cannot work (a wrong type, an unknown ``table``, a root that is a file,
            a URI pyarrow cannot open, ``key_types`` spate does not key by, ...).
        InvalidParallelismError: ``parallelism`` or ``max_parallelism`` not an int in its range.
        TableSinkError: a table sink without ``output_schema``, or a table whose columns differ from it.
        IncompatibleStateError: the root's state cannot be used as asked (``parallelism`` above its max
            parallelism, another ``max_parallelism``).
        NotARootError: ``checkpoint_root`` holds files but is not a spate root.
        CheckpointError / CorruptFileError / MissingFileError: the root or ``restore_from`` cannot be read.
    """

    def __init__(self, processor: AnyProcessor | type[AnyProcessor] | ProcessorFactory, *, key: KeySpec,
                 checkpoint_root: str, parallelism: int = 1, max_parallelism: int | None = None,
                 table: str = "heap", local_dir: str | None = None, key_types: Any = None,
                 event_time_column: str | None = None, watermark_delay_ms: int = 0,
                 retained: int = DEFAULT_RETAINED, restore_from: str | None = None,
                 initial_state: Sequence[Row] | None = None, allow_pickle: bool = False,
                 compress: bool = False, changelog: bool | ChangelogConfig = False,
                 file_merging: bool | str | FileMergingConfig = False,
                 sink: Sink | TableSink | None = None, output_serializer: str = "msgpack",
                 output_schema: pa.Schema | None = None,
                 clock: Callable[[], int] | None = None, autoscale: AutoscalePolicy | None = None,
                 fault_injector: FaultInjector | None = None, progress: bool | None = None) -> None:
        factory = processor_factory(processor)
        self._router = RowRouter(key, key_types)
        table_sink = sink if isinstance(sink, TableSink) else None
        if table_sink is not None and output_schema is None:
            raise TableSinkError(f"sink={table_sink!r} writes the outputs to a table: pass "
                                 "output_schema=pyarrow.schema([...]) with the table's columns")
        self._sink = None if table_sink is not None else cast("Sink | None", sink)  # not a TableSink
        self._initial_state = initial_state
        self._clock = clock or (lambda: int(time.time() * 1000))
        settings = SpateSettings(checkpoint_root=checkpoint_root, parallelism=parallelism,
                                 max_parallelism=max_parallelism, table=table, local_dir=local_dir,
                                 changelog=changelog, file_merging=file_merging, retained=retained,
                                 event_time_column=event_time_column, watermark_delay_ms=watermark_delay_ms,
                                 allow_pickle=allow_pickle, restore_from=restore_from)
        self._driver = QueryDriver(settings, idle=IdleBatches.of(processor) if not _is_factory(processor) else None,
                                   autoscale=autoscale,
                                   deliver_staged=self._deliver_staged if self._sink is not None else None,
                                   table_sink=table_sink, output_schema=output_schema,
                                   fault_injector=fault_injector, progress=progress)
        self.coordinator = self._driver.coordinator
        temp_local_dir = None
        if table == "lmdb" and local_dir is None:
            local_dir = temp_local_dir = tempfile.mkdtemp(prefix="spate-local-")
        config = settings.subtask_config(local_dir=local_dir, stage_outputs=sink is not None,
                                         output_schema=output_schema, table_sink=table_sink, compress=compress,
                                         key_types=key_types, output_serializer=output_serializer)
        # this runner is the worker process of its subtasks: it owns them and their services
        self._worker = LocalWorker(factory, config, self.coordinator.storage.uri, temp_local_dir=temp_local_dir)
        self._worker.serve(self.parallelism)
        self._remove_other_parallelism_local_state()
        self.redelivered = self._driver.redeliver()

    @property
    def settings(self) -> SpateSettings:
        """The query's settings (the parallelism follows every rescale)."""
        return self._driver.settings

    @property
    def parallelism(self) -> int:
        return self._driver.parallelism

    @property
    def autoscaler(self) -> Autoscaler | None:
        return self._driver.autoscaler

    @property
    def config(self) -> SubtaskConfig:
        """The settings of the query's subtasks (a new config applies to the subtasks made after it is set)."""
        return self._worker.config

    @config.setter
    def config(self, config: SubtaskConfig) -> None:
        self._worker.config = config

    @property
    def services(self) -> WorkerServices:
        """The services of the subtasks' worker (this process)."""
        return self._worker.services

    @property
    def subtasks(self) -> list[Subtask]:
        """The subtasks at the current parallelism."""
        return self._worker.subtasks

    def rescale(self, parallelism: int, reason: str = "requested") -> None:
        """Run the next batch at ``parallelism`` subtasks, without a restart: keyed state is redistributed by
        key group and operator state by the FLIP-8 rules, exactly as on a restart at that parallelism. With the
        lmdb table, each new subtask builds its state from the old subtasks' local copies (no download,
        :mod:`spate.runtime.rescale`), which are deleted once a checkpoint at the new parallelism completed.
        Refused beyond the max parallelism. Outputs and state stay exactly once: if the rescaling batch fails,
        the next attempt runs at the new parallelism from the same base. ``reason`` is recorded in the metadata
        of the checkpoint that rescales (``rescale_reason``).

        Raises:
            InvalidParallelismError: ``parallelism`` is not an int >= 1 (a ``ValueError``).
            IncompatibleStateError: ``parallelism`` exceeds the query's max parallelism.
        """
        self._driver.request_rescale(parallelism, reason)
        self._apply_rescale()

    def _apply_rescale(self) -> None:
        if self._driver.apply_rescale(self.next_batch_id) is not None:
            self._worker.serve(self.parallelism)  # the old subtasks' lmdb state stays, the new ones copy from it

    def _remove_other_parallelism_local_state(self) -> None:
        """Local lmdb directories of an earlier parallelism can never be reused: delete them."""
        self._worker.remove_other_parallelisms(self.coordinator.query.query_id,  # type: ignore[union-attr]
                                               self.parallelism)

    def _deliver_staged(self, meta: CheckpointMetadata) -> None:
        """The sink gets a complete checkpoint's outputs, read from where its subtasks staged them."""
        assert self._sink is not None
        self._sink(self.coordinator.staged_outputs(meta, self.config.allow_pickle), meta.checkpoint_id)

    @property
    def max_parallelism(self) -> int:
        return self._driver.max_parallelism

    @property
    def next_batch_id(self) -> int:
        return self._driver.next_batch_id

    def run(self, source: Sequence[Sequence[Row]], until: int | None = None) -> list[BatchResult]:
        """Process ``source[n]`` for every batch id n from :attr:`next_batch_id` (replaying nothing that a
        complete checkpoint already covers) up to ``until`` (exclusive) or the end of ``source``."""
        end = len(source) if until is None else min(until, len(source))
        return [self.run_batch(n, source[n]) for n in range(self.next_batch_id, end)]

    @property
    def idle_batch_due_at(self) -> int | None:
        """When (processing time, epoch ms) the next batch is due even without input: a processing-time timer's
        time, or now when the watermark moves past an event-time timer (or at all, for a processor that asks
        for it, as Spark's transformWithState in event time does); None: not before input arrives."""
        return self._driver.idle_batch_due_at

    def run_idle(self) -> BatchResult | None:
        """Run the next batch without input if one is due by the runner's clock (as Spark runs a no-data batch
        for its stateful operators): its timers fire, the watermark moves. None, and nothing runs or is written,
        when nothing is due. ``run_batch(n, [])`` runs one unconditionally."""
        due = self.idle_batch_due_at
        if due is None or due > self._clock():
            return None
        return self.run_batch(self.next_batch_id, [])

    def run_batch(self, batch_id: int, rows: Sequence[Row]) -> BatchResult:
        """One micro-batch = one checkpoint (:meth:`QueryDriver.run_batch`). If processing or the checkpoint fails, the
        checkpoint is aborted and the error raised. If the sink fails, the checkpoint stays complete; the
        batch's staged outputs are given to the sink again before the next batch starts (or by the next
        runner).

        Raises:
            InvalidKeyError: a row's key cannot be used (a type spate does not key by, types mixed in a key
                column); SpateError: a row without the key column, or a key function that failed. Nothing is
                written for the batch; run it again corrected.
            OutputError: a processor produced an output row that is not valid (names processor, key, field).
            StateAccessError / StateDescriptorError / IncompatibleStateError / SerializationError: the
                processor used its state wrongly (see :class:`~spate.runtime.processor.Context`).
            ProcessorError: the processor lacks a hook the query needs (``process_initial``).
            FencedError: another driver took the checkpoint root over; this runner must stop.
            CheckpointError: the checkpoint could not be taken or completed (StorageError, DiskFullError:
                storage failed; an ``OSError`` too). The processor's own exceptions propagate as they are,
                with a note naming the processor, batch, subtask and key.
        """
        self._driver.redeliver()  # outputs of complete checkpoints the sink did not confirm, same batch ids
        self._apply_rescale()
        started = time.perf_counter()
        routed = self._route(rows)  # before the checkpoint begins: a bad key fails the batch with nothing to undo
        outputs: list[Row] = []
        all_started = [0.0]

        def run_subtasks(plans: list[SubtaskPlan]) -> Iterator[SubtaskAck]:
            pending = self._worker.start(plans, routed, self._initial_batches(plans))
            all_started[0] = time.perf_counter()
            for finish in pending:
                result = finish()
                outputs.extend(result.rows)
                yield result.ack

        done = self._driver.run_batch(batch_id, run_subtasks, processing_time_ms=self._clock(),
                                      deliver=(lambda meta: cast("Sink", self._sink)(outputs, meta.checkpoint_id))
                                      if self._sink is not None else None,
                                      on_complete=lambda _: self.services.checkpoint_completed(batch_id))
        meta = done.checkpoint
        # the checkpoint's cost: starting every subtask's snapshot (one after another here), waiting until all
        # are durable, and the commit
        checkpoint_ms = done.commit_ms + (done.acked_at - all_started[0]) * 1000 + sum(
            st.stats.get("snapshot_start_ms", 0.0) for st in meta.subtasks)
        restored = [i for i, st in enumerate(meta.subtasks) if st.recovery == RESTORED]
        if meta.rescaled_from is not None:  # the old parallelism's local copies are of no more use
            self._remove_other_parallelism_local_state()
        result = BatchResult(batch_id, outputs, meta, (time.perf_counter() - started) * 1000, checkpoint_ms,
                             restored, self.parallelism, meta.rescaled_from)
        self._driver.autoscale(batch_id, result.batch_ms, len(rows))
        self._apply_rescale()  # a decision applies from the next batch
        return result

    @property
    def decisions(self) -> list[ScalingDecision]:
        """What the autoscaling policy decided so far (empty without one)."""
        return self._driver.decisions

    def _initial_batches(self, plans: list[SubtaskPlan]) -> list[KeyedBatch | None]:
        """Each subtask's rows of the initial state, grouped by key, in the first batch of a new query."""
        if self._initial_state is None or not plans or plans[0].base_checkpoint_id is not None:
            return [None] * self.parallelism
        return [KeyedBatch.from_rows(rows) for rows in self._route(self._initial_state)]

    def _route(self, rows: Sequence[Row]) -> Routed:
        """(key group, key, row) of every row, per subtask at the current parallelism (:class:`RowRouter`)."""
        return self._router.route(rows, self.parallelism, self.max_parallelism)

    def savepoint(self, target_uri: str | None = None) -> str:
        """A self-contained copy of the latest checkpoint; see :meth:`Coordinator.savepoint`.

        Raises:
            CheckpointError: no complete checkpoint yet.
            SettingError: ``target_uri`` is inside the checkpoint root, where cleanup would delete it.
        """
        return self._driver.savepoint(target_uri)

    def close(self) -> None:
        """Close every subtask. Live lmdb state in an explicit ``local_dir`` stays on disk for a later runner
        to reuse; a temporary one is deleted."""
        latest = self.coordinator.latest
        self._worker.close(latest.checkpoint_id if latest is not None else None)
        self._driver.close()

    def __enter__(self) -> LocalRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["BatchResult", "KeySpec", "LocalRunner", "key_columns", "key_extractor"]
