"""The transformWithState drop-in where it used to differ from Spark, side by side with real Spark on the same
input files: timers while one fires, the timestamps and dates a processor receives (pandas and Row flavours, in
the session's time zone), the state values Spark accepts, and the session settings of the output conversion."""

from __future__ import annotations

import datetime as dt
import sys
from collections.abc import Iterator

import pandas as pd
import pytest
from pyspark import cloudpickle
from pyspark.sql import Row
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle
from test_spark_semantics import _conf, _data_batches, run_spark, run_spate
from test_spark_stream import write_files

pytestmark = pytest.mark.spark
cloudpickle.register_pickle_by_value(sys.modules[__name__])
START = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def _row(user, n, seconds):
    return {"user": user, "n": n, "ts": (START + dt.timedelta(seconds=seconds)).isoformat()}


# -- timers while one fires ------------------------------------------------------------------------------

class ListsTimersWhileFiring(StatefulProcessor):
    """Registers event-time timers at -5 and 0 (both due at the first batch's watermark, 0) and one far ahead.
    Spark lists a key's timers in its state store's order, not by time.
    The handler of -5 lists the timers, re-registers -5 (Spark deletes it after the handler anyway), registers
    1 (not due yet) and deletes 0 (due, not fired yet); any later handler lists what it sees, as does the next
    batch's input."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.batches = handle.getValueState("batches", "n long")

    def handleInputRows(self, key, rows, timerValues) -> Iterator[pd.DataFrame]:  # noqa: N802,N803
        for _ in rows:
            pass
        seen = self.batches.get()[0] if self.batches.exists() else 0
        if seen == 0:
            for ts in (-5, 0, 10**12):
                self.handle.registerTimer(ts)
        self.batches.update((seen + 1,))
        yield pd.DataFrame({"user": [key[0]], "value": [f"input batch={seen} timers={list(self.handle.listTimers())}"]})

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo) -> Iterator[pd.DataFrame]:  # noqa: N802,N803
        expiry = expiredTimerInfo.getExpiryTimeInMs()
        listed = list(self.handle.listTimers())
        if expiry == -5:
            self.handle.registerTimer(-5)
            self.handle.registerTimer(1)
            self.handle.deleteTimer(0)
        yield pd.DataFrame({"user": [key[0]], "value": [f"fired={expiry} listed={listed}"]})

    def close(self) -> None:
        pass


def test_a_firing_timer_is_listed_and_deleted_after_its_handler(spark, tmp_path):
    source = str(tmp_path / "in")
    batches = [[_row("a", 1, 1)], [_row("a", 2, 2)]]  # the watermark stays at 0: no timer fires in batch 1
    write_files(source, batches)
    want = run_spark(spark, source, tmp_path / "spark", ListsTimersWhileFiring(), "EventTime")
    got = run_spate(spark, source, tmp_path / "spate", ListsTimersWhileFiring(), "EventTime")
    assert _data_batches(got, 2) == _data_batches(want, 2)
    assert want[0] == [("a", "fired=-5 listed=[0, 1000000000000, -5]"),  # still listed while it fires
                       ("a", "fired=0 listed=[1000000000000, 1]"),  # -5 deleted after its handler; 0 fires though
                       ("a", "input batch=0 timers=[0, 1000000000000, -5]")]  # deleted, as the list was read first


# -- the timestamps and dates a processor receives ---------------------------------------------------------

TIMES = "user string, n long, ts timestamp, ntz timestamp_ntz, d date"
LOS_ANGELES = {"spark.sql.session.timeZone": "America/Los_Angeles"}


def _run_both(spark, tmp_path, batches, processor, flavour, schema=TIMES, output="user string, value string",
              **conf):
    """The same files through Spark's transformWithState and spate's, each batch's outputs sorted."""
    from spate.spark.stream import transform_with_state

    source = str(tmp_path / "in")
    write_files(source, batches)

    def sink(outputs):
        def collect(df, batch_id):
            outputs.setdefault(batch_id, []).extend(sorted(tuple(r) for r in df.collect()))
        return collect

    want: dict = {}
    got: dict = {}
    rocksdb = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
    with _conf(spark, **{"spark.sql.streaming.stateStore.providerClass": rocksdb, **conf}):
        df = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).json(source)
        grouped = df.groupBy("user")
        apply = grouped.transformWithStateInPandas if flavour == "pandas" else grouped.transformWithState
        query = apply(processor, output, "Update", "None").writeStream.foreachBatch(sink(want)).option(
            "checkpointLocation", str(tmp_path / "spark")).start()
        try:
            query.processAllAvailable()
        finally:
            query.stop()
        df = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).json(source)
        stream = transform_with_state(df, "user", processor, output, flavour=flavour,
                                      checkpoint_root=str(tmp_path / "spate"), parallelism=2,
                                      local_dir=str(tmp_path / "spate-local"))
        try:
            stream.start(sink(got), trigger={"availableNow": True}).awaitTermination()
        finally:
            stream.close()
    return got, want


class PandasTimeProbe(StatefulProcessor):
    """Says what the pandas flavour hands over: dtypes, values, arithmetic on them, dates."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        pass

    def handleInputRows(self, key, rows, timerValues) -> Iterator[pd.DataFrame]:  # noqa: N802,N803
        for df in rows:
            first = df.iloc[0]
            yield pd.DataFrame({"user": [key[0]], "value": [
                f"key={key!r} dtypes={[str(t) for t in df.dtypes]} ts={first['ts']!r} ntz={first['ntz']!r} "
                f"hour={int(df['ts'].dt.hour.iloc[0])} d={first['d']!r} "
                f"span={(df['ts'].max() - df['ts'].min()).total_seconds()}"]})

    def close(self) -> None:
        pass


class RowTimeProbe(StatefulProcessor):
    def init(self, handle: StatefulProcessorHandle) -> None:
        pass

    def handleInputRows(self, key, rows, timerValues):  # noqa: N802,N803
        for row in rows:
            yield Row(user=key[0], value=f"{type(row.ts).__name__} {row.ts.isoformat()} hour={row.ts.hour} "
                                         f"ntz={row.ntz!r} d={row.d!r}")

    def close(self) -> None:
        pass


def _time_rows():
    return [[{"user": "a", "n": 1, "ts": "2026-03-08T01:30:00-08:00", "ntz": "2026-03-08T01:30:00",
              "d": "2026-03-08"},
             {"user": "a", "n": 2, "ts": "2026-03-08T03:30:00-07:00", "ntz": "2026-03-08T03:30:00",
              "d": "2026-03-09"},
             {"user": "b", "n": 3, "ts": "2026-07-01T12:00:00Z", "ntz": "2026-07-01T12:00:00", "d": "1999-12-31"}]]


@pytest.mark.parametrize("flavour", ["pandas", "row"])
def test_timestamps_and_dates_arrive_as_on_spark_in_the_session_time_zone(spark, tmp_path, flavour):
    """Across a daylight-saving change in the session's zone (not UTC): the values, their types and arithmetic on
    them equal Spark's."""
    probe = PandasTimeProbe() if flavour == "pandas" else RowTimeProbe()
    got, want = _run_both(spark, tmp_path, _time_rows(), probe, flavour, **LOS_ANGELES)
    assert got == want
    values = " ".join(v for _u, v in want[0])
    if flavour == "pandas":
        # naive wall times in the session's zone: 01:30 PST and 03:30 PDT, one hour apart, differ by two
        assert "datetime64[ns]" in values and "hour=1" in values and "span=7200.0" in values
    else:
        assert "01:30:00-08:00 hour=1" in values  # aware, in the session's zone
