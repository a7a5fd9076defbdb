"""The transformWithState drop-in where it used to differ from Spark, side by side with real Spark on the same
input files: timers while one fires, the timestamps and dates a processor receives (pandas and Row flavours, in
the session's time zone), the state values Spark accepts, and the session settings of the output conversion."""

from __future__ import annotations

import datetime as dt
import decimal
import os
import re
import sys
from collections.abc import Iterator
from typing import NamedTuple

import numpy as np
import pandas as pd
import pyspark
import pytest
from pyspark import cloudpickle
from pyspark.sql import Row
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle

from helpers.file_source import write_files
from helpers.side_by_side import LateRowsAndTimers, SilenceAlert, data_batches, late_batches, run_spark, run_spate
from helpers.spark_query import drain
from helpers.spark_session import spark_conf
from spate.spark.ticks import AVAILABLE_NOW

pytestmark = pytest.mark.spark
cloudpickle.register_pickle_by_value(sys.modules[__name__])
START = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
SPARK_4_0 = pyspark.__version__.startswith("4.0.")


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
    assert data_batches(got, 2) == data_batches(want, 2)
    assert want[0] == [("a", "fired=-5 listed=[0, 1000000000000, -5]"),  # still listed while it fires
                       ("a", "fired=0 listed=[1000000000000, 1]"),  # -5 deleted after its handler; 0 fires though
                       ("a", "input batch=0 timers=[0, 1000000000000, -5]")]  # deleted, as the list was read first


# -- the timestamps and dates a processor receives ---------------------------------------------------------

TIMES = "user string, n long, ts timestamp, ntz timestamp_ntz, d date"
LOS_ANGELES = {"spark.sql.session.timeZone": "America/Los_Angeles"}


def _run_both(spark, tmp_path, batches, processor, flavour, schema=TIMES, output="user string, value string",
              only=None, **conf):
    """The same files through Spark's transformWithState and spate's (``only``: one of them), each batch's
    outputs sorted."""

    source = str(tmp_path / "in")
    write_files(source, batches)

    def sink(outputs):
        def collect(df, batch_id):
            outputs.setdefault(batch_id, []).extend(sorted(tuple(r) for r in df.collect()))
        return collect

    want: dict = {}
    got: dict = {}
    rocksdb = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
    with spark_conf(spark, **{"spark.sql.streaming.stateStore.providerClass": rocksdb, **conf}):
        if only != "spate":
            _run_spark(spark, source, tmp_path / "spark", processor, flavour, schema, output, sink(want))
        if only != "spark":
            _run_spate(spark, source, tmp_path, processor, flavour, schema, output, sink(got))
    return got, want


def _run_spark(spark, source, checkpoint, processor, flavour, schema, output, sink):
    df = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).json(source)
    grouped = df.groupBy("user")
    if flavour == "row" and not hasattr(grouped, "transformWithState"):
        pytest.skip("this Spark has no Row flavour of transformWithState (it came in 4.1) to compare with")
    apply = grouped.transformWithStateInPandas if flavour == "pandas" else grouped.transformWithState
    drain(lambda: apply(processor, output, "Update", "None").writeStream.foreachBatch(sink).option(
        "checkpointLocation", str(checkpoint)).start())


def _run_spate(spark, source, tmp_path, processor, flavour, schema, output, sink):
    from spate.spark.stream import transform_with_state

    df = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).json(source)
    stream = transform_with_state(df, "user", processor, output, flavour=flavour,
                                  checkpoint_root=str(tmp_path / "spate"), parallelism=2,
                                  local_dir=str(tmp_path / "spate-local"))
    try:
        stream.start(sink, trigger={"availableNow": True}).awaitTermination()
    finally:
        stream.close()


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


# -- state values as Spark accepts them --------------------------------------------------------------------

class _Pair(NamedTuple):
    v: int


SCHEMAS = {
    "one_long": "v long", "one_int": "v int", "one_double": "v double", "one_string": "v string",
    "two": "a long, b string", "nested": "s struct<x: int, y: string>", "arr": "arr array<int>",
    "mp": "m map<string, int>", "ts": "t timestamp", "dec": "d decimal(10, 2)", "bin": "b binary",
    "bool": "f boolean", "date": "d date", "flt": "f float",
}
# (state, value): what Spark's client and JVM make of each (a value of another type is null, a bare value is
# iterated, a dict gives its keys, Rows are positional, ...); none of these fails the task
VALUES = [
    ("one_long", (5,)), ("one_long", [5]), ("one_long", 5), ("one_long", "5"), ("one_long", Row(v=5)),
    ("one_long", {"v": 5}), ("one_long", np.int64(5)), ("one_long", (np.int64(7),)), ("one_long", (5.5,)),
    ("one_long", (None,)), ("one_long", (True,)), ("one_long", ("5",)), ("one_long", (2**70,)),
    ("one_long", _Pair(9)), ("one_long", None), ("one_int", (2**40,)), ("one_int", (7,)), ("one_int", (7.0,)),
    ("one_double", (5,)), ("one_double", (2.5,)), ("one_double", (np.float32(1.5),)), ("one_double", ("1.5",)),
    ("one_double", (decimal.Decimal("1.5"),)), ("one_string", ("abc",)), ("one_string", (5,)),
    ("one_string", ([1, 2],)), ("one_string", (1.5,)), ("one_string", (1e300,)), ("one_string", (True,)),
    ("two", (1, "x")), ("two", ("x", 1)), ("two", {"a": 1, "b": "x"}), ("two", Row(b="x", a=1)), ("two", [1, "x"]),
    ("nested", ((1, "y"),)), ("nested", (Row(x=1, y="y"),)), ("nested", ({"x": 1, "y": "y"},)),
    ("nested", ([1, "y"],)), ("nested", ("xy",)), ("arr", ([1, 2],)), ("arr", ((1, 2),)), ("arr", ([1, None],)),
    ("arr", (["a"],)), ("arr", ([1.5],)), ("mp", ({"a": 1},)), ("mp", ({1: 1},)), ("mp", ({"a": "b"},)),
    ("mp", ([("a", 1)],)), ("ts", (dt.datetime(2026, 1, 1, 12, 0),)),
    ("ts", (dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.UTC),)), ("ts", (pd.Timestamp("2026-01-01 12:00"),)),
    ("ts", (1_700_000_000_000,)), ("ts", (dt.date(2026, 1, 1),)), ("ts", (np.datetime64("2026-01-01T12:00"),)),
    ("dec", (decimal.Decimal("1.234"),)), ("dec", (decimal.Decimal("1.2"),)), ("dec", (5,)), ("dec", (1.5,)),
    ("bin", (b"ab",)), ("bin", ("ab",)), ("bin", (bytearray(b"ab"),)), ("bool", (True,)), ("bool", (1,)),
    ("bool", (np.bool_(True),)), ("bool", ("true",)), ("date", (dt.date(2026, 1, 2),)),
    ("date", (dt.datetime(2026, 1, 2, 3),)), ("date", (5,)), ("flt", (1.5,)), ("flt", (1,)), ("flt", (1e300,)),
]
LISTS = [[(1,), (2,)], [1, 2], [(1,), "2"], [(None,)]]
MAP_KEYS = [("k",), "k", (1,), Row(k="k"), {"k": "k"}]


def _outcome(attempt) -> str:
    try:
        return f"ok {attempt()!r}"
    except Exception as e:  # the type and Spark's error class, as a processor catching it sees them
        found = re.search(r"\[([A-Z_0-9.]+)\]", str(e))
        return f"{type(e).__name__} {found.group(1) if found else str(e).splitlines()[0][:80]}"


class StateValues(StatefulProcessor):
    """Stores each value of VALUES in its state and reports what get() returns (or what was raised)."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.states = {name: handle.getValueState(name, schema) for name, schema in SCHEMAS.items()}
        self.list = handle.getListState("lst", "v long")
        self.map = handle.getMapState("mp_state", "k string", "v long")

    def _value(self, name, value):
        self.states[name].update(value)
        return self.states[name].get()

    def _list(self, values):
        self.list.put(values)
        return list(self.list.get())

    def _map_key(self, key):
        self.map.clear()
        self.map.updateValue(key, (1,))
        return list(self.map.keys())

    def handleInputRows(self, key, rows, timerValues) -> Iterator[pd.DataFrame]:  # noqa: N802,N803
        for _ in rows:
            pass
        out = [f"{name} {v!r} => {_outcome(lambda n=name, v=v: self._value(n, v))}" for name, v in VALUES]
        out += [f"list {v!r} => {_outcome(lambda v=v: self._list(v))}" for v in LISTS]
        out += [f"map key {k!r} => {_outcome(lambda k=k: self._map_key(k))}" for k in MAP_KEYS]
        yield pd.DataFrame({"user": [key[0]] * len(out), "value": out})

    def close(self) -> None:
        pass


HANGS_ON_4_0 = pytest.mark.skipif(SPARK_4_0, reason="Spark 4.0's own transformWithStateInPandas never finishes this "
                                                    "query (its Python worker waits on a state server that failed)")


@HANGS_ON_4_0
def test_state_values_mean_what_they_mean_on_spark(spark, tmp_path):
    got, want = _run_both(spark, tmp_path, [[{"user": "a"}]], StateValues(), "pandas", schema="user string")
    assert sorted(set(got[0]) - set(want[0])) == sorted(set(want[0]) - set(got[0])) == []
    assert got == want
    said = dict(v.split(" => ", 1) for _u, v in want[0])
    assert said["one_long 5"] == "TypeError 'int' object is not iterable"  # a bare value is iterated
    assert said["one_double (5,)"] == "ok (None,)"  # an int in a double field is null on Spark
    assert said["two {'a': 1, 'b': 'x'}"] == "ok (None, 'b')"  # a dict gives its keys


class FailsTheTask(StatefulProcessor):
    """Stores one value Spark's state server refuses (which fails Spark's task)."""

    def __init__(self, case: str) -> None:
        self.case = case

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.value = handle.getValueState("v", "v long")
        self.dec = handle.getValueState("d", "d decimal(10, 2)")
        self.list = handle.getListState("lst", "v long")

    def handleInputRows(self, key, rows, timerValues) -> Iterator[pd.DataFrame]:  # noqa: N802,N803
        for _ in rows:
            pass
        if self.case == "wrong arity":
            self.value.update(())
        elif self.case == "decimal overflow":
            self.dec.update((decimal.Decimal("123456789012.5"),))
        elif self.case == "empty put":
            self.list.put([])
        else:
            self.list.appendList([])
        yield pd.DataFrame({"user": [key[0]], "value": ["stored"]})

    def close(self) -> None:
        pass


@pytest.mark.parametrize(("case", "error_class"), [
    ("wrong arity", "STRUCT_ARRAY_LENGTH_MISMATCH"),
    ("decimal overflow", "NUMERIC_VALUE_OUT_OF_RANGE.WITHOUT_SUGGESTION"),
    ("empty put", "ILLEGAL_STATE_STORE_VALUE.EMPTY_LIST_VALUE"),
    ("empty append", "ILLEGAL_STATE_STORE_VALUE.EMPTY_LIST_VALUE"),
])
@HANGS_ON_4_0
def test_what_sparks_state_server_refuses_fails_the_batch_with_its_error_class(spark, tmp_path, case, error_class):
    with pytest.raises(Exception) as on_spark:  # noqa: PT011 - Spark's task fails (its worker loses the server)
        _run_both(spark, tmp_path, [[{"user": "a"}]], FailsTheTask(case), "pandas", schema="user string", only="spark")
    assert "terminated with exception" in str(on_spark.value)
    with pytest.raises(Exception) as on_spate:  # noqa: PT011
        _run_both(spark, tmp_path, [[{"user": "a"}]], FailsTheTask(case), "pandas", schema="user string", only="spate")
    assert f"[{error_class}]" in str(on_spate.value)


# -- the session's settings for the conversion ------------------------------------------------------------

class Converted(StatefulProcessor):
    """Yields values whose conversion depends on the session: a float for a long (checked casts), ints for a
    decimal (int-to-decimal coercion), a naive timestamp (the session time zone), and the sizes of the chunks
    it received (maxRecordsPerBatch, maxBytesPerBatch)."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        pass

    def handleInputRows(self, key, rows, timerValues) -> Iterator[pd.DataFrame]:  # noqa: N802,N803
        sizes = [len(df) for df in rows]
        yield pd.DataFrame({"user": [key[0]], "l": [1.5], "d": [5], "t": [pd.Timestamp("2026-01-01 12:00")],
                            "chunks": [str(sizes)]})

    def close(self) -> None:
        pass


CONVERTED = "user string, l long, d decimal(10, 2), t timestamp, chunks string"


@pytest.mark.parametrize("settings", [
    {"spark.sql.execution.pandas.convertToArrowArraySafely": "false",
     "spark.sql.execution.pythonUDF.pandas.intToDecimalCoercionEnabled": "true",
     "spark.sql.execution.arrow.maxRecordsPerBatch": "3", **LOS_ANGELES},
    {"spark.sql.execution.pandas.convertToArrowArraySafely": "false",
     "spark.sql.execution.pythonUDF.pandas.intToDecimalCoercionEnabled": "true",
     "spark.sql.execution.arrow.maxBytesPerBatch": "64", "spark.sql.session.timeZone": "Asia/Kolkata"},
], ids=["records-los-angeles", "bytes-kolkata"])
def test_outputs_are_converted_with_the_sessions_settings(spark, tmp_path, settings):
    rows = [[{"user": "a", "n": i} for i in range(8)] + [{"user": "b", "n": 1}]]
    if SPARK_4_0:  # no int-to-decimal coercion before 4.1: an int for a decimal fails, on both
        for only in ("spark", "spate"):
            with pytest.raises(Exception, match="decimal"):  # noqa: PT011
                _run_both(spark, tmp_path / only, rows, Converted(), "pandas", schema="user string, n long",
                          output=CONVERTED, only=only, **settings)
        return
    got, want = _run_both(spark, tmp_path, rows, Converted(), "pandas", schema="user string, n long",
                          output=CONVERTED, **settings)
    assert got == want
    assert want[0][0][1:3] == (1, decimal.Decimal("5.00"))  # truncated, and coerced
    assert want[0][0][4] in ("[3, 3, 2]", "[5, 3]")  # chunked by rows, or by bytes


def test_checked_casts_fail_the_batch_as_on_spark(spark, tmp_path):
    """With Spark 4's defaults (ANSI mode: checked casts, no int-to-decimal coercion) the same outputs fail."""
    for only in ("spark", "spate"):
        with pytest.raises(Exception, match="(?i)truncat|decimal|convert"):  # noqa: PT011
            _run_both(spark, tmp_path / only, [[{"user": "a", "n": 1}]], Converted(), "pandas",
                      schema="user string, n long", output=CONVERTED, only=only)


# -- timers fire on an idle stream ---------------------------------------------------------------------------

def test_a_timer_fires_when_no_input_arrives(spark, tmp_path):
    """Every device goes silent after one file: the alerts still come, in batches without input, once each."""
    import time

    from spate.spark.stream import transform_with_state

    source = str(tmp_path / "in")
    write_files(source, [[{"user": "a"}, {"user": "b"}]])
    outputs: dict = {}

    def sink(df, batch_id):
        outputs.setdefault(batch_id, []).extend(sorted(tuple(r) for r in df.collect()))

    df = spark.readStream.schema("user string").json(source)
    stream = transform_with_state(df, "user", SilenceAlert(), "user string, value string",
                                  time_mode="ProcessingTime", checkpoint_root=str(tmp_path / "spate"), parallelism=2,
                                  local_dir=str(tmp_path / "local"), idle_batches=True)  # the default from 4.2 on
    query = stream.start(sink, trigger={"processingTime": "500 milliseconds"},
                         spark_checkpoint_cache=str(tmp_path / "cache"))
    try:
        deadline = time.time() + 60
        while time.time() < deadline and sum(len(v) for v in outputs.values()) < 2:
            time.sleep(0.2)
        time.sleep(2.5)  # nothing more is due: no more batches
        batches = len(stream.metrics)
        time.sleep(1.5)
        assert len(stream.metrics) == batches, "an idle query with nothing due runs no batch"
        wake = stream._run.wake.path  # noqa: SLF001
        assert os.path.isfile(wake) and wake.startswith(str(tmp_path / "cache"))
    finally:
        query.stop()
        stream.close()
    # the wake file is spate's: removed once the query stopped (before pyspark 4.2 the source keeps its last
    # answer beside it, for a restart)
    folder = os.path.dirname(wake)
    assert set(os.listdir(folder) if os.path.exists(folder) else ()) <= {"wake.json.answered"}
    alerts = [row for rows in outputs.values() for row in rows]
    assert sorted(alerts) == [("a", "silent"), ("b", "silent")]
    assert min(b for b, rows in outputs.items() if rows) > 0, "fired in a batch without input"


@pytest.mark.skipif(not AVAILABLE_NOW, reason="pyspark < 4.2: a Python source cannot take part in AvailableNow")
def test_no_data_batches_where_spark_runs_them(spark, tmp_path):
    """Event time: Spark runs a batch without input whenever the watermark moved (its timers fire there, and
    the late-row bound moves); spate runs the same batches, so every batch, with or without input, is equal."""
    source, batches = str(tmp_path / "in"), late_batches()
    write_files(source, batches)
    want = run_spark(spark, source, tmp_path / "spark", LateRowsAndTimers(), "EventTime")
    got = run_spate(spark, source, tmp_path / "spate", LateRowsAndTimers(), "EventTime")
    assert len(want) > len(batches), "Spark ran batches without input"
    assert got == want
