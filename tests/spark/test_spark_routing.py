"""Routing subtask i to Spark partition i, placement, and the task's own input (no JVM needed)."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from spate.checkpoint.protocol import SubtaskAck, SubtaskPlan
from spate.keygroups import spark_hash
from spate.spark.placement import ExecutorId, Placement, _executor_in, this_executor
from spate.spark.routing import routing_values
from spate.spark.task import HEARTBEAT_COLUMN, KG_COLUMN, SUBTASK_COLUMN, _check_rows_belong, run_partition


@pytest.mark.parametrize("parallelism", [1, 2, 3, 5, 50, 777])
def test_routing_value_of_subtask_i_hashes_to_partition_i(parallelism):
    values = routing_values(parallelism)
    assert [spark_hash(v, ["int"]) % parallelism for v in values] == list(range(parallelism))
    assert len(set(values)) == parallelism


def _partition(subtasks: list[int]) -> pa.Table:
    return pa.table({SUBTASK_COLUMN: subtasks, KG_COLUMN: [None] * len(subtasks),
                     HEARTBEAT_COLUMN: [True] + [False] * (len(subtasks) - 1)})


_PLAN = SubtaskPlan(checkpoint_id=3, index=1, parallelism=2, max_parallelism=8, query_id="q", epoch=1,
                    checkpoint_uri="/tmp/x")


def test_a_task_refuses_rows_of_another_subtask():
    _check_rows_belong(_PLAN, _partition([1, 1]))
    with pytest.raises(RuntimeError, match=r"rows of subtasks \[0\]"):
        _check_rows_belong(_PLAN, _partition([1, 0]))


def test_a_task_needs_exactly_its_rows_and_its_plan():
    with pytest.raises(RuntimeError, match="3 items instead of its rows and its plan"):
        next(run_partition(None, None, [b"a", b"b", b"c"]))  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="1 items"):
        next(run_partition(None, None, [json.dumps(_PLAN.to_dict()).encode()]))  # type: ignore[arg-type]


def test_executor_identity_is_read_from_the_executor_jvm_command_line():
    args = ["java", "-cp", "x", "org.apache.spark.executor.CoarseGrainedExecutorBackend", "--driver-url", "u",
            "--executor-id", "7", "--hostname", "10.0.0.3", "--cores", "1"]
    found = _executor_in(args)
    assert found == ExecutorId("10.0.0.3", "7")
    assert found.location == "executor_10.0.0.3_7"
    assert ExecutorId.parse(str(found)) == found
    assert _executor_in(["java", "org.apache.spark.deploy.SparkSubmit", "pyspark-shell"]) is None
    assert this_executor() is None  # pytest is no executor's Python worker


def test_placement_prefers_the_executor_each_subtask_last_ran_on():
    placement = Placement()
    assert placement.locations(2) == [[], []]
    placement.record(2, [SubtaskAck(3, 0, 1, executor="1@h1"), SubtaskAck(3, 1, 1, executor=None)])
    assert placement.locations(2) == [["executor_h1_1"], []]
    placement.record(2, [SubtaskAck(4, 0, 1, executor="2@h2"), SubtaskAck(4, 1, 1, executor="1@h1")])
    assert placement.locations(2) == [["executor_h2_2"], ["executor_h1_1"]]
    assert placement.locations(3) == [[], [], []]  # another parallelism: other subtasks, no known places
    placement.record(3, [SubtaskAck(5, 2, 1, executor="1@h1")])
    assert placement.locations(3) == [[], [], ["executor_h1_1"]]


def test_placement_forgets_lost_executors_and_spreads_what_one_executor_holds_beyond_its_share():
    placement = Placement()
    placement.record(4, [SubtaskAck(1, i, 1, executor="1@h") for i in range(3)] + [SubtaskAck(1, 3, 1, executor="2@h")])
    assert placement.locations(4, alive={"1", "2"}) == [["executor_h_1"], ["executor_h_1"], [], ["executor_h_2"]]
    assert placement.locations(4, alive={"1", "2", "3", "4"}) == [["executor_h_1"], [], [], ["executor_h_2"]]
    assert placement.locations(4, alive={"2", "3"}) == [[], [], [], ["executor_h_2"]]
    assert placement.locations(4) == [["executor_h_1"]] * 3 + [["executor_h_2"]]  # unknown: keep every preference
