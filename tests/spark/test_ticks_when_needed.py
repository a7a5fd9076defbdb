"""The source of ticks (batches without input) only where a batch without input can be needed.

Met by a new user: ``transform_with_state`` with a ``StatefulProcessor`` in time mode ``None`` (which can have no
timers, as on Spark) still added spate's tick source, a Python data source whose Python processes Spark starts on
the driver at ``start()`` and at the first trigger: seconds before the first output, for nothing. A root whose Spark
checkpoint already logged the ticks keeps them, since Spark refuses a checkpoint whose sources changed."""

from __future__ import annotations

import sys

import pandas as pd
import pytest
from pyspark import cloudpickle
from pyspark.sql.streaming import StatefulProcessor

from helpers.file_source import write_files
from spate import BatchProcessor, Processor
from spate.runtime.batch import uses_timers
from spate.spark import transform_with_state
from spate.spark.ticks import logs_ticks

OUTPUT = "k string, count long"
cloudpickle.register_pickle_by_value(sys.modules[__name__])  # executors cannot import the tests


class RunningCount(StatefulProcessor):
    def init(self, handle):
        self.count = handle.getValueState("count", "count long")

    def handleInputRows(self, key, rows, timerValues):  # noqa: N802,N803
        n = (self.count.get()[0] if self.count.exists() else 0) + sum(len(df) for df in rows)
        self.count.update((n,))
        yield pd.DataFrame({"k": [key[0]], "count": [n]})

    def close(self):
        pass


def _run(spark, source, root, outputs, **options):
    df = spark.readStream.schema("k string").json(source)
    stream = transform_with_state(df, "k", RunningCount(), OUTPUT, checkpoint_root=root, parallelism=2, **options)
    query = stream.start(lambda out, n: outputs.extend(tuple(r) for r in out.collect()),
                         trigger={"availableNow": True})
    try:
        query.awaitTermination(300)
        return len(query.lastProgress["sources"])
    finally:
        query.stop()
        stream.close()


@pytest.mark.spark
def test_time_mode_none_adds_no_tick_source_and_a_root_that_logged_ticks_keeps_them(spark, tmp_path):
    source = str(tmp_path / "in")
    write_files(source, [[{"k": "a"}, {"k": "b"}, {"k": "a"}]])
    outputs: list = []
    assert _run(spark, source, str(tmp_path / "new"), outputs) == 1, "time mode None: the input only"
    assert sorted(outputs) == [("a", 2), ("b", 1)]

    # a root that ran with the ticks (as every adapter root did before) restarts without asking for them
    old, again = str(tmp_path / "old"), []
    assert _run(spark, source, old, [], idle_batches=True) == 2
    write_files(source, [[{"k": "a"}]], start=1)
    assert _run(spark, source, old, again) == 2, "the ticks Spark's checkpoint logged stay"
    assert again == [("a", 3)]


def test_logs_ticks_reads_the_last_source_offset():
    assert logs_ticks(['{"logOffset":3}', '{"after":-1}'])
    assert logs_ticks(['{"after":12}'])
    assert not logs_ticks(None) and not logs_ticks([])
    assert not logs_ticks(['{"after":3}', '{"logOffset":3}']), "the ticks are always the last source"
    assert not logs_ticks(['{"after":"3"}']) and not logs_ticks(['{"after":1,"more":2}']) and not logs_ticks(["-"])


def test_a_processor_has_timers_when_it_handles_them_or_declares_them():
    class Plain(Processor):
        def process(self, key, rows, ctx):
            return []

    class Timed(Plain):
        def on_timer(self, key, timestamp_ms, ctx):
            return []

    class NoTimers(Timed):
        may_have_timers = False

    class Declared(Plain):  # registers timers only to get batches without input (end_batch runs in them)
        may_have_timers = True

    class OnWatermark(Plain):  # a batch whenever the watermark moves: end_batch runs in it
        idle_batch_on_watermark_move = True

    class Batch(BatchProcessor):
        def process_batch(self, batch, ctx):
            return None

    assert not uses_timers(Plain) and not uses_timers(Plain()), "a timer of Plain would fire into nothing"
    assert uses_timers(Timed) and uses_timers(Timed())
    assert not uses_timers(NoTimers) and not uses_timers(NoTimers())
    assert uses_timers(Declared) and uses_timers(Declared())
    assert uses_timers(OnWatermark) and uses_timers(OnWatermark())
    assert not uses_timers(Batch)
    timed = Timed()
    timed.may_have_timers = False  # an instance may declare it too (the StatefulProcessor adapter does)
    assert not uses_timers(timed) and uses_timers(Timed)
