"""A batch's input before its due timers, on Spark as in ``LocalRunner``, as a user met it: an idle alert
re-armed by every event, and a batch that starts after the alerts were due. The user whose event is in that
batch is not alerted; before the order changed, spate's ``Processor`` fired the alert first (with the count
before the event)."""

from __future__ import annotations

import json
import os
import sys
import time

import pytest
from pyspark import cloudpickle

from spate import LocalRunner, Processor, ValueStateDescriptor
from spate.spark.stream import StatefulStream

pytestmark = pytest.mark.spark
cloudpickle.register_pickle_by_value(sys.modules[__name__])
IDLE_MS = 500


class IdleAlert(Processor):
    def open(self, ctx):
        self.seen = ctx.state(ValueStateDescriptor("seen", default=0))
        self.due = ctx.state(ValueStateDescriptor("due"))

    def process(self, key, rows, ctx):
        self.seen.update(self.seen.value() + len(rows))
        if self.due.value() is not None:
            ctx.delete_processing_time_timer(self.due.value())
        self.due.update(ctx.processing_time_ms + IDLE_MS)
        ctx.register_processing_time_timer(self.due.value())

    def on_timer(self, key, timestamp_ms, ctx):
        self.due.clear()
        yield {"user": key, "idle_after": self.seen.value()}


class IdleAlertTimersFirst(IdleAlert):
    processing_timers_first = True  # the old order, still available: the alert comes before the input


def _late_batch(processor, root: str) -> list[dict]:
    now = [0]
    with LocalRunner(processor, key="user", checkpoint_root=root, clock=lambda: now[0]) as runner:
        runner.run_batch(0, [{"user": "ann"}, {"user": "bob"}])
        now[0] = IDLE_MS + 4_000
        return sorted(runner.run_batch(1, [{"user": "ann"}]).outputs, key=lambda r: r["user"])


def test_local_runner_handles_the_input_before_the_due_timers(tmp_path):
    assert _late_batch(IdleAlert, str(tmp_path / "a")) == [{"user": "bob", "idle_after": 1}]
    assert _late_batch(IdleAlertTimersFirst, str(tmp_path / "b")) == [{"user": "ann", "idle_after": 1},
                                                                      {"user": "bob", "idle_after": 1}]


class IdleAlertLogged(IdleAlert):
    """Also outputs each event, so the test sees which batch handled it."""

    def process(self, key, rows, ctx):
        super().process(key, rows, ctx)
        yield {"user": key, "idle_after": None}


def _write(directory: str, i: int, users: list[str]) -> None:
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"part-{i:05d}.json")
    with open(path, "w") as f:
        f.write("\n".join(json.dumps({"user": u}) for u in users))


def _wait_for(condition, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_spark_handles_the_input_before_the_due_timers(spark, tmp_path):
    """Batches every 8 s, alerts due 0.5 s after an event: ann's second event arrives between two batches, so
    the batch that handles it is the first one at which both alerts are due. The first batch's sink writes it:
    the next batch plans its files after the first one ends, however long that took (a file written once the
    sink had returned could miss it when the first batch overran the trigger)."""
    source = str(tmp_path / "in")
    _write(source, 0, ["ann", "bob"])
    rows: list[dict] = []

    def sink(out, batch_id):
        rows.extend([{**r.asDict(), "batch": batch_id} for r in out.collect()])  # a batch's rows at once
        if batch_id == 0:
            _write(source, 1, ["ann"])

    df = spark.readStream.schema("user string").json(source)
    stream = StatefulStream(df, "user", IdleAlertLogged, "user string, idle_after long",
                            checkpoint_root=str(tmp_path / "root"), parallelism=2)
    query = stream.start(sink, trigger={"processingTime": "8 seconds"})
    try:
        _wait_for(lambda: any(r["user"] == "bob" and r["idle_after"] is not None for r in rows), 120)
    finally:
        query.stop()
        stream.close()
    second = next(r["batch"] for r in rows if r["user"] == "ann" and r["batch"] > 0 and r["idle_after"] is None)
    alerts = [(r["user"], r["idle_after"], r["batch"]) for r in rows if r["idle_after"] is not None]
    assert alerts == [("bob", 1, second)], "bob alerted in the batch of ann's event, ann not at all"
