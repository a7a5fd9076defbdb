"""Spark's transformWithState semantics on spate, side by side with Spark 4.3 on the same input files: late rows,
the first batch's watermark and what ``TimerValues`` say, ``deleteIfExists``, state values as Spark returns them,
schema evolution across restarts, nullable state schemas and pandas chunking."""

from __future__ import annotations

import datetime as dt
import json
import re
import sys
from collections.abc import Iterator
from typing import NamedTuple

import pandas as pd
import pytest
from pyspark import cloudpickle
from pyspark.errors import PySparkRuntimeError
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle

from helpers.file_source import write_files
from helpers.side_by_side import (
    INPUT,
    OUTPUT,
    ROCKSDB,
    LateRowsAndTimers,
    data_batches,
    event_row,
    late_batches,
    run_spark,
    run_spate,
    sink_into,
)
from helpers.spark_query import drain
from helpers.spark_session import spark_conf
from spate import LocalRunner
from spate.spark.adapter import StatefulProcessorAdapter
from spate.spark.stream import transform_with_state

pytestmark = pytest.mark.spark
cloudpickle.register_pickle_by_value(sys.modules[__name__])


# -- late rows, the first watermark, TimerValues --------------------------------------------------------

def test_late_rows_first_watermark_and_timer_values(spark, tmp_path):
    source, batches = str(tmp_path / "in"), late_batches()
    write_files(source, batches)
    want = run_spark(spark, source, tmp_path / "spark", LateRowsAndTimers(), "EventTime")
    got = run_spate(spark, source, tmp_path / "spate", LateRowsAndTimers(), "EventTime")
    assert data_batches(got, len(batches)) == data_batches(want, len(batches))
    assert any("timer=0 wm=0" in v for _u, v in want[0]), "the first batch's watermark (0) fired the timer at 0"
    rows = {b: [v.split(" wm=")[0] for _u, v in want[b] if v.startswith("rows=")] for b in range(len(batches))}
    for b in range(2, len(batches)):
        assert not any(re.search(rf"\b{b * 100 + 50}\b|\b{b * 100 + 51}\b", r) for r in rows[b]), "late: dropped"
        assert any(re.search(rf"\b{b * 100 + 52}\b", r) for r in rows[b]), "after the late bound: kept"


class TimerOrder(StatefulProcessor):
    """A processing-time timer clears the count: whether the batch's input saw the count shows the order."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.count = handle.getValueState("count", "c long")

    def handleInputRows(self, key, rows, timerValues) -> Iterator[pd.DataFrame]:  # noqa: N802,N803
        before = self.count.get()[0] if self.count.exists() else 0
        self.count.update((before + sum(len(df) for df in rows),))
        if before == 0:
            self.handle.registerTimer(timerValues.getCurrentProcessingTimeInMs() + 1_000)
        yield pd.DataFrame({"user": [key[0]], "value": [
            f"before={before} now={timerValues.getCurrentProcessingTimeInMs()} "
            f"wm={timerValues.getCurrentWatermarkInMs()}"]})

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo) -> Iterator[pd.DataFrame]:  # noqa: N802,N803
        self.count.clear()
        yield pd.DataFrame({"user": [key[0]], "value": [f"timer={expiredTimerInfo.getExpiryTimeInMs()}"]})

    def close(self) -> None:
        pass


def test_processing_time_timers_fire_after_the_batch_input(tmp_path):
    """Spark's TransformWithStateExec processes a batch's input, then its timers (processing time: those at or
    before the batch's time), and ``TimerValues`` carry the batch time and watermark -1. (Spark 4.3's
    ProcessingTime mode runs no-data batches without end, so this follows its documented order in process.)"""
    clock = [10_000]
    with LocalRunner(StatefulProcessorAdapter(TimerOrder(), "pandas", "ProcessingTime"), key="user",
                     checkpoint_root=str(tmp_path), clock=lambda: clock[0]) as runner:
        outputs = []
        for t in (10_000, 10_500, 11_000, 11_500):
            clock[0] = t
            outputs.append(sorted(o["value"] for o in runner.run_batch(len(outputs), [{"user": "a"}]).outputs))
    assert outputs == [["before=0 now=10000 wm=-1"], ["before=1 now=10500 wm=-1"],
                       ["before=2 now=11000 wm=-1", "timer=11000"],  # the input saw the count, then the timer
                       ["before=0 now=11500 wm=-1"]]


# -- deleteIfExists -------------------------------------------------------------------------------------

class DropsOld(StatefulProcessor):
    """Counts rows in "count" and in "old"; with ``drop``, ``init`` deletes "old" after obtaining it."""

    def __init__(self, drop: bool) -> None:
        self.drop = drop

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.count = handle.getValueState("count", "c long")
        self.old = handle.getValueState("old", "c long")
        if self.drop:
            handle.deleteIfExists("old")

    def handleInputRows(self, key, rows, timerValues) -> Iterator[pd.DataFrame]:  # noqa: N802,N803
        n = sum(len(df) for df in rows)
        self.count.update(((self.count.get()[0] if self.count.exists() else 0) + n,))
        try:
            self.old.update(((self.old.get()[0] if self.old.exists() else 0) + n,))
            old = str(self.old.get()[0])
        except Exception as e:  # noqa: BLE001 - the test reports which error Spark raises
            kind = "PySparkRuntimeError" if isinstance(e, PySparkRuntimeError) else type(e).__name__
            old = f"{kind}: {str(e).split('.')[0]}"
        yield pd.DataFrame({"user": [key[0]], "value": [f"count={self.count.get()[0]} old={old}"]})

    def close(self) -> None:
        pass


def test_delete_if_exists(spark, tmp_path):
    batches = [[event_row(f"u{(b + i) % 4}", i, b) for i in range(5)] for b in range(5)]  # u3 misses batch 2
    phases = [(2, False), (2, True), (1, False)]  # (batches, drop): restarts with another processor between
    want: dict = {}
    got: dict = {}
    for p, (n, drop) in enumerate(phases):
        first = sum(k for k, _d in phases[:p])
        source = str(tmp_path / "in")
        write_files(source, batches[first:first + n], start=first)
        want.update(run_spark(spark, source, tmp_path / "spark", DropsOld(drop)))
        got.update(run_spate(spark, source, tmp_path / "spate", DropsOld(drop)))
    assert got == want
    missing = "old=PySparkRuntimeError: Error checking value state exists: Value state old is not initialized"
    assert all(v.endswith(missing) for b in (2, 3) for _u, v in want[b])
    assert all(int(v.split("old=")[1]) <= 2 for _u, v in want[4]), "deleted, then declared again: a new state"


# -- state values and schemas ---------------------------------------------------------------------------

class Point(NamedTuple):
    p: int


SHAPES = ("a long, s struct<x: int, y: string>, arr array<long>, m map<string,long>, ts timestamp, "
          "d decimal(10,2), dt date, b binary, f double, nested array<struct<p: long>>")


class Shapes(StatefulProcessor):
    """Stores nested values in value, list and map state, then reports what ``get`` returns."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.v = handle.getValueState("v", SHAPES)
        self.items = handle.getListState("items", "x long, s struct<q: string>")
        self.by = handle.getMapState("by", "k string, k2 long", "v struct<z: double>")
        self.point = handle.getValueState("point", "p long")

    def handleInputRows(self, key, rows, timerValues) -> Iterator[pd.DataFrame]:  # noqa: N802,N803
        import decimal

        from pyspark.sql import Row

        for _df in rows:
            pass
        if not self.v.exists():
            self.v.update((1, (2, "y"), [1, 2], {"k": 3}, dt.datetime(2026, 1, 2, 3, 4, 5, 6000),
                           decimal.Decimal("1.5"), dt.date(2026, 1, 2), b"xy", 1.5, [(7,)]))
            self.items.appendValue((1, ("q",)))
            self.items.appendList([(2, Row(q="r")), (3, None)])
            self.by.updateValue(("a", 1), ((2.5,),))
            self.point.update(Point(5))
            out = "stored"
        else:
            value = self.v.get()
            out = json.dumps({"v": repr(value), "types": [type(x).__name__ for x in value],
                              "items": repr(list(self.items.get())), "by": repr(list(self.by.iterator())),
                              "get": repr(self.by.getValue(("a", 1))), "keys": repr(list(self.by.keys())),
                              "values": repr(list(self.by.values())), "contains": self.by.containsKey(("a", 1)),
                              "point": repr(self.point.get()), "tv": [timerValues.getCurrentProcessingTimeInMs(),
                                                                      timerValues.getCurrentWatermarkInMs()]})
        yield pd.DataFrame({"user": [key[0]], "value": [out]})

    def close(self) -> None:
        pass


def test_state_values_come_back_as_spark_returns_them(spark, tmp_path):
    source = str(tmp_path / "in")
    write_files(source, [[event_row("u1", 0, 0)], [event_row("u1", 1, 1)]])
    want = run_spark(spark, source, tmp_path / "spark", Shapes())
    got = run_spate(spark, source, tmp_path / "spate", Shapes())
    assert got == want
    assert "Row(x=2, y='y')" in want[1][0][1]


class Versioned(StatefulProcessor):
    """One value state whose schema changes between runs; reports ``get()`` and stores the run's value."""

    def __init__(self, schema: str, value: tuple) -> None:
        self.schema, self.value = schema, value

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.state = handle.getValueState("state", self.schema)

    def handleInputRows(self, key, rows, timerValues) -> Iterator[pd.DataFrame]:  # noqa: N802,N803
        for _df in rows:
            pass
        before = repr(self.state.get()) if self.state.exists() else "none"
        self.state.update(self.value)
        yield pd.DataFrame({"user": [key[0]], "value": [before]})

    def close(self) -> None:
        pass


AVRO = {"spark.sql.streaming.stateStore.encodingFormat": "avro"}


def test_schema_evolution_across_restarts(spark, tmp_path):
    """Added, removed and reordered fields and a widened number read as Spark reads them (Avro encoding); a
    narrowed one fails on both."""
    runs = [("a long, b string, c int, s struct<x: int, y: string>", (1, "b", 3, (4, "y"))),
            ("c long, a long, d string, s struct<y: string, x: long, z: double>", (30, 10, "d", ("y2", 40, 0.5))),
            ("c double, a long, d string, s struct<y: string, x: long, z: double>", (31.5, 11, "e", None))]
    want: dict = {}
    got: dict = {}
    source = str(tmp_path / "in")
    for i, (schema, value) in enumerate(runs):
        write_files(source, [[event_row("u1", i, i), event_row("u2", i, i)]], start=i)
        want.update(run_spark(spark, source, tmp_path / "spark", Versioned(schema, value), **AVRO))
        got.update(run_spate(spark, source, tmp_path / "spate", Versioned(schema, value), **AVRO))
    assert got == want
    assert want[1][0][1] == "(3, 1, None, Row(y='y', x=4, z=None))"
    write_files(source, [[event_row("u1", 9, 9)]], start=len(runs))
    narrowed = Versioned("c int, a long", (1, 2))
    with pytest.raises(Exception, match="STATE_STORE_INVALID_VALUE_SCHEMA_EVOLUTION|SCHEMA"):
        run_spark(spark, source, tmp_path / "spark", narrowed, **AVRO)
    with pytest.raises(Exception, match="STATE_STORE_INVALID_VALUE_SCHEMA_EVOLUTION") as spate_error:
        run_spate(spark, source, tmp_path / "spate", narrowed, **AVRO)
    assert "value.c changes from double to int" in str(spate_error.value)


def test_state_schemas_must_be_nullable(spark, tmp_path):
    source = str(tmp_path / "in")
    write_files(source, [[event_row("u1", 0, 0)]])
    not_null = Versioned("a long NOT NULL, b string", (1, "b"))
    with pytest.raises(Exception, match="TRANSFORM_WITH_STATE_SCHEMA_MUST_BE_NULLABLE"):
        run_spark(spark, source, tmp_path / "spark", not_null, **AVRO)
    with pytest.raises(Exception, match=r"SCHEMA_MUST_BE_NULLABLE.*family state must be nullable.*a is NOT NULL"):
        run_spate(spark, source, tmp_path / "spate", not_null)


# -- pandas chunking ------------------------------------------------------------------------------------

class ChunkSizes(StatefulProcessor):
    def init(self, handle: StatefulProcessorHandle) -> None:
        pass

    def handleInputRows(self, key, rows, timerValues) -> Iterator[pd.DataFrame]:  # noqa: N802,N803
        sizes = [f"{len(df)}@{list(df.index)[0]}" for df in rows]
        yield pd.DataFrame({"user": [key[0]], "value": [",".join(sizes)]})

    def close(self) -> None:
        pass


def test_pandas_rows_arrive_in_chunks_of_max_records_per_batch(spark, tmp_path):
    source = str(tmp_path / "in")
    batches = [[event_row(f"u{i % 3}", i, i) for i in range(n)] for n in (2, 10, 25)]
    write_files(source, batches)
    conf = {"spark.sql.execution.arrow.maxRecordsPerBatch": "4"}
    want = run_spark(spark, source, tmp_path / "spark", ChunkSizes(), **conf)
    got = run_spate(spark, source, tmp_path / "spate", ChunkSizes(), **conf)
    assert got == want
    assert ("u0", "4@0,4@0,1@0") in want[2]


# -- initial state --------------------------------------------------------------------------------------

class FromInitial(StatefulProcessor):
    """Starts each key's count from its initial state (as many calls as Spark makes: one per DataFrame chunk or
    per Row), then counts input rows."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.count = handle.getValueState("count", "c long")
        self.calls = handle.getValueState("calls", "c long")

    def handleInitialState(self, key, initialState, timerValues) -> None:  # noqa: N802,N803
        rows = len(initialState) if isinstance(initialState, pd.DataFrame) else 1
        total = sum(initialState["start"]) if isinstance(initialState, pd.DataFrame) else initialState.start
        self.count.update(((self.count.get()[0] if self.count.exists() else 0) + int(total),))
        self.calls.update(((self.calls.get()[0] if self.calls.exists() else 0) + 1,))
        assert rows > 0

    def handleInputRows(self, key, rows, timerValues):  # noqa: N802,N803
        n = sum(len(df) for df in rows) if self.pandas else sum(1 for _ in rows)
        self.count.update(((self.count.get()[0] if self.count.exists() else 0) + n,))
        calls = self.calls.get()[0] if self.calls.exists() else 0
        value = f"count={self.count.get()[0]} initial_calls={calls}"
        if self.pandas:
            yield pd.DataFrame({"user": [key[0]], "value": [value]})
        else:
            from pyspark.sql import Row

            yield Row(user=key[0], value=value)

    def close(self) -> None:
        pass


class PandasFromInitial(FromInitial):
    pandas = True


class RowFromInitial(FromInitial):
    pandas = False


def _run_spark_initial(spark, source, checkpoint, processor, flavour, initial):
    outputs: dict = {}
    with spark_conf(spark, **{"spark.sql.streaming.stateStore.providerClass": ROCKSDB,
                         "spark.sql.execution.arrow.maxRecordsPerBatch": "2"}):
        df = spark.readStream.schema(INPUT).option("maxFilesPerTrigger", 1).json(source)
        grouped = df.groupBy("user")
        apply = grouped.transformWithStateInPandas if flavour == "pandas" else grouped.transformWithState
        drain(lambda: apply(processor, OUTPUT, "Update", "None", initialState=initial).writeStream.foreachBatch(
            sink_into(outputs)).option("checkpointLocation", str(checkpoint)).start())
    return outputs


@pytest.mark.parametrize("flavour", ["pandas", "row"])
def test_initial_state_on_the_first_run_only(spark, tmp_path, flavour):
    initial = spark.createDataFrame([("u0", 100), ("u0", 5), ("u0", 7), ("u1", 200), ("u9", 900)],
                                    "name string, start long").groupBy("name")
    processor = PandasFromInitial() if flavour == "pandas" else RowFromInitial()
    source = str(tmp_path / "in")
    want: dict = {}
    got: dict = {}
    for run, files in enumerate([[[event_row("u0", 0, 0), event_row("u2", 1, 0)], [event_row("u1", 2, 1)]],
                                 [[event_row("u0", 3, 2), event_row("u9", 4, 2)]]]):
        start = 0 if run == 0 else 2
        write_files(source, files, start=start)
        want.update(_run_spark_initial(spark, source, tmp_path / "spark", processor, flavour, initial))
        with spark_conf(spark, **{"spark.sql.execution.arrow.maxRecordsPerBatch": "2"}):
            df = spark.readStream.schema(INPUT).option("maxFilesPerTrigger", 1).json(source)
            stream = transform_with_state(df, "user", processor, OUTPUT, flavour=flavour, initial_state=initial,
                                          checkpoint_root=str(tmp_path / "spate"), parallelism=3)
            stream.start(sink_into(got), trigger={"availableNow": True}).awaitTermination()
            stream.close()
    assert got == want
    assert ("u0", f"count=113 initial_calls={2 if flavour == 'pandas' else 3}") in want[0]
    assert ("u9", "count=901 initial_calls=1") in want[2], "the restart did not apply the initial state again"


# -- output modes and what may follow -------------------------------------------------------------------

def test_what_cannot_follow_is_refused_with_what_to_do(spark, tmp_path):
    df = spark.readStream.schema(INPUT).json(str(tmp_path))
    make = lambda **kw: transform_with_state(df, "user", ChunkSizes(), OUTPUT,  # noqa: E731
                                             checkpoint_root=str(tmp_path / "root"), **kw)
    for mode in ("Update", "Append"):
        make(output_mode=mode)
    with pytest.raises(ValueError, match="output_mode 'Complete' is not supported.*upserts"):
        make(output_mode="Complete")
    stream = make()
    for operator in ("groupBy", "withWatermark", "writeStream", "join"):
        with pytest.raises(AttributeError, match=f"StatefulStream has no '{operator}'.*apply {operator} there"):
            getattr(stream, operator)
    with pytest.raises(AttributeError, match="no attribute 'nonsense'"):
        stream.nonsense  # noqa: B018
    with pytest.raises(ValueError, match="initial_state must be a batch DataFrame"):
        make(initial_state=df.groupBy("user"))
    static = spark.createDataFrame([("u", 1)], "name string, start long")
    with pytest.raises(ValueError, match=r"grouped by \['name', 'start'\], the stream by \['user'\]"):
        make(initial_state=static.groupBy("name", "start"))
    with pytest.raises(TypeError, match="initial_state must be df.groupBy"):
        make(initial_state=[("u", 1)])
