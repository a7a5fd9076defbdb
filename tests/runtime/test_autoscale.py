"""The autoscaling policy (spate.runtime.autoscale): its rules, bounds and cooldown, and the Spark progress adapter."""

from __future__ import annotations

import dataclasses
import json
import math
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spate.runtime.autoscale import (
    AutoscalePolicy,
    Autoscaler,
    Observation,
    ScalingDecision,
    progress_observation,
)


def obs(batch_id: int, p: int, ms: float, rows: int = 100, backlog: int | None = None, at_s: float = 0.0):
    return Observation(batch_id, p, ms, rows, backlog, at_s=at_s)


def target_after(scaler: Autoscaler, o: Observation) -> int:
    """The parallelism for the next batch: the decision's, else unchanged."""
    decision = scaler.observe(o)
    return decision.to_parallelism if decision else o.parallelism


# ---------------------------------------------------------------- examples


def test_slow_batch_scales_up_proportionally_with_a_readable_reason():
    scaler = Autoscaler(AutoscalePolicy(1, 64, target_batch_ms=1000), limit=128)
    decision = scaler.observe(obs(12, 4, 1500))
    assert decision == ScalingDecision(12, 4, 6, "batch 12 took 1,500 ms, target 1,000 ms: 4 → 6", 0.0)
    assert scaler.decisions == [decision]
    assert json.loads(json.dumps(decision.to_dict()))["to_parallelism"] == 6


def test_scale_up_is_at_most_max_step():
    scaler = Autoscaler(AutoscalePolicy(1, 64, target_batch_ms=1000), limit=128)
    decision = scaler.observe(obs(12, 4, 10_000))
    assert decision is not None and decision.to_parallelism == 8
    assert "at most ×2 a step" in decision.reason


def test_backlog_over_the_bound_scales_up_by_max_step():
    scaler = Autoscaler(AutoscalePolicy(1, 64, max_backlog_rows=10_000, max_step=3), limit=128)
    decision = scaler.observe(obs(3, 2, 10, backlog=50_000))
    assert decision is not None and decision.to_parallelism == 6
    assert "backlog of 50,000 rows, max 10,000" in decision.reason


def test_fast_batch_scales_down_towards_the_middle_of_the_band():
    scaler = Autoscaler(AutoscalePolicy(1, 64, target_batch_ms=1000), limit=128)
    # 8 * 200 / 750 = 2.13 -> 3, but one step goes at most ÷2: 4
    decision = scaler.observe(obs(5, 8, 200, backlog=0))
    assert decision is not None and (decision.from_parallelism, decision.to_parallelism) == (8, 4)
    decision = Autoscaler(AutoscalePolicy(1, 64, target_batch_ms=1000), limit=128).observe(obs(5, 8, 450))
    assert decision is not None and decision.to_parallelism == 5  # 8 * 450 / 750 = 4.8 -> 5


def test_no_scale_down_while_a_backlog_is_waiting():
    policy = AutoscalePolicy(1, 64, target_batch_ms=1000, max_backlog_rows=1000)
    assert Autoscaler(policy, 128).observe(obs(5, 8, 100, backlog=300)) is None  # over max_backlog_rows / 4
    assert Autoscaler(policy, 128).observe(obs(5, 8, 100, backlog=250)) is not None
    no_bound = AutoscalePolicy(1, 64, target_batch_ms=1000)
    assert Autoscaler(no_bound, 128).observe(obs(5, 8, 100, backlog=1)) is None  # without a bound: only 0 is low


def test_in_band_and_empty_batches_make_no_decision():
    scaler = Autoscaler(AutoscalePolicy(1, 64, target_batch_ms=1000), limit=128)
    assert scaler.observe(obs(1, 4, 800)) is None
    assert scaler.observe(obs(2, 4, 5, rows=0)) is None  # an idle batch is no reason to scale down
    assert scaler.observe(obs(3, 4, 5000, rows=0)) is None
    assert scaler.decisions == []


def test_bounds_and_key_group_limit():
    scaler = Autoscaler(AutoscalePolicy(2, 64, target_batch_ms=1000), limit=10)
    assert scaler.max_parallelism == 10
    assert target_after(scaler, obs(1, 8, 5000)) == 10
    low = Autoscaler(AutoscalePolicy(2, 64, target_batch_ms=1000), limit=10)
    assert target_after(low, obs(1, 3, 10)) == 2
    outside = Autoscaler(AutoscalePolicy(2, 64, target_batch_ms=1000), limit=10)
    decision = outside.observe(obs(1, 1, 800))
    assert decision is not None and decision.to_parallelism == 2 and "outside the bounds [2, 10]" in decision.reason


def test_cooldown_in_batches_and_seconds_and_by_hand():
    scaler = Autoscaler(AutoscalePolicy(1, 64, target_batch_ms=1000, cooldown_batches=2, cooldown_s=30), 128)
    assert target_after(scaler, obs(10, 2, 3000, at_s=100)) == 4
    assert scaler.observe(obs(11, 4, 3000, at_s=200)) is None  # batches 11, 12 cool down
    assert scaler.observe(obs(12, 4, 3000, at_s=200)) is None
    assert scaler.observe(obs(13, 4, 3000, at_s=120)) is None  # past the batches, not yet 30 s
    assert target_after(scaler, obs(14, 4, 3000, at_s=130)) == 8
    scaler.note_rescaled(20, at_s=500)
    assert scaler.observe(obs(21, 8, 3000, at_s=600)) is None
    assert scaler.observe(obs(23, 8, 3000, at_s=600)) is not None


def test_a_repeated_batch_id_is_observed_once():
    scaler = Autoscaler(AutoscalePolicy(1, 64, target_batch_ms=1000, cooldown_batches=0), 128)
    assert scaler.observe(obs(7, 2, 3000)) is not None
    assert scaler.observe(obs(7, 4, 3000)) is None


def test_decisions_are_logged(caplog):
    scaler = Autoscaler(AutoscalePolicy(1, 64, target_batch_ms=1000), 128)
    with caplog.at_level("INFO", logger="spate.runtime.autoscale"):
        scaler.observe(obs(12, 4, 1500))
    assert "batch 12 took 1,500 ms, target 1,000 ms: 4 → 6" in caplog.text


# ---------------------------------------------------------------- bad policies


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"min_parallelism": 0, "max_parallelism": 4, "target_batch_ms": 1}, "min_parallelism must be >= 1"),
        ({"min_parallelism": 5, "max_parallelism": 4, "target_batch_ms": 1}, "max_parallelism \\(4\\) must be >="),
        ({"min_parallelism": 1, "max_parallelism": 4}, "set target_batch_ms .* and/or max_backlog_rows"),
        ({"min_parallelism": 1, "max_parallelism": 4, "target_batch_ms": 0}, "target_batch_ms must be a positive"),
        ({"min_parallelism": 1, "max_parallelism": 4, "target_batch_ms": math.nan}, "target_batch_ms must be a"),
        ({"min_parallelism": 1, "max_parallelism": 4, "max_backlog_rows": 0}, "max_backlog_rows must be >= 1"),
        ({"min_parallelism": 1, "max_parallelism": 4, "target_batch_ms": 1, "cooldown_batches": -1},
         "cooldown_batches must be >= 0"),
        ({"min_parallelism": 1, "max_parallelism": 4, "target_batch_ms": 1, "cooldown_s": -1.0},
         "cooldown_s must be a finite number >= 0"),
        ({"min_parallelism": 1, "max_parallelism": 4, "target_batch_ms": 1, "scale_down_below": 1.0},
         "scale_down_below must be a fraction strictly between 0 and 1"),
        ({"min_parallelism": 1, "max_parallelism": 4, "target_batch_ms": 1, "max_step": 1.0},
         "max_step must be a finite factor > 1"),
    ],
)
def test_bad_policies_are_refused_with_the_field_and_the_fix(kwargs, message):
    with pytest.raises(ValueError, match=message):
        AutoscalePolicy(**kwargs)


def test_a_limit_below_min_parallelism_is_refused():
    with pytest.raises(ValueError, match="limit .* is 2, below AutoscalePolicy.min_parallelism 4"):
        Autoscaler(AutoscalePolicy(4, 8, target_batch_ms=1), limit=2)


# ---------------------------------------------------------------- properties


@st.composite
def policies(draw):
    low = draw(st.integers(1, 16))
    return AutoscalePolicy(
        min_parallelism=low,
        max_parallelism=draw(st.integers(low, 64)),
        target_batch_ms=draw(st.none() | st.floats(1, 10_000)),
        max_backlog_rows=draw(st.integers(1, 10_000)),
        cooldown_batches=draw(st.integers(0, 5)),
        cooldown_s=draw(st.sampled_from([0.0, 10.0])),
        scale_down_below=draw(st.floats(0.05, 0.95)),
        max_step=draw(st.floats(1.1, 4)),
    )


observations = st.builds(
    Observation,
    batch_id=st.integers(0, 1000),
    parallelism=st.integers(1, 80),
    batch_ms=st.floats(0, 100_000),
    rows=st.integers(0, 10**6),
    backlog_rows=st.none() | st.integers(0, 10**6),
    at_s=st.floats(0, 10**6),
)


@given(policies(), st.integers(1, 128), observations)
def test_a_decision_is_within_the_bounds_and_changes_something(policy, limit, o):
    limit = max(limit, policy.min_parallelism)
    scaler = Autoscaler(policy, limit)
    decision = scaler.observe(o)
    if decision is not None:
        assert policy.min_parallelism <= decision.to_parallelism <= min(policy.max_parallelism, limit)
        assert decision.to_parallelism != decision.from_parallelism == o.parallelism
        assert decision.batch_id == o.batch_id and scaler.decisions == [decision]


@given(policies(), observations, st.data())
def test_one_step_is_at_most_max_step(policy, o, data):
    scaler = Autoscaler(policy, 64)
    p = data.draw(st.integers(policy.min_parallelism, scaler.max_parallelism), label="parallelism")
    decision = scaler.observe(dataclasses.replace(o, parallelism=p))
    if decision is not None:  # at least one step of 1, so that a small parallelism can still move
        assert decision.to_parallelism <= max(math.floor(p * policy.max_step), p + 1)
        assert decision.to_parallelism >= min(math.ceil(p / policy.max_step), p - 1)


@given(policies(), st.lists(observations, min_size=1, max_size=30))
def test_no_decision_inside_the_cooldown(policy, stream):
    scaler = Autoscaler(policy, 64)
    last: ScalingDecision | None = None
    batch_id, at_s = 0, 0.0
    for o in stream:  # make batch ids and clocks increase, as a running query's do
        batch_id, at_s = batch_id + 1 + o.batch_id % 3, at_s + o.at_s % 20
        decision = scaler.observe(Observation(batch_id, o.parallelism, o.batch_ms, o.rows, o.backlog_rows, at_s=at_s))
        if decision is not None:
            if last is not None:
                assert batch_id > last.batch_id + policy.cooldown_batches
                assert at_s - last.at_s >= policy.cooldown_s
            last = decision


@given(policies(), observations, st.floats(1, 1000))
def test_a_slower_batch_never_asks_for_less_parallelism(policy, o, slower):
    def next_parallelism(batch_ms: float) -> int:
        return target_after(Autoscaler(policy, 64), dataclasses.replace(o, batch_ms=batch_ms))

    assert next_parallelism(o.batch_ms * slower) >= next_parallelism(o.batch_ms)


# ---------------------------------------------------------------- Spark progress


def test_progress_observation_of_nothing():
    assert progress_observation(None, 4, 0.0) is None
    assert progress_observation({}, 4, 0.0) is None


# The shape of one source of a Kafka query's progress: SourceProgress.jsonValue in Spark's
# sql/api/src/main/scala/org/apache/spark/sql/streaming/progress.scala (metrics omitted when empty; Kafka offsets
# as {topic: {partition: offset}}), with the metrics KafkaMicroBatchStream.metrics reports in
# connector/kafka-0-10-sql/src/main/scala/org/apache/spark/sql/kafka010/KafkaMicroBatchStream.scala
# (min/max as Long.toString, avg as Double.toString). Partition lags here: 12 and 30 behind latest.
KAFKA_SOURCE = {
    "description": "KafkaV2[Subscribe[events]]",
    "startOffset": {"events": {"0": 100, "1": 200}},
    "endOffset": {"events": {"0": 150, "1": 230}},
    "latestOffset": {"events": {"0": 162, "1": 260}},
    "numInputRows": 80,
    "inputRowsPerSecond": 40.0,
    "processedRowsPerSecond": 55.2,
    "metrics": {"avgOffsetsBehindLatest": "21.0", "maxOffsetsBehindLatest": "30", "minOffsetsBehindLatest": "12"},
}


def test_progress_observation_sums_kafka_lag_over_sources():
    progress = {
        "batchId": 42,
        "numInputRows": 160,
        "durationMs": {"addBatch": 1200, "triggerExecution": 1450, "walCommit": 30},
        "sources": [
            KAFKA_SOURCE,
            {**KAFKA_SOURCE, "metrics": {**KAFKA_SOURCE["metrics"], "maxOffsetsBehindLatest": "5"}},
            {"description": "RateStreamV2[...]", "numInputRows": 0},  # no metrics: Spark omits an empty map
        ],
    }
    assert progress_observation(progress, 4, 7.5) == Observation(42, 4, 1450.0, 160, 35, at_s=7.5)
    no_lag = {**progress, "sources": [{"description": "FileStreamSource[...]", "numInputRows": 160}]}
    assert progress_observation(no_lag, 4, 7.5) == Observation(42, 4, 1450.0, 160, None, at_s=7.5)


@pytest.mark.spark
@pytest.mark.timeout(300)
def test_progress_observation_of_a_real_spark_query(spark):
    df = spark.readStream.format("rate").option("rowsPerSecond", 50).load()
    # The batch is counted, not ignored: Spark reports numInputRows 0 for a batch whose DataFrame never runs.
    sink = df.writeStream.foreachBatch(lambda batch, batch_id: batch.count())
    query = sink.trigger(processingTime="2 seconds").start()
    try:
        progress = _first_progress_with_rows(query, timeout_s=120)
    finally:
        query.stop()
    assert progress is not None, "the rate source produced no batch with rows in time"
    for given_progress in (progress, json.loads(progress.json)):  # PySpark's dict subclass and the plain JSON
        o = progress_observation(given_progress, 2, 1.5)
        assert o == Observation(progress["batchId"], 2, float(progress["durationMs"]["triggerExecution"]),
                                progress["numInputRows"], None, at_s=1.5)
        assert all(not source.get("metrics") for source in given_progress["sources"])  # a rate source: no lag


def _first_progress_with_rows(query, timeout_s: float):
    """The first progress with input rows, once the query waits for its next trigger (so stop interrupts no batch)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        progress = query.lastProgress
        if progress and progress["numInputRows"] > 0 and not query.status["isTriggerActive"]:
            return progress
        time.sleep(0.1)
    return None
