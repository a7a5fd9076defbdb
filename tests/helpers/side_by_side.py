"""A transformWithState processor on Spark and on spate side by side, on the same input files: ``run_spark``
(RocksDB state store) and ``run_spate`` (``spate.spark.stream.transform_with_state``) give each batch's outputs;
``data_batches`` the batches that had input; ``LateRowsAndTimers`` and ``late_batches`` are the late rows, first
watermark and ``TimerValues`` case, rows of ``INPUT`` made by ``event_row``; ``SilenceAlert`` the timer of an idle
stream."""

from __future__ import annotations

import datetime as dt
import sys
from collections.abc import Iterator

import pandas as pd
from pyspark import cloudpickle
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle

from helpers.spark_query import drain
from helpers.spark_session import spark_conf
from spate.spark.stream import transform_with_state

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # executors cannot import the tests' helpers
INPUT = "user string, n long, ts timestamp"
OUTPUT = "user string, value string"
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
START = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def event_row(user, n, seconds):
    return {"user": user, "n": n, "ts": (START + dt.timedelta(seconds=seconds)).isoformat()}


def sink_into(outputs):
    def sink(df, batch_id):
        outputs.setdefault(batch_id, []).extend(sorted((r.user, r.value) for r in df.collect()))
    return sink


def run_spark(spark, source, checkpoint, processor, time_mode="None", flavour="pandas", **conf):
    outputs: dict = {}
    with spark_conf(spark, **{"spark.sql.streaming.stateStore.providerClass": ROCKSDB, **conf}):
        df = spark.readStream.schema(INPUT).option("maxFilesPerTrigger", 1).json(source)
        if time_mode == "EventTime":
            df = df.withWatermark("ts", "10 seconds")
        grouped = df.groupBy("user")
        apply = grouped.transformWithStateInPandas if flavour == "pandas" else grouped.transformWithState
        query = drain(lambda: apply(processor, OUTPUT, "Update", time_mode).writeStream.foreachBatch(
            sink_into(outputs)).option("checkpointLocation", str(checkpoint)).start())
    if query.exception() is not None:
        raise RuntimeError(str(query.exception()))
    return outputs


def run_spate(spark, source, root, processor, time_mode="None", flavour="pandas", **conf):
    outputs: dict = {}
    with spark_conf(spark, **conf):
        df = spark.readStream.schema(INPUT).option("maxFilesPerTrigger", 1).json(source)
        stream = transform_with_state(df, "user", processor, OUTPUT, time_mode=time_mode, flavour=flavour,
                                      event_time_column="ts" if time_mode == "EventTime" else None,
                                      watermark_delay_ms=10_000, checkpoint_root=str(root), parallelism=3,
                                      local_dir=str(root) + "-local")
        try:
            stream.start(sink_into(outputs), trigger={"availableNow": True}).awaitTermination()
        finally:
            stream.close()
    return outputs


def data_batches(outputs, n):
    """Spark adds a no-data batch when only the watermark moved: compare the batches that had input."""
    return {b: outputs.get(b, []) for b in range(n)}


# -- late rows, the first watermark, TimerValues --------------------------------------------------------

class LateRowsAndTimers(StatefulProcessor):
    """Reports the rows it gets and the watermark it sees; registers an event-time timer at 0 (due at the first
    batch's watermark, 0) and one 15 s after the newest row."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.seen = handle.getValueState("seen", "n long")

    def handleInputRows(self, key, rows, timerValues) -> Iterator[pd.DataFrame]:  # noqa: N802,N803
        frames = list(rows)
        ns = sorted(n for df in frames for n in df["n"])
        newest = max(ts for df in frames for ts in df["ts"])
        if not self.seen.exists():
            self.handle.registerTimer(0)
        self.seen.update(((self.seen.get()[0] if self.seen.exists() else 0) + len(ns),))
        self.handle.registerTimer(int(pd.Timestamp(newest).timestamp() * 1000) + 15_000)
        yield pd.DataFrame({"user": [key[0]], "value": [f"rows={ns} wm={timerValues.getCurrentWatermarkInMs()}"]})

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo) -> Iterator[pd.DataFrame]:  # noqa: N802,N803
        expiry = expiredTimerInfo.getExpiryTimeInMs()
        yield pd.DataFrame({"user": [key[0]], "value": [
            f"timer={expiry} wm={timerValues.getCurrentWatermarkInMs()} seen={self.seen.get()[0]}"]})

    def close(self) -> None:
        pass


def late_batches():
    """Batch b has rows at 20·b s; from batch 2 on also rows older than the previous batch's watermark (late),
    one exactly at it (late: at or below), and ones between it and this batch's watermark (not late)."""
    out = []
    for b in range(5):
        rows = [event_row(f"u{i % 3}", b * 100 + i, 20 * b + i) for i in range(6)]
        if b >= 2:
            late_bound = 20 * (b - 2) + 5 - 10  # max event time through batch b-2, minus the 10 s delay
            rows += [event_row("u0", b * 100 + 50, late_bound - 8), event_row("u1", b * 100 + 51, late_bound),
                     event_row("u2", b * 100 + 52, late_bound + 1), event_row("u3", b * 100 + 53, late_bound + 12)]
        out.append(rows)
    return out


# -- timers fire on an idle stream ---------------------------------------------------------------------------

class SilenceAlert(StatefulProcessor):
    """Alerts when a device went silent: every row re-arms a processing-time timer 2 s ahead."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle

    def handleInputRows(self, key, rows, timerValues) -> Iterator[pd.DataFrame]:  # noqa: N802,N803
        for _ in rows:
            pass
        for ts in self.handle.listTimers():
            self.handle.deleteTimer(ts)
        self.handle.registerTimer(timerValues.getCurrentProcessingTimeInMs() + 2_000)
        return iter(())

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo) -> Iterator[pd.DataFrame]:  # noqa: N802,N803
        yield pd.DataFrame({"user": [key[0]], "value": ["silent"]})

    def close(self) -> None:
        pass
