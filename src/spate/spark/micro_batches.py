"""The driver side of a run's micro-batches, whatever the transport: the :class:`~spate.runtime.query.QueryDriver`
that plans and completes each checkpoint, the spec of the run's tasks, the job that runs them, and the sink.

Per micro-batch (``foreachBatch(df, n)``) the query driver plans checkpoint n, the transport's job runs every
subtask and collects the acks (classic mode: :class:`~spate.spark.subtask_job.SubtaskJob`, where each subtask's
state lives; Spark Connect: :class:`~spate.spark.connect_job.ArrowSubtaskJob`), the coordinator completes
checkpoint n, and only then does the sink get the batch's outputs (already staged in the checkpoint: a crash
before the sink finished re-delivers them with the same batch id). A batch Spark replays after checkpoint n
completed is not processed again.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any, Protocol, cast

from spate.checkpoint.metadata import CheckpointMetadata
from spate.checkpoint.protocol import SubtaskAck, SubtaskPlan
from spate.fs import storage_for
from spate.runtime.query import QueryDriver
from spate.sinks.table_sink import TableSink
from spate.spark.sessions import is_connect
from spate.spark.settings import SpateSettings
from spate.spark.staged import StagedOutputs, staged_format
from spate.spark.stream_definition import Sink, StreamDefinition
from spate.spark.stream_metrics import BatchMetrics, JobFigures, StreamFigures
from spate.spark.task import TaskSpec

log = logging.getLogger(__name__)


class SubtaskRunner(Protocol):
    """A transport's job: one per micro-batch, running every subtask of ``plans`` (encoded, one per subtask) on
    the batch's rows and returning their acks."""

    def run(self, batch_df: Any, batch_id: int, plans: list[bytes], *, with_initial: bool = False
            ) -> list[SubtaskAck]: ...


class JobCount(Protocol):
    """Spark jobs a batch started and the tasks of its subtask stage, where the transport can tell."""

    def since(self) -> int: ...

    def last_stage_tasks(self) -> int: ...


class NoJobCount:
    """Where the transport cannot count Spark's jobs (Spark Connect has no status tracker): 0."""

    def since(self) -> int:
        return 0

    def last_stage_tasks(self) -> int:
        return 0


Guard = Callable[[Callable[[], list[SubtaskAck]]], list[SubtaskAck]]  # runs the job, may check around it


class MicroBatches:
    """The driver side of one run's micro-batches: on construction the take-over of the root by its
    :class:`QueryDriver`, the spec of its tasks (:class:`TaskSpec`), the transport's job (``job_of(spec)``) and the
    sink (a function of the outputs' DataFrame and the batch id, or a :class:`TableSink`). ``session`` is the one
    the sink's DataFrames are read with (the transport keeps it current). Each batch's figures go to
    ``figures``.

    Raises:
        SettingError: staged outputs the root cannot hold.
        CheckpointError: the root cannot be taken over. FencedError: another driver took it over meanwhile.
    """

    def __init__(self, stream: StreamDefinition, settings: SpateSettings, sink: Sink | TableSink | None,
                 figures: StreamFigures, job_of: Callable[[TaskSpec], SubtaskRunner]) -> None:
        self.stream, self.figures = stream, figures
        self.table_sink = sink if isinstance(sink, TableSink) else None
        self.sink = None if self.table_sink is not None else cast("Sink | None", sink)  # not a TableSink
        staged = (staged_format(settings.staged_outputs, storage_for(settings.checkpoint_root),
                                stream.arrow_output_schema) if self.sink else "arrow")
        self.driver = driver = QueryDriver(
            settings, idle=stream.idle, autoscale=stream.autoscale,
            deliver_staged=self._deliver_staged if self.sink is not None else None, table_sink=self.table_sink,
            output_schema=stream.arrow_output_schema, progress=stream.progress)
        self._staged = StagedOutputs(driver.coordinator.storage, stream.output_schema, stream.arrow_output_schema,
                                     settings.allow_pickle)
        # one run id per start(): executors never reuse subtasks (processors) of another run
        self.spec = TaskSpec(uuid.uuid4().hex, stream.factory, settings, stream.key_columns,
                             stream.arrow_output_schema, driver.max_parallelism, stage_outputs=sink is not None,
                             table_sink=self.table_sink, staged_format=staged)
        self.job = job_of(self.spec)
        self.session: Any = None  # what the sink's DataFrames are read with
        self.on_complete: Callable[[Any], None] | None = None  # given the completed batch (where state lives)
        self._deliver_ms = 0.0  # the last sink call's

    def run(self, batch_df: Any, batch_id: int, jobs: JobCount, guard: Guard | None = None) -> BatchMetrics | None:
        """Batch ``batch_id`` of ``batch_df``: its checkpoint planned, its subtasks run by the job (``guard``
        around it), the checkpoint completed and the outputs delivered. Returns its metrics, None for a batch a
        complete checkpoint covers (Spark ran it again: only re-delivered)."""
        driver = self.driver
        started = time.perf_counter()
        self._deliver_ms = 0.0
        self.figures.redelivered.extend(driver.redeliver())
        if driver.covered(batch_id):
            log.info("batch %d is covered by a complete checkpoint: not processed again", batch_id)
            self.figures.replayed(batch_id, (time.perf_counter() - started) * 1000)
            return None
        driver.apply_rescale(batch_id)
        job: list[JobFigures] = []

        def run_subtasks(plans: list[SubtaskPlan]) -> list[SubtaskAck]:  # the batch's one Spark job
            job_started = time.perf_counter()
            # a long log since the materialization is named, not listed: the plans stay the same size
            sent = [json.dumps(plan.compacted().to_dict()).encode() for plan in plans]
            fresh = plans[0].base_checkpoint_id is None  # a new query: the initial state goes in

            def run() -> list[SubtaskAck]:
                return self.job.run(batch_df, batch_id, sent, with_initial=fresh)

            acks = run() if guard is None else guard(run)
            job.append(JobFigures(jobs.since(), jobs.last_stage_tasks(),
                                  int((time.perf_counter() - job_started) * 1e6) / 1000, max(map(len, sent))))
            return acks

        done = driver.run_batch(batch_id, run_subtasks, on_complete=self.on_complete)
        meta = done.checkpoint
        log.info("checkpoint %d: %s", batch_id, "; ".join(
            f"subtask {i} {st.recovery} on {st.executor or '?'} ({st.restore_bytes} B, {st.restore_ms:.0f} ms)"
            for i, st in enumerate(meta.subtasks)))
        if driver.committer is not None:
            self._deliver_ms = driver.committer.last_commit_ms
        metrics = BatchMetrics.of(meta, job[0], batch_ms=(time.perf_counter() - started) * 1000,
                                  commit_ms=done.commit_ms, deliver_ms=self._deliver_ms)
        self.figures.completed(meta, metrics)
        return metrics

    def _deliver_staged(self, meta: CheckpointMetadata) -> None:
        """The sink gets a complete checkpoint's outputs, read from where its subtasks staged them."""
        assert self.sink is not None
        started = time.perf_counter()
        self.sink(self._staged.frame(self.session, meta), meta.checkpoint_id)
        self._deliver_ms = (time.perf_counter() - started) * 1000

    def close(self) -> None:
        self.driver.close()


def run_one_batch(stream: StreamDefinition, settings: SpateSettings, batch_df: Any, *, savepoint_to: str) -> None:
    """Run the batch DataFrame ``batch_df`` as the one batch of a new query of ``stream`` (spate's job, without a
    streaming query; on a Connect session the client drives it) and copy its checkpoint to ``savepoint_to``
    (:meth:`StatefulStream.run_one_batch`)."""
    from spate.spark.connect_job import ArrowSubtaskJob
    from spate.spark.placement import Placement
    from spate.spark.subtask_job import SubtaskJob

    driver = QueryDriver(settings)
    try:
        spec = TaskSpec(uuid.uuid4().hex, stream.factory, settings, stream.key_columns, stream.arrow_output_schema,
                        driver.max_parallelism)
        job: SubtaskRunner = (ArrowSubtaskJob(spec, stream.initial_state) if is_connect(batch_df.sparkSession)
                              else SubtaskJob(batch_df.sparkSession, spec, stream.initial_state, Placement()))
        batch_id = driver.next_batch_id
        driver.run_batch(batch_id, lambda plans: job.run(
            batch_df, batch_id, [json.dumps(plan.to_dict()).encode() for plan in plans]))
        driver.savepoint(savepoint_to)
    finally:
        driver.close()
