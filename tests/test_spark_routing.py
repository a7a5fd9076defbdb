"""Routing subtask i to Spark partition i, and the task's own plan (no JVM needed)."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from spate.checkpoint.protocol import SubtaskPlan
from spate.keygroups import spark_hash
from spate.spark.routing import routing_values
from spate.spark.task import HEARTBEAT_COLUMN, KG_COLUMN, PLAN_COLUMN, SUBTASK_COLUMN, _plan_of


@pytest.mark.parametrize("parallelism", [1, 2, 3, 5, 50, 777])
def test_routing_value_of_subtask_i_hashes_to_partition_i(parallelism):
    values = routing_values(parallelism)
    assert [spark_hash(v, ["int"]) % parallelism for v in values] == list(range(parallelism))
    assert len(set(values)) == parallelism


def _partition(plans: list, subtasks: list[int]) -> pa.Table:
    return pa.table({SUBTASK_COLUMN: subtasks, KG_COLUMN: [None] * len(subtasks),
                     HEARTBEAT_COLUMN: [p is not None for p in plans],
                     PLAN_COLUMN: [json.dumps(p.to_dict()) if p else None for p in plans]})


def test_a_task_reads_its_plan_from_its_heartbeat_row_and_refuses_foreign_rows():
    plan = SubtaskPlan(checkpoint_id=3, index=1, parallelism=2, max_parallelism=8, query_id="q", epoch=1,
                       checkpoint_uri="/tmp/x")
    assert _plan_of(_partition([None, plan], [1, 1])).index == 1
    with pytest.raises(RuntimeError, match="2 subtask plans"):
        _plan_of(_partition([plan, plan], [1, 1]))
    with pytest.raises(RuntimeError, match=r"rows of subtasks \[0\]"):
        _plan_of(_partition([plan, None], [1, 0]))
