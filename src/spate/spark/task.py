"""What runs in a Spark Python worker: one call per subtask and micro-batch (one ``mapInArrow`` partition:
partition i holds subtask i's rows and its heartbeat row, which carries the subtask's plan, so a task receives
its own plan only).

The subtask's live state stays in this process between batches (and its lmdb state on executor-local disk),
but Python workers are not sticky: the next batch of a subtask may run in another worker, which then takes
the lmdb state over (it is unlocked between batches and tagged with the checkpoint it reflects) or restores
it from checkpoint storage. Returned: one row carrying the subtask's ack; the batch's outputs are staged in
checkpoint storage, where the sink reads them once the checkpoint completed (:mod:`spate.spark.staged`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from spate.checkpoint.protocol import SubtaskPlan
from spate.runtime.processor import Row
from spate.runtime.subtask import ProcessorFactory, Subtask, SubtaskConfig, remove_other_parallelisms
from spate.spark.settings import SpateSettings, executor_local_dir

KG_COLUMN = "__spate_kg"
SUBTASK_COLUMN = "__spate_subtask"
HEARTBEAT_COLUMN = "__spate_heartbeat"
PLAN_COLUMN = "__spate_plan"  # the subtask's plan (JSON), on its heartbeat row only
ROUTE_COLUMN = "__spate_route"  # the value whose hash sends the row to its subtask's partition
ACK_COLUMN = "__spate_ack"
_ENGINE_COLUMNS = (KG_COLUMN, SUBTASK_COLUMN, HEARTBEAT_COLUMN, PLAN_COLUMN, ROUTE_COLUMN)


@dataclass(frozen=True)
class TaskSpec:
    """Everything a task needs, shipped to executors inside the task's closure.

    ``run_id`` names one ``start()`` of the query: subtasks a worker kept from another run (which may have run
    another processor) are closed, never reused.
    """

    run_id: str
    factory: ProcessorFactory
    settings: SpateSettings
    stage_outputs: bool
    key_columns: tuple[str, ...]
    output_schema: pa.Schema

    def subtask_config(self) -> SubtaskConfig:
        """The subtasks' settings on this executor: lmdb state without a ``local_dir`` goes to this
        executor's local disk (:func:`executor_local_dir`), decided here, not on the driver."""
        s = self.settings
        local_dir = s.local_dir or (executor_local_dir() if s.table == "lmdb" else None)
        return SubtaskConfig(table=s.table, local_dir=local_dir, allow_pickle=s.allow_pickle,
                             event_time_column=s.event_time_column, stage_outputs=self.stage_outputs,
                             changelog=s.changelog_config, file_merging=s.file_merging_config,
                             output_schema=self.output_schema, sticky=False)


class WorkerSubtasks:
    """The subtasks this Python worker keeps between batches, per query, for one run of each query.

    A plan of another run of a query evicts (closes) the subtasks this worker kept from the query's earlier
    run before any of the new run's subtasks opens, so a restarted query never runs an old processor and
    never opens lmdb state that an evicted subtask still holds open.
    """

    def __init__(self) -> None:
        self._runs: dict[str, tuple[str, dict[tuple[int, int], Subtask]]] = {}  # query id -> (run id, subtasks)

    def get(self, spec: TaskSpec, plan: SubtaskPlan) -> Subtask:
        """The subtask that runs ``plan`` in ``spec``'s run, kept from an earlier batch of the run or new."""
        run = self._runs.get(plan.query_id)
        if run is None or run[0] != spec.run_id:
            self.evict(plan.query_id)
            run = self._runs[plan.query_id] = (spec.run_id, {})
            _remove_stale_local_state(spec, plan)
        subtasks = run[1]
        key = (plan.index, plan.parallelism)
        if key not in subtasks:
            subtasks[key] = Subtask(plan.index, plan.parallelism, spec.factory, spec.subtask_config())
        return subtasks[key]

    def evict(self, query_id: str) -> None:
        """Close (without deleting local state) every subtask kept for ``query_id``."""
        _, subtasks = self._runs.pop(query_id, ("", {}))
        for subtask in subtasks.values():
            subtask.close()

    def close(self) -> None:
        """Close every subtask (the worker is going away)."""
        for query_id in list(self._runs):
            self.evict(query_id)


def _remove_stale_local_state(spec: TaskSpec, plan: SubtaskPlan) -> None:
    """A new run at a new parallelism: this executor's local copies of the old subtasks are of no use."""
    config = spec.subtask_config()
    if config.table == "lmdb" and config.local_dir:
        remove_other_parallelisms(config.local_dir, plan.query_id, plan.parallelism)


WORKER_SUBTASKS = WorkerSubtasks()  # the one registry of this Python worker, living as long as the worker


def run_partition(spec: TaskSpec, batches: Iterable[pa.RecordBatch],
                  subtasks: WorkerSubtasks = WORKER_SUBTASKS) -> Iterator[pa.RecordBatch]:
    """Run the batch of the one subtask whose rows make up this task's partition (``mapInArrow``)."""
    received = list(batches)
    if not received:
        raise RuntimeError("a spate task got an empty partition: Spark did not keep one subtask per partition")
    yield from run_subtask(spec, pa.Table.from_batches(received), subtasks).to_batches()


def run_subtask(spec: TaskSpec, table: pa.Table, subtasks: WorkerSubtasks = WORKER_SUBTASKS) -> pa.Table:
    """Run one subtask's batch: ``table`` holds its rows and one heartbeat row carrying its plan (so every
    subtask runs every batch, and timers fire without input). The outputs were checked against the output
    schema as the processor produced them (:mod:`spate.runtime.outputs`)."""
    plan = _plan_of(table)
    subtask = subtasks.get(spec, plan)
    try:
        out = subtask.run(plan, _rows(spec, table))
    finally:
        subtask.release_local_state()
    out.ack.stats["spark_partition"] = _partition_id()
    return pa.table({ACK_COLUMN: pa.array([json.dumps(out.ack.to_dict())], pa.string())})


def _plan_of(table: pa.Table) -> SubtaskPlan:
    """The plan on the partition's heartbeat row; every row must belong to that subtask."""
    plans = [p for p in table.column(PLAN_COLUMN).to_pylist() if p is not None]
    if len(plans) != 1:
        raise RuntimeError(f"a spate task got {len(plans)} subtask plans instead of one: Spark did not keep one "
                           "subtask per partition")
    plan = SubtaskPlan.from_dict(json.loads(plans[0]))
    others = set(table.column(SUBTASK_COLUMN).to_pylist()) - {plan.index}
    if others:
        raise RuntimeError(f"rows of subtasks {sorted(others)} reached the task of subtask {plan.index}")
    return plan


def _partition_id() -> int | None:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    return ctx.partitionId() if ctx is not None else None


def _rows(spec: TaskSpec, table: pa.Table) -> list[tuple[int, Any, Row]]:
    """(key group, key, row) of every data row; rows are dicts of the stream's own columns."""
    keys = spec.key_columns
    out = []
    for row in table.to_pylist():
        if row[HEARTBEAT_COLUMN]:
            continue
        kg = row[KG_COLUMN]
        for column in _ENGINE_COLUMNS:
            del row[column]
        key = row[keys[0]] if len(keys) == 1 else tuple(row[c] for c in keys)
        out.append((kg, key, row))
    return out
