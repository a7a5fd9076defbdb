"""A StatefulProcessor in event time on spate equals a model of Spark's transformWithState semantics (watermark 0
at first, late rows dropped at the previous batch's watermark, input before timers, timers at or below the
watermark), through restarts at other parallelisms and crashes mid-checkpoint."""

from __future__ import annotations

from collections.abc import Iterator

import pandas as pd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle

from helpers.faults import CrashOnce
from spate import LocalRunner
from spate.spark.adapter import StatefulProcessorAdapter

DELAY = 1_000
AHEAD = 500


class CountUntilQuiet(StatefulProcessor):
    """Counts a key's rows; a timer AHEAD ms after its newest row reports the count."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.count = handle.getValueState("count", "c long")

    def handleInputRows(self, key, rows, timerValues) -> Iterator[pd.DataFrame]:  # noqa: N802,N803
        frames = list(rows)
        count = (self.count.get()[0] if self.count.exists() else 0) + sum(len(f) for f in frames)
        self.count.update((count,))
        for t in list(self.handle.listTimers()):
            self.handle.deleteTimer(t)
        self.handle.registerTimer(max(int(t) for f in frames for t in f["ts"]) + AHEAD)
        yield pd.DataFrame({"user": [key[0]], "what": ["in"], "n": [count],
                            "wm": [timerValues.getCurrentWatermarkInMs()]})

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo) -> Iterator[pd.DataFrame]:  # noqa: N802,N803
        yield pd.DataFrame({"user": [key[0]], "what": [f"timer@{expiredTimerInfo.getExpiryTimeInMs()}"],
                            "n": [self.count.get()[0]], "wm": [timerValues.getCurrentWatermarkInMs()]})

    def close(self) -> None:
        pass


def model(batches):
    """Spark's semantics, batch by batch: what each batch outputs (as sorted tuples)."""
    count, timer, out = {}, {}, []
    max_event, watermark, previous = None, 0, 0
    for rows in batches:
        late_bound, produced = previous, []
        by_key = {}
        for r in rows:
            if r["ts"] > late_bound:
                by_key.setdefault(r["user"], []).append(r["ts"])
        for user, times in by_key.items():
            count[user] = count.get(user, 0) + len(times)
            timer[user] = max(times) + AHEAD
            produced.append((user, "in", count[user], watermark))
        for user, expiry in sorted(timer.items()):
            if expiry <= watermark:
                produced.append((user, f"timer@{expiry}", count[user], watermark))
                del timer[user]
        out.append(sorted(produced))
        if rows:
            max_event = max([r["ts"] for r in rows] + ([max_event] if max_event is not None else []))
        previous = watermark
        if max_event is not None:
            watermark = max(watermark, max_event - DELAY)
    return out


batch_strategy = st.lists(st.fixed_dictionaries({"user": st.sampled_from("abcde"),
                                                 "ts": st.integers(0, 16).map(lambda t: t * 500)}),
                            max_size=8)  # coarse times: timers land exactly on the watermark


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(batch_strategy, min_size=1, max_size=6), st.lists(st.integers(1, 4), min_size=3, max_size=3),
       st.integers(0, 5), st.sampled_from(["after_acks", "after_complete", "after_subtask_0", None]))
def test_event_time_processor_equals_the_model(tmp_path_factory, batches, parallelisms, crash_at, step):
    root = str(tmp_path_factory.mktemp("root"))
    got: dict[int, list] = {}
    fault = CrashOnce(step, crash_at)

    def sink(outputs, batch_id):  # after the checkpoint; a batch whose sink call crashed is given again
        got[batch_id] = sorted((o["user"], o["what"], o["n"], o["wm"]) for o in outputs)

    runs = 0
    while len(got) < len(batches) and runs < 8:  # one run per restart, at another parallelism each time
        p = parallelisms[runs % len(parallelisms)]
        runs += 1
        adapter = StatefulProcessorAdapter(CountUntilQuiet(), "pandas", "EventTime")
        with LocalRunner(adapter, key="user", checkpoint_root=root, parallelism=p, max_parallelism=8,
                         event_time_column="ts", watermark_delay_ms=DELAY, clock=lambda: 1_000_000,
                         fault_injector=fault, sink=sink) as runner:
            try:
                for n in range(runner.next_batch_id, min(runner.next_batch_id + 2, len(batches))):
                    runner.run_batch(n, batches[n])
            except RuntimeError as e:
                assert "injected crash" in str(e)
    want = model(batches)
    assert [got[n] for n in range(len(batches))] == want


class RemembersInstance(StatefulProcessor):
    """Reports whether an instance attribute set by an earlier call survived, and fails once on key "boom"."""

    failed = [False]

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.calls = 0

    def handleInputRows(self, key, rows, timerValues) -> Iterator[pd.DataFrame]:  # noqa: N802,N803
        self.calls += 1
        if key[0] == "boom" and not RemembersInstance.failed[0]:
            RemembersInstance.failed[0] = True
            raise RuntimeError("the batch fails once")
        yield pd.DataFrame({"user": [key[0]], "what": ["in"], "n": [self.calls], "wm": [-1]})

    def close(self) -> None:
        pass


def test_every_batch_gets_a_fresh_processor_as_a_spark_task_does(tmp_path):
    """Spark deserializes the processor for every task: attributes never carry over between batches, nor from a
    failed attempt of a batch to its retry."""
    with LocalRunner(StatefulProcessorAdapter(RemembersInstance()), key="user",
                     checkpoint_root=str(tmp_path)) as runner:
        first = runner.run_batch(0, [{"user": "a"}, {"user": "b"}]).outputs
        second = runner.run_batch(1, [{"user": "a"}, {"user": "c"}]).outputs
        try:
            runner.run_batch(2, [{"user": "a"}, {"user": "boom"}])
        except Exception as e:  # noqa: BLE001
            assert "fails once" in str(e)
        retried = runner.run_batch(2, [{"user": "a"}, {"user": "boom"}]).outputs
    assert [sorted(o["n"] for o in out) for out in (first, second, retried)] == [[1, 2]] * 3
