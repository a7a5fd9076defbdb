"""What runs in a Spark Python worker: one call per subtask and micro-batch (one ``applyInArrow`` group).

The subtask's live state stays in this process between batches (and its lmdb state on executor-local disk),
but Python workers are not sticky: the next batch of a subtask may run in another worker, which then takes
the lmdb state over (it is unlocked between batches and tagged with the checkpoint it reflects) or restores
it from checkpoint storage. Returned: the batch's output rows, plus one row carrying the subtask's ack.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from spate.checkpoint.protocol import SubtaskPlan
from spate.runtime.processor import Row
from spate.runtime.subtask import ProcessorFactory, Subtask, SubtaskConfig
from spate.spark.settings import executor_local_dir

KG_COLUMN = "__spate_kg"
SUBTASK_COLUMN = "__spate_subtask"
HEARTBEAT_COLUMN = "__spate_heartbeat"
ACK_COLUMN = "__spate_ack"

_live: dict[tuple[str, int, int], Subtask] = {}  # this worker's subtasks, kept between batches


@dataclass(frozen=True)
class TaskSpec:
    """Everything a task needs, shipped to executors inside the task's closure."""

    plans: dict[int, dict[str, Any]]
    factory: ProcessorFactory
    config: SubtaskConfig
    key_columns: tuple[str, ...]
    output_schema: pa.Schema


def run_group(spec: TaskSpec, key: tuple[Any, ...], table: pa.Table) -> pa.Table:
    """Run one subtask's batch: ``table`` holds its rows and one heartbeat row (so every subtask runs every
    batch, and timers fire without input)."""
    index = key[0].as_py() if hasattr(key[0], "as_py") else key[0]
    plan = SubtaskPlan.from_dict(spec.plans[index])
    subtask = _subtask(spec, plan)
    try:
        out = subtask.run(plan, _rows(spec, table))
    finally:
        subtask.release_local_state()
    outputs = pa.Table.from_pylist(out.rows, schema=spec.output_schema) if out.rows else \
        spec.output_schema.empty_table()
    outputs = outputs.append_column(ACK_COLUMN, pa.nulls(outputs.num_rows, pa.string()))
    ack = {f.name: pa.nulls(1, f.type) for f in spec.output_schema}
    ack[ACK_COLUMN] = pa.array([json.dumps(out.ack.to_dict())], pa.string())
    return pa.concat_tables([outputs, pa.table(ack)])


def _subtask(spec: TaskSpec, plan: SubtaskPlan) -> Subtask:
    key = (plan.query_id, plan.index, plan.parallelism)
    subtask = _live.get(key)
    if subtask is None:
        config = spec.config
        if config.table == "lmdb" and not config.local_dir:
            config = dataclasses.replace(config, local_dir=executor_local_dir())
        subtask = _live[key] = Subtask(plan.index, plan.parallelism, spec.factory, config)
    return subtask


def _rows(spec: TaskSpec, table: pa.Table) -> list[tuple[int, Any, Row]]:
    """(key group, key, row) of every data row; rows are dicts of the stream's own columns."""
    keys = spec.key_columns
    out = []
    for row in table.to_pylist():
        if row.pop(HEARTBEAT_COLUMN):
            continue
        kg = row.pop(KG_COLUMN)
        del row[SUBTASK_COLUMN]
        key = row[keys[0]] if len(keys) == 1 else tuple(row[c] for c in keys)
        out.append((kg, key, row))
    return out
