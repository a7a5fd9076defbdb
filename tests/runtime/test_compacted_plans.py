"""Plans that name the log instead of listing it (what the Spark transport sends once the log since the
materialization is longer than ``INLINE_CHANGE_SETS``): a subtask whose live state has the named log goes on, any
other lists the log from the base's metadata first. The model test's scenarios pass with every plan named and
sent through JSON, as Spark sends it."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers.model import (
    batches_st,
    scenario_changelog_throughout,
    scenario_file_merging_across_with_rescales,
    scenario_rescale_up_and_down_with_crash,
    segment,
)
from helpers.model import run_scenario as model_scenario
from spate import LocalRunner, load_checkpoint
from spate.changelog.state import ChangelogConfig
from spate.checkpoint.protocol import ChangelogRef, SubtaskPlan
from spate.errors import CheckpointError
from spate.fs import CheckpointStorage
from spate.runtime.recovery.trust import listed
from spate.runtime.subtask import Subtask
from spate_tools.campaigns.model_job import ModelJob


def name_every_plan(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every plan a subtask gets has its log named (``inline=0``) and went through JSON; counts the named."""
    named: list[int] = []
    start = Subtask.start

    def start_with_named_log(self: Subtask, plan: SubtaskPlan, *args: Any, **kwargs: Any) -> Any:
        sent = SubtaskPlan.from_dict(json.loads(json.dumps(plan.compacted(inline=0).to_dict())))
        named.append(sent.changelog_ref is not None)
        return start(self, sent, *args, **kwargs)

    monkeypatch.setattr(Subtask, "start", start_with_named_log)
    return named


@pytest.fixture
def named_plans(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    return name_every_plan(monkeypatch)


def test_fixed_scenarios_with_named_logs(named_plans: list[int]) -> None:
    scenario_rescale_up_and_down_with_crash()
    scenario_changelog_throughout()
    scenario_file_merging_across_with_rescales()
    assert sum(named_plans) > 20, "the scenarios' plans had logs to name"


def test_restarts_at_the_same_parallelism_list_the_named_log(named_plans: list[int]) -> None:
    """Restarts that keep the parallelism: the heap table restores, an lmdb copy is caught up or reused, each
    from a plan whose log is named, and a crash after the acks leaves a live state no checkpoint has."""
    raw = [[(k, op, x) for k in ("a", "b", "c", "ü") for op, x in (("vput", b), ("ladd", b), ("mput", b),
                                                                       ("mdel", b + 1), ("timer", b))]
           for b in range(9)]
    model_scenario(raw, [(2, "heap", 3, None, True, "off"), (2, "heap", 5, "after_acks", True, "off"),
                         (2, "lmdb", 7, "after_complete", True, "across")], (2, "lmdb", True, "across"))
    assert sum(named_plans) > 10


@settings(max_examples=int(os.environ.get("SPATE_MODEL_EXAMPLES", "15")))
@given(batches_st, st.lists(segment, max_size=3),
       st.tuples(st.integers(1, 16), st.sampled_from(["heap", "lmdb"]), st.booleans(),
                 st.sampled_from(["off", "within", "across"])))
def test_state_matches_model_with_named_logs(raw_batches, segments, final) -> None:
    with pytest.MonkeyPatch.context() as mp:
        name_every_plan(mp)
        model_scenario(raw_batches, segments, final)


def _long_log_root(tmp_path: Any) -> tuple[str, SubtaskPlan]:
    """A root whose latest checkpoint has a log of 5 change sets per subtask, and the next plan of subtask 0."""
    root = str(tmp_path / "root")
    config = ChangelogConfig(materialization_interval_ms=10**9, materialize_after_change_sets=1000)
    with LocalRunner(ModelJob, key="k", checkpoint_root=root, parallelism=2, changelog=config,
                     clock=lambda: 1000) as r:
        for n in range(6):
            r.run_batch(n, [{"k": f"k{i}", "op": "vput", "x": n, "i": 10 * n + i} for i in range(6)])
        plan = r.coordinator.begin(6, r.parallelism, 1000)[0]
    return root, plan


def test_a_plan_names_a_long_log_and_lists_it_back(tmp_path: Any) -> None:
    root, plan = _long_log_root(tmp_path)
    assert plan.log_length == len(plan.changelog) >= 5
    sent = SubtaskPlan.from_dict(json.loads(json.dumps(plan.compacted(inline=2).to_dict())))
    assert sent.changelog == [] and sent.changelog_ref == ChangelogRef.of(plan.changelog)
    assert sent.log_length == plan.log_length
    assert len(json.dumps(sent.to_dict())) < len(json.dumps(plan.to_dict())) // 2
    assert listed(sent, CheckpointStorage(root)).changelog == plan.changelog
    assert plan.compacted(inline=len(plan.changelog)) is plan  # short enough: listed as it is


def test_a_log_the_metadata_does_not_hold_is_refused(tmp_path: Any) -> None:
    root, plan = _long_log_root(tmp_path)
    storage = CheckpointStorage(root)
    sent = plan.compacted(inline=0)
    wrong = SubtaskPlan.from_dict({**sent.to_dict(), "changelog_ref": {"length": sent.log_length, "digest": "0" * 32}})
    with pytest.raises(CheckpointError, match="is not the one its plan names"):
        listed(wrong, storage)
    assert load_checkpoint(storage).checkpoint_id == 5  # the check read the metadata, and left it as it was


def test_a_plan_of_a_rescale_or_a_savepoint_is_not_compacted(tmp_path: Any) -> None:
    _root, plan = _long_log_root(tmp_path)
    import dataclasses
    for other in (dataclasses.replace(plan, base_parallelism=3), dataclasses.replace(plan, base_is_savepoint=True),
                  dataclasses.replace(plan, base_uri="file:///elsewhere")):
        assert other.compacted(inline=0) is other
