"""Apache Spark's own transformWithState tests, ported: what both port modules (test_spark_own_tws_tests.py and
test_spark_own_tws_state_variable_tests.py) share. Running one query on both engines: a ``Query`` (processor,
output schema, flavour, input builder, key, time mode, initial state, session settings) runs on Spark
(``run_spark``: RocksDB state store, the session settings of Spark's suite, ``SUITE``) and on
``spate.spark.stream.transform_with_state`` (``run_spate``), or on both at once (``run_both``); the input files
are written by ``write_lines``/``write_all`` and read by the ``build_*``/``json_df`` builders; outputs come back
per batch as plain values (``normalized``). The processors ported from Spark's
``helper/helper_pandas_transform_with_state.py`` that both modules use (``Ported``: both flavours of one, by its
``pandas`` flag), and ``Scenarios``, several test processors in one query."""

from __future__ import annotations

import json
import os
import pickle
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import pytest
from pyspark import cloudpickle
from pyspark.sql import Row
from pyspark.sql.functions import col, from_unixtime, split, timestamp_millis
from pyspark.sql.streaming import StatefulProcessor
from pyspark.sql.types import IntegerType, StructField, StructType

from helpers.spark_query import drain
from helpers.spark_session import spark_conf
from spate.spark.sessions import is_connect

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # executors cannot import the tests' helpers
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
NO_DATA = "spark.sql.streaming.noDataMicroBatches.enabled"
# the session settings of Spark's TransformWithState suites (shuffle partitions: the fixture's 2, not 5)
SUITE = {"spark.sql.streaming.stateStore.providerClass": ROCKSDB,
         "spark.sql.execution.arrow.transformWithStateInPandas.maxRecordsPerBatch": "2",
         "spark.sql.session.timeZone": "UTC", NO_DATA: "false"}
FLAVOURS = pytest.mark.parametrize("flavour", ["pandas", "row"])


# -- running one query on both engines ---------------------------------------------------------------------------------

def write_lines(directory, index, lines):
    """One input file; its modification time orders it (the file source reads the oldest first)."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"part-{index:05d}.txt")
    with open(path, "w") as f:
        f.write("".join(f"{line}\n" for line in lines))
    os.utime(path, (1_700_000_000 + index, 1_700_000_000 + index))


def json_lines(rows):
    return [json.dumps(r) for r in rows]


def text_stream(spark, path):
    return spark.readStream.format("text").option("maxFilesPerTrigger", 1).load(path)


def build_test_df(spark, path):
    """Spark's ``_build_test_df``: "id, temperature" lines split and cast."""
    df = text_stream(spark, path)
    parts = df.withColumn("split_values", split(df["value"], ","))
    return parts.select(parts.split_values.getItem(0).alias("id").cast("string"),
                        parts.split_values.getItem(1).alias("temperature").cast("int"))


def build_test_df_with_3_cols(spark, path):
    df = text_stream(spark, path)
    parts = df.withColumn("split_values", split(df["value"], ","))
    return parts.select(parts.split_values.getItem(0).alias("id1").cast("string"),
                        parts.split_values.getItem(1).alias("temperature").cast("int"),
                        parts.split_values.getItem(2).alias("id2").cast("string"))


def build_event_time_df(spark, path):
    """Spark's event-time tests: the temperature is the event time in seconds."""
    df = build_test_df(spark, path)
    return df.select("id", from_unixtime(col("temperature")).alias("eventTime").cast("timestamp"))


def json_df(schema, event_time_ms=False):
    def build(spark, path):
        df = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).json(path)
        return df.withColumn("ts", timestamp_millis(col("event_time_ms"))) if event_time_ms else df
    return build


def normalized(value):
    """Outputs as plain, comparable values: Rows and lists as tuples, maps as sorted item tuples."""
    if isinstance(value, Row):
        return tuple(normalized(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((normalized(k), normalized(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return tuple(normalized(v) for v in value)
    return value


@dataclass
class Query:
    processor: Callable[[], StatefulProcessor]  # a new one per engine
    output: Any
    flavour: str
    build: Callable = build_test_df
    key: tuple = ("id",)
    time_mode: str = "None"
    event_time: tuple[str, int] | None = None  # (column, delay ms): withWatermark on Spark, spate's event time
    initial: Callable | None = None  # spark -> a grouped batch DataFrame
    conf: dict = field(default_factory=dict)
    parallelism: int = 2  # spate's; Spark's shuffle partitions come from the session (or conf)

    def settings(self):
        return {**SUITE, **self.conf}


def collect_into(outputs, spill: str | None = None):
    """A sink that adds each batch's outputs to ``outputs``. On Spark Connect the sink runs on the server, so it
    writes them to files in ``spill`` instead, which :func:`gather` adds to ``outputs`` once the query ended."""
    def sink(df, batch_id):
        rows = [normalized(r) for r in df.collect()]
        if spill is None:
            outputs.setdefault(batch_id, []).extend(rows)
            return
        os.makedirs(spill, exist_ok=True)
        with open(os.path.join(spill, f"{time.time_ns():020d}-{batch_id}.pickle"), "wb") as f:
            pickle.dump((batch_id, rows), f)
    return sink


def gather(outputs, spill: str | None) -> dict:
    """``outputs`` with what a Connect server's sink wrote to ``spill`` added, in the order it wrote it."""
    if spill is not None and os.path.isdir(spill):
        for name in sorted(os.listdir(spill)):
            with open(os.path.join(spill, name), "rb") as f:
                batch_id, rows = pickle.load(f)  # noqa: S301 - the test's own files
            outputs.setdefault(batch_id, []).extend(rows)
    return outputs


def spill_dir(spark, where) -> str | None:
    """Where a sink of ``spark``'s queries writes its outputs: nowhere on a classic session (it runs here)."""
    return f"{where}-outputs" if is_connect(spark) else None


def run_spark(spark, q: Query, source, checkpoint, conf=True):
    """Spark's outputs per batch id, in the order each batch produced them (``conf``: set the query's session
    settings around the run)."""
    outputs: dict = {}
    with spark_conf(spark, **(q.settings() if conf else {})):
        df = q.build(spark, source)
        if q.event_time:
            df = df.withWatermark(q.event_time[0], f"{q.event_time[1]} milliseconds")
        grouped = df.groupBy(*q.key)
        apply = grouped.transformWithStateInPandas if q.flavour == "pandas" else grouped.transformWithState
        tws = apply(statefulProcessor=q.processor(), outputStructType=q.output, outputMode="Update",
                    timeMode=q.time_mode, initialState=q.initial(spark) if q.initial else None)
        spill = spill_dir(spark, checkpoint)
        drain(lambda: tws.writeStream.foreachBatch(collect_into(outputs, spill)).option(
            "checkpointLocation", str(checkpoint)).start())
    return gather(outputs, spill)


def run_spate(spark, q: Query, source, root, idle_batches="session", conf=True):
    """spate's outputs per batch id. ``idle_batches``: "session" gives spate what the session's
    ``noDataMicroBatches.enabled`` says; None leaves spate's default."""
    from spate.spark.stream import transform_with_state

    outputs: dict = {}
    settings = q.settings()
    extra: dict = {}
    if idle_batches == "session":
        extra["idle_batches"] = settings.get(NO_DATA, "true") != "false"
    elif idle_batches is not None:
        extra["idle_batches"] = idle_batches
    if q.event_time:
        extra.update(event_time_column=q.event_time[0], watermark_delay_ms=q.event_time[1])
    with spark_conf(spark, **(settings if conf else {})):
        stream = transform_with_state(q.build(spark, source), list(q.key), q.processor(), q.output,
                                      time_mode=q.time_mode, flavour=q.flavour,
                                      initial_state=q.initial(spark) if q.initial else None,
                                      checkpoint_root=str(root), parallelism=q.parallelism,
                                      local_dir=str(root) + "-local", **extra)
        spill = spill_dir(spark, root)
        try:
            stream.start(collect_into(outputs, spill), trigger={"availableNow": True}).awaitTermination()
        finally:
            stream.close()
    return gather(outputs, spill)


def run_both(spark, q: Query, source, tmp_path, **spate):
    """(spate's, Spark's) outputs, both queries running at once; each run of the same ``tmp_path`` continues the
    same checkpoints."""
    from concurrent.futures import ThreadPoolExecutor

    with spark_conf(spark, **q.settings()), ThreadPoolExecutor(1) as pool:
        on_spate = pool.submit(run_spate, spark, q, source, tmp_path / "spate", conf=False, **spate)
        want = run_spark(spark, q, source, tmp_path / "spark", conf=False)
        return on_spate.result(), want


def by_batch(outputs, project=None):
    """Each batch's outputs sorted (order across keys is the engine's); ``project`` picks columns."""
    return {b: sorted((tuple(r[i] for i in project) if project else r for r in rows), key=repr)
            for b, rows in sorted(outputs.items())}


def sets(outputs):
    return {b: set(rows) for b, rows in by_batch(outputs).items()}


def write_all(source, files):
    for i, lines in enumerate(files):
        write_lines(source, i, lines)


# -- processors, ported from Spark's helper_pandas_transform_with_state.py, that both port modules use -----------------

def struct_type(**fields):
    return StructType([StructField(name, kind, True) for name, kind in fields.items()])


class Ported(StatefulProcessor):
    """Both flavours of a Spark test processor: ``pandas`` says which one this is."""

    def __init__(self, pandas: bool = True) -> None:
        self.pandas = pandas

    def out(self, **columns):
        if self.pandas:
            return pd.DataFrame({k: [v] for k, v in columns.items()})
        return Row(**columns)

    def temperatures(self, rows):
        if self.pandas:
            return [t for pdf in rows for t in pdf["temperature"].tolist()]
        return [row.temperature for row in rows]

    def close(self) -> None:
        pass


class SimpleStatefulProcessor(Ported):
    """Per batch, the key's number of rows; across batches its violations (temperature > 100), checked against
    the counts Spark's test expects; a state deleted in init cannot be used."""

    expected = {0: {"0": 1, "1": 2}, 1: {"0": 4, "1": 3}}
    batch_id = 0

    def init(self, handle) -> None:
        self.num_violations_state = handle.getValueState("numViolations", "value int")
        self.temp_state = handle.getValueState("tempState", struct_type(value=IntegerType()))
        handle.deleteIfExists("tempState")

    def handleInputRows(self, key, rows, timerValues):  # noqa: N802,N803
        from pyspark.errors import PySparkRuntimeError

        with pytest.raises(PySparkRuntimeError, match="Error checking value state exists"):
            self.temp_state.exists()
        key_str = key[0]
        if self.num_violations_state.exists():
            existing = self.num_violations_state.get()[0]
            assert existing == self.expected[0][key_str]
            self.batch_id = 1
        else:
            existing = 0
        temperatures = [t for t in self.temperatures(rows) if t is not None and t == t]  # not null, not NaN
        updated = existing + sum(1 for t in temperatures if t > 100)
        assert updated == self.expected[self.batch_id][key_str]
        self.num_violations_state.update((updated,))
        yield self.out(id=key_str, countAsString=str(len(temperatures)))


class SimpleStatefulProcessorWithInitialState(Ported):
    """Sums the temperatures of a key, starting from its initial state's initVal."""

    initial = {("0",): 789, ("3",): 987}

    def init(self, handle) -> None:
        self.value_state = handle.getValueState("value_state", struct_type(value=IntegerType()))

    def handleInputRows(self, key, rows, timerValues):  # noqa: N802,N803
        accumulated = self.value_state.get()[0] if self.value_state.exists() else 0
        if self.pandas:
            for pdf in rows:
                accumulated += pdf["temperature"].astype(int).sum()
        else:
            accumulated += sum(row.temperature for row in rows)
        self.value_state.update((accumulated,))
        if len(key) > 1:
            yield self.out(id1=key[0], id2=key[1], value=str(accumulated))
        else:
            yield self.out(id=key[0], value=str(accumulated))

    def handleInitialState(self, key, initialState, timerValues):  # noqa: N802,N803
        init_val = initialState.at[0, "initVal"] if self.pandas else initialState.initVal
        self.value_state.update((init_val,))
        if len(key) == 1:
            assert self.initial[key] == init_val


class MapStateProcessor(Ported):
    """Every map state operation on keys "key1" and "key2", asserting what each returns; outputs the row count."""

    def init(self, handle) -> None:
        self.map_state = handle.getMapState("mapState", "name string", "count int")

    def handleInputRows(self, key, rows, timerValues):  # noqa: N802,N803
        count = len([t for t in self.temperatures(rows) if t is not None])
        key1, key2 = ("key1",), ("key2",)
        value1 = value2 = count
        if self.map_state.exists():
            if self.map_state.containsKey(key1):
                value1 += self.map_state.getValue(key1)[0]
            if self.map_state.containsKey(key2):
                value2 += self.map_state.getValue(key2)[0]
        self.map_state.updateValue(key1, (value1,))
        self.map_state.updateValue(key2, (value2,))
        keys = self.map_state.keys()
        assert next(keys)[0] == "key1"
        assert next(keys)[0] == "key2"
        values = self.map_state.values()
        assert next(values)[0] == value1
        assert next(values)[0] == value2
        entries = self.map_state.iterator()
        assert next(entries)[0] == key1
        assert next(entries)[1] == (value2,)
        self.map_state.removeKey(key1)
        assert not self.map_state.containsKey(key1)
        assert self.map_state.exists()
        self.map_state.clear()
        assert not self.map_state.exists()
        yield self.out(id=key[0], countAsString=str(count))


# -- several test processors in one query ------------------------------------------------------------------------------

class Prefixed:
    """A processor's handle in a ``Scenarios`` query: its states named ``<scenario>_<name>``."""

    def __init__(self, handle, prefix) -> None:
        self.handle, self.prefix = handle, prefix

    def getValueState(self, name, schema, ttlDurationMs=None):  # noqa: N802,N803
        return self.handle.getValueState(f"{self.prefix}_{name}", schema, ttlDurationMs)

    def getListState(self, name, schema, ttlDurationMs=None):  # noqa: N802,N803
        return self.handle.getListState(f"{self.prefix}_{name}", schema, ttlDurationMs)

    def getMapState(self, name, key_schema, value_schema, ttlDurationMs=None):  # noqa: N802,N803
        return self.handle.getMapState(f"{self.prefix}_{name}", key_schema, value_schema, ttlDurationMs)

    def deleteIfExists(self, name):  # noqa: N802
        self.handle.deleteIfExists(f"{self.prefix}_{name}")

    def registerTimer(self, ms):  # noqa: N802
        self.handle.registerTimer(ms)

    def deleteTimer(self, ms):  # noqa: N802
        self.handle.deleteTimer(ms)

    def listTimers(self):  # noqa: N802
        return self.handle.listTimers()


class Scenarios(StatefulProcessor):
    """Several test processors in one query. The first key column names the scenario: its processor gets the
    key column ``key_at[scenario]`` (default the second) as its key, states of its own (scenarios may share one
    processor, whose keys the scenario column still keeps apart), and its output rows
    become rows of the query's columns (``scenario``, then ``columns``; its "key" column goes into the key's
    column, the columns it does not have are null)."""

    def __init__(self, scenarios, key_columns, columns, pandas, key_at=None) -> None:
        self.scenarios, self.key_columns, self.columns, self.pandas = scenarios, key_columns, columns, pandas
        self.key_at = key_at or {}

    def init(self, handle) -> None:
        started = set()
        for name, processor in self.scenarios.items():  # a processor several scenarios share starts once
            if id(processor) not in started:
                started.add(id(processor))
                processor.init(Prefixed(handle, name))

    def _dispatch(self, key):
        at = self.key_at.get(key[0], 1)
        return self.scenarios[key[0]], (key[at],), self.key_columns[at]

    def _unify(self, scenario, key_column, produced):
        for out in produced or ():
            if self.pandas:
                frame = out.rename(columns={"key": key_column})
                yield pd.DataFrame({"scenario": [scenario] * len(frame),
                                    **{c: frame[c] if c in frame else [None] * len(frame) for c in self.columns}})
            else:
                values = out.asDict()
                if "key" in values:
                    values[key_column] = values.pop("key")
                yield Row(scenario=scenario, **{c: values.get(c) for c in self.columns})

    def handleInputRows(self, key, rows, timerValues):  # noqa: N802,N803
        processor, own_key, key_column = self._dispatch(key)
        yield from self._unify(key[0], key_column, processor.handleInputRows(own_key, rows, timerValues))

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):  # noqa: N802,N803
        processor, own_key, key_column = self._dispatch(key)
        yield from self._unify(key[0], key_column,
                               processor.handleExpiredTimer(own_key, timerValues, expiredTimerInfo))

    def handleInitialState(self, key, initialState, timerValues):  # noqa: N802,N803
        processor, own_key, _ = self._dispatch(key)
        processor.handleInitialState(own_key, initialState, timerValues)

    def close(self) -> None:
        for processor in self.scenarios.values():
            processor.close()
