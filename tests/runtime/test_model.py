"""Property-based: random state operations on random keys, one checkpoint per batch, crashes at every
protocol step, restarts at random parallelism (1..16, max parallelism 128) and table kind. The outputs, the
checkpointed keyed state, the timers and the operator state always equal a plain in-memory model; the sink
sees every batch at least once with identical outputs. The scenarios and the model check are in helpers/model.py."""

from __future__ import annotations

import os

from hypothesis import given, settings
from hypothesis import strategies as st

from helpers.model import (
    MERGING_MODES,
    batches_st,
    run_scenario,
    scenario_changelog_throughout,
    scenario_file_merging_across_with_rescales,
    scenario_rescale_up_and_down_with_crash,
    segment,
)


@settings(max_examples=int(os.environ.get("SPATE_MODEL_EXAMPLES", "40")))
@given(batches_st, st.lists(segment, max_size=3),
       st.tuples(st.integers(1, 16), st.sampled_from(["heap", "lmdb"]), st.booleans(), st.sampled_from(MERGING_MODES)))
def test_state_matches_model_across_crashes_and_rescales(raw_batches, segments, final):
    run_scenario(raw_batches, segments, final)


def test_model_scenario_rescale_up_and_down_with_crash():
    """A fixed, readable instance of the property: 2 → 16 (crash after acks) → 3 → 1."""
    scenario_rescale_up_and_down_with_crash()


def test_model_scenario_changelog_throughout():
    scenario_changelog_throughout()


def test_model_scenario_file_merging_across_with_rescales():
    """Changelog and merging across checkpoints throughout, with crashes and rescales 2 → 5 → 1 → 3."""
    scenario_file_merging_across_with_rescales()
