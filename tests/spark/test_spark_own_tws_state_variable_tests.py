"""Apache Spark's own Python tests of transformWithState's state variables, ported side by side with Spark 4.3.

Sources (apache/spark, python/pyspark/sql/tests/pandas/): ``streaming/test_pandas_transform_with_state_state_
variable.py`` (the mixin ``TransformWithStateStateVariableTestsMixin``, pandas flavour), ``streaming/test_transform_
with_state_state_variable.py`` (the same mixin, ``Row`` flavour), the two ``..._checkpoint_v2.py`` files (the same
tests with ``spark.sql.streaming.stateStore.checkpointFormatVersion=2``: here a Spark-side parameter, ``CHECKPOINT``,
of the tests of the ``none_mode`` and ``initial_state`` queries below, which restart from state read back from a
checkpoint) and the processors of ``helper/helper_pandas_transform_with_state.py`` (our own ports, one class per
processor with a ``pandas`` flag; those test_spark_own_tws_tests.py uses too are in helpers/spark_ports.py, with
the machinery for running one query on both engines).

Each query runs on Spark (RocksDB, the session settings of Spark's suite: ``SUITE``) and on
``spate.spark.stream.transform_with_state`` over the same input files; each test compares its outputs batch by
batch and checks the original test's expectations on both. To keep the time down, the tests that share a time
mode and the presence of an initial state run as one query per flavour (``Scenarios``: the first key column names
the Spark test, whose processor gets states of its own, named ``<scenario>_<state>``); each query runs once per
test process, when a test first needs it, one pair (Spark's and spate's) at a time, each in a session of its own
(``Runs``), and each Spark test is a test of its own here, reading its scenario's outputs and state:

- ``none_mode``: test_transform_with_state_basic, ..._non_exist_value_state, ..._list_state_large_list,
  ..._map_state and the first query of ..._restart_with_multiple_rows_init_state (timeMode None);
- ``processing_time``: ..._list_state, ..._list_state_large_ttl, ..._map_state_large_ttl, test_value_state_ttl_basic
  and test_transform_with_{map,list,value}_state_metadata (timeMode ProcessingTime; RocksDB's changelog
  checkpointing on, for the value state test's change feed);
- ``ttl_expiration``: test_value_state_ttl_expiration (ProcessingTime, paced: see ``Pacer``);
- ``initial_state``: test_transform_with_state_init_state, ..._with_extra_transformation and the second query of
  ..._restart_with_multiple_rows_init_state (timeMode None, an initial state);
- ``initial_state_timers``: ..._init_state_with_timers and test_transform_with_map_state_metadata_with_init_state
  (ProcessingTime, an initial state).

Spark's metadata tests read the ``state-metadata`` and ``statestore`` sources inside the sink of batch 1, where
the latest committed batch is 0; here both engines' state is read after the query, at batch 0 where the test
relies on it (Spark's ``batchId``/``changeEndBatchId`` options, spate's ``checkpoint_id``). spate's counterparts:
``spate.spark.state_frame.read_state`` for ``statestore``, and for the state variables of ``state-metadata`` the
keyed states of spate's checkpoint with their kind and TTL (what ``spate checkpoints show`` lists). Spark reads a
version 2 checkpoint only with ``checkpointFormatVersion=2`` in the reading session (else it fails to parse
``<version>_<uuid>.zip``): ``Run.reader``.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest
from pyspark import cloudpickle
from pyspark.sql import Row
from pyspark.sql.functions import array_sort, col, explode, struct, to_json
from pyspark.sql.types import IntegerType, StringType, TimestampType

from helpers.spark_ports import (
    FLAVOURS,
    NO_DATA,
    MapStateProcessor,
    Ported,
    Query,
    Scenarios,
    SimpleStatefulProcessor,
    SimpleStatefulProcessorWithInitialState,
    collect_into,
    json_df,
    json_lines,
    struct_type,
    write_all,
)
from helpers.spark_query import drain
from helpers.spark_session import spark_conf

pytestmark = pytest.mark.spark
cloudpickle.register_pickle_by_value(sys.modules[__name__])

KEY = ("scenario", "id")
KEY_DDL = "scenario string, id string"
INPUT = "scenario string, id string, temperature int"
R1 = [(0, 123), (0, 46), (1, 146), (1, 346)]  # Spark's _prepare_test_resource1
R2 = [(0, 123), (0, 223), (0, 323), (1, 246), (1, 6)]  # _prepare_test_resource2
R_INIT = [(0, 67), (3, 12)]  # the second file of _test_transform_with_state_init_state
CHECKPOINT_V2 = {"spark.sql.streaming.stateStore.checkpointFormatVersion": "2"}
CHANGELOG = {"spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true"}
CHECKPOINT = pytest.mark.parametrize("checkpoint", [1, 2], ids=["checkpoint_v1", "checkpoint_v2"])
TIMERS = "$procTimers_keyToTimestamp"
PACE_MS = 5500  # the processing time between the batches of test_value_state_ttl_expiration


def _rows(scenario, pairs):
    return [{"scenario": scenario, "id": str(i), "temperature": t} for i, t in pairs]


# -- processors, ported from Spark's helper_pandas_transform_with_state.py -----------------------------------------

class Counting(Ported):
    """A processor that counts the rows with a temperature."""

    def non_null(self, rows):
        """The key's rows whose temperature is not null (pandas: ``DataFrame.count()``), per chunk."""
        if self.pandas:
            return [int(pdf["temperature"].count()) for pdf in rows]
        return [int(row.temperature is not None) for row in rows]


class InvalidSimpleStatefulProcessor(Counting):
    """A value state never written: it does not exist, ``get()`` gives None, ``clear()`` is harmless."""

    def init(self, handle) -> None:
        self.num_violations_state = handle.getValueState("numViolations", struct_type(value=IntegerType()))

    def handleInputRows(self, key, rows, timerValues):  # noqa: N802,N803
        assert not self.num_violations_state.exists()
        assert self.num_violations_state.get() is None
        self.num_violations_state.clear()
        yield self.out(id=key[0], countAsString="0")


class ListStateProcessor(Counting):
    """Per chunk of input (a DataFrame, or a Row), rewrites two list states with put, appendValue and appendList;
    then reads them through interleaved iterators, and stores a timestamp per chunk in a third list state."""

    ttl_ms: int | None = None

    def init(self, handle) -> None:
        temperature = struct_type(temperature=IntegerType())
        self.list_state1 = handle.getListState("listState1", temperature, self.ttl_ms)
        self.list_state2 = handle.getListState("listState2", temperature, self.ttl_ms)
        self.list_state_timestamp = handle.getListState("listStateTimestamp", struct_type(time=TimestampType()))

    def handleInputRows(self, key, rows, timerValues):  # noqa: N802,N803
        pair = [(120,), (20,)]
        count, times = 0, []
        for n in self.non_null(rows):
            for state, extra in ((self.list_state1, 111), (self.list_state2, 222)):
                state.put(pair)
                state.appendValue((extra,))
                state.appendList(pair)
            count += n
            now = datetime.datetime.fromtimestamp(timerValues.getCurrentProcessingTimeInMs() / 1000)
            times.append((now + datetime.timedelta(minutes=1),))
        it1, it2 = self.list_state1.get(), self.list_state2.get()
        for it, want in ((it1, 120), (it2, 120), (it1, 20), (it2, 20)):
            assert next(it)[0] == want
        it3 = self.list_state1.get()  # a second iterator of the same state, independent of the first
        for it, want in ((it3, 120), (it3, 20), (it1, 111), (it2, 222), (it3, 111), (it1, 120), (it2, 120),
                         (it3, 120), (it1, 20), (it2, 20), (it3, 20)):
            assert next(it)[0] == want
        if times:
            self.list_state_timestamp.put(times)
        yield self.out(id=key[0], countAsString=str(count))


class ListStateLargeTTLProcessor(ListStateProcessor):
    ttl_ms = 30000


class ListStateLargeListProcessor(Ported):
    """100 elements (with a null field) in a list state, then 90 more: key "0" with put, the others appendList;
    a value state holds the size, checked against what the list gives back."""

    def init(self, handle) -> None:
        self.list_state = handle.getListState("listState", struct_type(value=IntegerType(), valueNull=IntegerType()))
        self.list_size_state = handle.getValueState("listSizeState", struct_type(size=IntegerType()))

    def handleInputRows(self, key, rows, timerValues):  # noqa: N802,N803
        elements = list(self.list_state.get())
        with_put = key == ("0",)
        if not elements:
            assert self.list_size_state.get() is None
            first = [(i, None) for i in range(100)]
            (self.list_state.put if with_put else self.list_state.appendList)(first)
            self.list_size_state.update((len(first),))
        else:
            size = self.list_size_state.get()
            assert size is not None
            size = size[0]
            assert size == len(elements), f"list_size ({size}) != len(elements) ({len(elements)})"
            assert elements == [(i, None) for i in range(size)], elements
            if with_put:
                self.list_state.put([(i, None) for i in range(size + 90)])
            else:
                self.list_state.appendList([(i, None) for i in range(size, size + 90)])
            self.list_size_state.update((size + 90,))
        previous = ",".join(str(e[0]) for e in elements)
        updated = ",".join(str(e[0]) for e in self.list_state.get())
        yield self.out(id=key[0], prevElements=previous, updatedElements=updated)


class MapStateLargeTTLProcessor(MapStateProcessor):
    """MapStateProcessor with a TTL of a year on its map state, and a list state it never uses."""

    def init(self, handle) -> None:
        name = struct_type(name=StringType())
        self.map_state = handle.getMapState("mapState", name, struct_type(count=IntegerType()), 365 * 24 * 3600 * 1000)
        self.list_state = handle.getListState("listState", name)


class SimpleTTLStatefulProcessor(SimpleStatefulProcessor):
    """SimpleStatefulProcessor with a TTL of 30 s on its violations."""

    def init(self, handle) -> None:
        value = struct_type(value=IntegerType())
        self.num_violations_state = handle.getValueState("numViolations", value, 30000)
        self.temp_state = handle.getValueState("tempState", value)
        handle.deleteIfExists("tempState")


class TTLStatefulProcessor(Counting):
    """Counts rows in a value state without TTL and in value, list and map states with a TTL of 10 s; key "0"
    leaves its TTL states alone in its second batch, so they expire before its third."""

    def init(self, handle) -> None:
        value = struct_type(value=IntegerType())
        self.ttl_count_state = handle.getValueState("ttl-state", value, 10000)
        self.count_state = handle.getValueState("state", value)
        self.ttl_list_state = handle.getListState("ttl-list-state", value, 10000)
        self.ttl_map_state = handle.getMapState("ttl-map-state", struct_type(id=StringType()), value, 10000)

    def handleInputRows(self, key, rows, timerValues):  # noqa: N802,N803
        count = self.count_state.get()[0] if self.count_state.exists() else 0
        ttl_count = self.ttl_count_state.get()[0] if self.ttl_count_state.exists() else 0
        ttl_list = sum(e[0] for e in self.ttl_list_state.get()) if self.ttl_list_state.exists() else 0
        ttl_map = self.ttl_map_state.getValue(key)[0] if self.ttl_map_state.exists() else 0
        n = sum(self.non_null(rows))
        count, ttl_count, ttl_list, ttl_map = count + n, ttl_count + n, ttl_list + n, ttl_map + n
        self.count_state.update((count,))
        if not (ttl_count == 2 and key[0] == "0"):
            self.ttl_count_state.update((ttl_count,))
            self.ttl_list_state.put([(ttl_list,), (ttl_list,)])
            self.ttl_map_state.updateValue(key, (ttl_map,))
        i = key[0]
        ids = [f"ttl-count-{i}", f"count-{i}", f"ttl-list-state-count-{i}", f"ttl-map-state-count-{i}"]
        counts = [ttl_count, count, ttl_list, ttl_map]
        if self.pandas:
            yield pd.DataFrame({"id": ids, "count": counts})
        else:
            for name, value in zip(ids, counts, strict=True):
                yield Row(id=name, count=value)


class StatefulProcessorWithInitialStateTimers(SimpleStatefulProcessorWithInitialState):
    """Each key of the initial state registers a processing-time timer 1 ms in the past: it fires in the first
    batch ("<id>-expired", its time)."""

    def init(self, handle) -> None:
        super().init(handle)
        self.handle = handle

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):  # noqa: N802,N803
        self.handle.deleteTimer(expiredTimerInfo.getExpiryTimeInMs())
        yield self.out(id=f"{key[0]}-expired", value=str(expiredTimerInfo.getExpiryTimeInMs()))

    def handleInitialState(self, key, initialState, timerValues):  # noqa: N802,N803
        super().handleInitialState(key, initialState, timerValues)
        self.handle.registerTimer(timerValues.getCurrentProcessingTimeInMs() - 1)


class StatefulProcessorWithListStateInitialState(SimpleStatefulProcessorWithInitialState):
    """Appends every initVal of the initial state to a list state (and does not touch the value state)."""

    def init(self, handle) -> None:
        super().init(handle)
        self.list_state = handle.getListState("list_state", struct_type(value=IntegerType()))

    def handleInitialState(self, key, initialState, timerValues):  # noqa: N802,N803
        if self.pandas:
            for value in initialState["initVal"].tolist():
                self.list_state.appendValue((value,))
        else:
            self.list_state.appendValue((initialState.initVal,))


class Pacer(Ported):
    """Not Spark's: test_value_state_ttl_expiration's sink sleeps 4 s after batches 0 and 1 (flaky, so Spark skips
    the test: whether the 10 s TTL expires depends on how long the batches took). This scenario outputs the
    batch's processing time, and the sink (``_pace``) sleeps until ``PACE_MS`` after it: the next batch starts at
    least that much later whatever the batch took, so batch 2 comes at least 11 s after batch 0 (past the TTL)
    and, unless batch 1 takes more than about 4 s, less than 10 s after batch 1 (within it), on both engines."""

    def init(self, handle) -> None:
        pass

    def handleInputRows(self, key, rows, timerValues):  # noqa: N802,N803
        for _ in rows:
            pass
        yield self.out(id=key[0], countAsString=str(timerValues.getCurrentProcessingTimeInMs()))


# -- the queries -------------------------------------------------------------------------------------------------

@dataclass
class Run:
    """One query's outputs on both engines, and where each kept its state."""

    got: dict  # spate's, per batch: (scenario, *columns)
    want: dict  # Spark's
    spate_root: Path
    spark_checkpoint: Path
    version: int  # Spark's checkpointFormatVersion

    def reader(self, spark):
        """A session that reads Spark's checkpoint (a version 2 checkpoint needs the setting to be read)."""
        session = spark.newSession()
        if self.version == 2:
            for name, value in CHECKPOINT_V2.items():
                session.conf.set(name, value)
        return session

    def of(self, scenario, outputs, project=None):
        """One scenario's rows per batch (without the scenario column), sorted; batches where it has none left out."""
        found = {}
        for b, rows in sorted(outputs.items()):
            mine = sorted(((r[1:] if project is None else tuple(r[i] for i in project)) for r in rows
                           if r[0] == scenario), key=repr)
            if mine:
                found[b] = mine
        return found

    def both(self, scenario, project=None):
        """(spate's, Spark's) rows of ``scenario``, checked equal batch by batch."""
        got, want = self.of(scenario, self.got, project), self.of(scenario, self.want, project)
        assert got == want, (scenario, got, want)
        return got, want


def _same(df):
    return df


@dataclass
class Around:
    """What a query adds around ``run_both``'s way of running it on both engines."""

    spate_initial: Callable | None = None  # spark -> spate's initial state (default: the query's own)
    post: Callable = _same  # a transformation of the outputs
    after_batch: Callable | None = None  # called in the sink with a batch's id and (normalized) outputs


def _on_spark(spark, q, source, checkpoint, around):
    """Spark's outputs per batch (``run_spark``, with ``around.post`` in the streaming query)."""
    outputs: dict = {}
    collect = collect_into(outputs)

    def sink(df, batch_id):
        collect(df, batch_id)
        if around.after_batch is not None:
            around.after_batch(batch_id, outputs.get(batch_id, []))

    grouped = q.build(spark, source).groupBy(*q.key)
    apply = grouped.transformWithStateInPandas if q.flavour == "pandas" else grouped.transformWithState
    tws = apply(statefulProcessor=q.processor(), outputStructType=q.output, outputMode="Update",
                timeMode=q.time_mode, initialState=q.initial(spark) if q.initial else None)
    drain(lambda: around.post(tws).writeStream.foreachBatch(sink).option("checkpointLocation", str(checkpoint)).start())
    return outputs


def _on_spate(spark, q, source, root, around):
    """spate's outputs per batch (``run_spate``; ``around.post`` applied to each batch's outputs in the sink, as
    spate documents it: its outputs are no streaming DataFrame, and a streaming ``select`` says so)."""
    from spate.spark.stream import transform_with_state

    outputs: dict = {}
    collect = collect_into(outputs)

    def sink(df, batch_id):
        collect(around.post(df), batch_id)
        if around.after_batch is not None:
            around.after_batch(batch_id, outputs.get(batch_id, []))

    initial = around.spate_initial or q.initial
    stream = transform_with_state(q.build(spark, source), list(q.key), q.processor(), q.output,
                                  time_mode=q.time_mode, flavour=q.flavour,
                                  initial_state=initial(spark) if initial else None, checkpoint_root=str(root),
                                  parallelism=q.parallelism, local_dir=str(root) + "-local",
                                  idle_batches=q.settings().get(NO_DATA, "true") != "false")
    if around.post is not _same:
        with pytest.raises(AttributeError, match="cannot follow it"):
            around.post(stream)
    try:
        stream.start(sink, trigger={"availableNow": True}).awaitTermination()
    finally:
        stream.close()
    return outputs


def run_pair(spark, q, source, tmp_path, around):
    """(spate's, Spark's) outputs, both queries running at once, as ``run_both``."""
    with spark_conf(spark, **q.settings()), ThreadPoolExecutor(1) as pool:
        on_spate = pool.submit(_on_spate, spark, q, source, tmp_path / "spate", around)
        want = _on_spark(spark, q, source, tmp_path / "spark", around)
        return on_spate.result(), want


def _pace(batch_id, rows):
    """The sink's sleep after the first two of test_value_state_ttl_expiration's batches (see ``Pacer``)."""
    for scenario, _id, processing_time, _count in rows:
        if scenario == "pace" and batch_id in (1, 2):
            time.sleep(max(0.0, (int(processing_time) + PACE_MS) / 1000 - time.time()))


class Runs:
    """The module's queries: each runs once per flavour and variant, in its own session (its settings are its
    own), when a test first asks for it (a query's dependencies are submitted before it), one at a time; a test
    waits for its query. Not all at once in the background: the test processes (pytest-xdist) share this module's
    tests, and each would run every query; and the first batch of each of Spark's queries starts a Python worker
    on the driver that Spark gives a hard-coded 10 s to connect back: when two test processes started eight of
    them within seconds on two cores, every one missed it (``helpers.spark_query``)."""

    def __init__(self, spark, factory) -> None:
        self.spark, self.factory = spark, factory
        self.pool = ThreadPoolExecutor(1)
        self.paced = ThreadPoolExecutor(1)  # the paced queries: each waits for a query of the pool to warm up
        self.futures: dict = {}
        self.lock = threading.Lock()

    def _once(self, key, compute, wait, pool=None):
        with self.lock:
            if key not in self.futures:
                self.futures[key] = (pool or self.pool).submit(compute)
        return self.futures[key].result() if wait else self.futures[key]

    def _query(self, name, flavour, partitions, version, files, scenarios, columns, output, time_mode="None",
               conf=None, initial=None, around=None):
        tmp = self.factory.mktemp(f"{name}-{flavour}-{partitions}-v{version}")
        source = str(tmp / "in")
        write_all(source, [json_lines(f) for f in files])
        pandas = flavour == "pandas"
        settings = {**(conf or {}), "spark.sql.shuffle.partitions": str(partitions),
                    **(CHECKPOINT_V2 if version == 2 else {})}
        q = Query(lambda: Scenarios(scenarios(pandas), list(KEY), columns, pandas), output, flavour,
                  build=json_df(INPUT), key=KEY, time_mode=time_mode, initial=initial, conf=settings,
                  parallelism=partitions)
        got, want = run_pair(self.spark.newSession(), q, source, tmp, around or Around())
        return Run(got, want, tmp / "spate", tmp / "spark", version)

    def none_mode(self, flavour, partitions=2, version=1, wait=True):
        def compute():
            return self._query(
                "none", flavour, partitions, version,
                [_rows("basic", R1) + _rows("nonexist", R1) + _rows("largelist", R1) + _rows("map", R1)
                 + _rows("restart", R1), _rows("basic", R2) + _rows("largelist", R2)],
                lambda p: {"basic": SimpleStatefulProcessor(p), "nonexist": InvalidSimpleStatefulProcessor(p),
                           "largelist": ListStateLargeListProcessor(p), "map": MapStateProcessor(p),
                           "restart": ListStateProcessor(p)},
                ["id", "countAsString", "prevElements", "updatedElements"],
                f"{KEY_DDL}, countAsString string, prevElements string, updatedElements string")
        return self._once(("none", flavour, partitions, version), compute, wait)

    def processing_time(self, flavour, wait=True):
        def compute():
            return self._query(
                "processing", flavour, 2, 1,
                [_rows("list", R1) + _rows("listttl", R1) + _rows("mapttl", R1) + _rows("valuettl", R1)
                 + _rows("mapmeta", R1) + _rows("listmeta", R1) + _rows("valuemeta", R1),
                 _rows("valuettl", R2) + _rows("listmeta", R2) + _rows("valuemeta", R2)],
                lambda p: {"list": ListStateProcessor(p), "listttl": ListStateLargeTTLProcessor(p),
                           "mapttl": MapStateLargeTTLProcessor(p), "valuettl": SimpleTTLStatefulProcessor(p),
                           "mapmeta": MapStateLargeTTLProcessor(p), "listmeta": ListStateProcessor(p),
                           "valuemeta": SimpleStatefulProcessor(p)},
                ["id", "countAsString"], f"{KEY_DDL}, countAsString string", time_mode="ProcessingTime",
                conf=CHANGELOG)
        return self._once(("processing", flavour), compute, wait)

    def ttl_expiration(self, flavour, wait=True):
        """test_value_state_ttl_expiration's query, paced (``Pacer``), in a pool of its own: it waits for the first
        query, in the other pool, to warm Spark and spate up. Its first batch only warms its own query up (a
        query's first batch is slow: workers start, state stores open), Spark's test's three batches follow."""
        ttl = [(1, 0), (0, 0)]  # each of the test's three files
        warm = self.none_mode("pandas", wait=False)

        def compute():
            with contextlib.suppress(Exception):  # that query's failure is its tests'
                warm.result()
            return self._query(
                "ttl", flavour, 2, 1, [_rows("pace", [(0, 0)])] + [_rows("ttl", ttl) + _rows("pace", [(0, 0)])] * 3,
                lambda p: {"ttl": TTLStatefulProcessor(p), "pace": Pacer(p)},
                ["id", "countAsString", "count"], f"{KEY_DDL}, countAsString string, count int",
                time_mode="ProcessingTime", around=Around(after_batch=_pace))
        return self._once(("ttl", flavour), compute, wait, self.paced)

    def initial_state(self, flavour, partitions=2, version=1, wait=True):
        first = self.none_mode(flavour, partitions, version, wait=False)  # its "restart" scenario's list state

        def initial(read):
            def build(spark):
                given = spark.createDataFrame([(s, k, v) for s in ("init", "extra") for k, v in (("0", 789),
                                                                                              ("3", 987))],
                                              f"{KEY_DDL}, initVal int")
                return given.unionByName(read(spark)).groupBy(*KEY)
            return build

        def from_spate(spark):
            from spate.spark.state_frame import read_state

            root = str(first.result().spate_root)
            return read_state(spark, root, "restart_listState1", key_schema=KEY_DDL).selectExpr(
                "'restart' AS scenario", "key.id AS id", "value.temperature AS initVal")

        def from_spark(spark):
            return _spark_state(spark, first.result(), "restart_listState1").selectExpr(
                "'restart' AS scenario", "key.id AS id", "list_element.temperature AS initVal")

        def post(df):  # test_transform_with_state_init_state_with_extra_transformation's select (adding columns)
            return df.select("*", col("id").cast("string").alias("key"), to_json(struct(col("value"))).alias("json"))

        def compute():
            first.result()
            return self._query(
                "initial", flavour, partitions, version,
                [_rows("init", R1) + _rows("extra", R1) + _rows("restart", R1),
                 _rows("init", R_INIT) + _rows("extra", R_INIT) + _rows("restart", R_INIT)],
                lambda p: {"init": SimpleStatefulProcessorWithInitialState(p),
                           "extra": SimpleStatefulProcessorWithInitialState(p),
                           "restart": StatefulProcessorWithListStateInitialState(p)},
                ["id", "value"], f"{KEY_DDL}, value string", initial=initial(from_spark),
                around=Around(spate_initial=initial(from_spate), post=post))
        return self._once(("initial", flavour, partitions, version), compute, wait)

    def initial_state_timers(self, flavour, partitions=2, wait=True):
        def initial(spark):  # initVal for test_..._init_state_with_timers, temperature for the metadata test's
            return spark.createDataFrame(
                [(s, k, v, v) for s in ("timers", "mapmetainit") for k, v in (("0", 789), ("3", 987))],
                f"{KEY_DDL}, initVal int, temperature int").groupBy(*KEY)

        def compute():
            return self._query(
                "timers", flavour, partitions, 1,
                [_rows("timers", R1) + _rows("mapmetainit", R1), _rows("timers", R_INIT)],
                lambda p: {"timers": StatefulProcessorWithInitialStateTimers(p),
                           "mapmetainit": MapStateLargeTTLProcessor(p)},
                ["id", "value", "countAsString"], f"{KEY_DDL}, value string, countAsString string",
                time_mode="ProcessingTime", initial=initial)
        return self._once(("timers", flavour, partitions), compute, wait)


@pytest.fixture(scope="module")
def runs(spark, tmp_path_factory):
    started = Runs(spark, tmp_path_factory)
    yield started
    started.pool.shutdown(wait=True, cancel_futures=True)
    started.paced.shutdown(wait=True, cancel_futures=True)


# -- reading state on both engines -------------------------------------------------------------------------------

def _spark_state(spark, run, name, **options):
    """Spark's ``statestore`` source: state variable ``name`` of the run's checkpoint."""
    reader = run.reader(spark).read.format("statestore").option("path", str(run.spark_checkpoint))
    reader = reader.option("stateVarName", name)
    for option, value in options.items():
        reader = reader.option(option, value)
    return reader.load()


def _spate_state(spark, root, name, checkpoint_id=None):
    from spate.spark.state_frame import read_state

    return read_state(spark, str(root), name, checkpoint_id=checkpoint_id, key_schema=KEY_DDL)


def _spark_metadata(spark, run):
    """Spark's ``state-metadata`` source: its one operator's row and properties."""
    (row,) = run.reader(spark).read.format("state-metadata").load(str(run.spark_checkpoint)).collect()
    return row, json.loads(row.operatorProperties)


SPARK_TYPES = {"value": "ValueState", "list": "ListState", "map": "MapState"}


def _spark_variables(properties, scenario):
    """One scenario's state variables in Spark's metadata: name → (type, TTL enabled)."""
    prefix = f"{scenario}_"
    return {v["stateName"][len(prefix):]: (v["stateVariableType"], v["ttlEnabled"])
            for v in properties["stateVariables"] if v["stateName"].startswith(prefix)}


def _spate_variables(root, scenario):
    """One scenario's keyed states in spate's latest checkpoint (the states ``spate checkpoints show`` lists),
    each with its kind and whether it has a TTL."""
    from spate.checkpoint.inspect import load_checkpoint
    from spate.fs import CheckpointStorage

    meta = load_checkpoint(CheckpointStorage(str(root)))
    states = [m for st in meta.subtasks for handle in [*st.keyed, *st.changelog] for m in handle.states]
    prefix = f"{scenario}_"
    return {m["name"][len(prefix):]: (SPARK_TYPES[m["kind"]], m["ttl_ms"] is not None)
            for m in states if m["name"].startswith(prefix)}


def _per_key(rows):
    found: dict = {}
    for key, value in rows:
        found.setdefault(key, []).append(value)
    return {k: sorted(v) for k, v in found.items()}


def _check_spark_metadata(spark, run, flavour, scenario, variables, partitions=2):
    """Spark's checks of its ``state-metadata`` source (the batches: those of the whole query)."""
    row, properties = _spark_metadata(spark, run)
    operator = "transformWithStateInPandasExec" if flavour == "pandas" else "transformWithStateInPySparkExec"
    assert (row.operatorId, row.operatorName, row.stateStoreName, row.numPartitions, row.minBatchId) == (
        0, operator, "default", partitions, 0)
    assert row.maxBatchId == max(run.want)
    assert (properties["timeMode"], properties["outputMode"]) == ("ProcessingTime", "Update")
    assert _spark_variables(properties, scenario) == variables
    assert [v["stateVariableType"] for v in properties["stateVariables"] if v["stateName"] == TIMERS] == ["TimerState"]


# -- test_pandas_transform_with_state_state_variable.py / test_transform_with_state_state_variable.py --------------

def _sets(outputs):
    return {b: set(rows) for b, rows in outputs.items()}


@FLAVOURS
@CHECKPOINT
def test_transform_with_state_basic(runs, flavour, checkpoint):
    run = runs.none_mode(flavour, version=checkpoint)
    for outputs in run.both("basic"):
        assert _sets(outputs) == {0: {("0", "2", None, None), ("1", "2", None, None)},
                                  1: {("0", "3", None, None), ("1", "2", None, None)}}


@FLAVOURS
@CHECKPOINT
def test_transform_with_state_non_exist_value_state(runs, flavour, checkpoint):
    for outputs in runs.none_mode(flavour, version=checkpoint).both("nonexist"):
        assert _sets(outputs) == {0: {("0", "0", None, None), ("1", "0", None, None)}}


@FLAVOURS
def test_transform_with_state_list_state(runs, flavour):
    for outputs in runs.processing_time(flavour).both("list"):
        assert _sets(outputs) == {0: {("0", "2"), ("1", "2")}}


@FLAVOURS
@CHECKPOINT
def test_transform_with_state_list_state_large_list(runs, flavour, checkpoint):
    first, second = ",".join(map(str, range(100))), ",".join(map(str, range(190)))
    for outputs in runs.none_mode(flavour, version=checkpoint).both("largelist"):
        assert _sets(outputs) == {0: {("0", None, "", first), ("1", None, "", first)},
                                  1: {("0", None, first, second), ("1", None, first, second)}}


@FLAVOURS
def test_transform_with_state_list_state_large_ttl(runs, flavour):
    """List state with a TTL that does not expire behaves as list state."""
    for outputs in runs.processing_time(flavour).both("listttl"):
        assert _sets(outputs) == {0: {("0", "2"), ("1", "2")}}


@FLAVOURS
@CHECKPOINT
def test_transform_with_state_map_state(runs, flavour, checkpoint):
    for outputs in runs.none_mode(flavour, version=checkpoint).both("map"):
        assert _sets(outputs) == {0: {("0", "2", None, None), ("1", "2", None, None)}}


@FLAVOURS
def test_transform_with_state_map_state_large_ttl(runs, flavour):
    for outputs in runs.processing_time(flavour).both("mapttl"):
        assert _sets(outputs) == {0: {("0", "2"), ("1", "2")}}


@FLAVOURS
def test_value_state_ttl_basic(runs, flavour):
    """Value state with a TTL of 30 s that does not expire behaves as value state."""
    for outputs in runs.processing_time(flavour).both("valuettl"):
        assert _sets(outputs) == {0: {("0", "2"), ("1", "2")}, 1: {("0", "3"), ("1", "2")}}


def _ttl_rows(key, ttl_count, count, ttl_list, ttl_map):
    return {(f"ttl-count-{key}", None, ttl_count), (f"count-{key}", None, count),
            (f"ttl-list-state-count-{key}", None, ttl_list), (f"ttl-map-state-count-{key}", None, ttl_map)}


TTL_MS = 10000  # TTLStatefulProcessor's


def _ttl_expected(times):
    """TTLStatefulProcessor's outputs per batch, one row of each key per batch, at these processing times: the
    TTL states a key wrote at s are gone at s + 10 s. Batches 11 s and 5.5 s apart give Spark's test's table."""
    states = {key: {"count": 0, "written": None} for key in "01"}
    expected = {}
    for batch, now in enumerate(times):
        expected[batch] = set()
        for key, st in states.items():
            alive = st["written"] is not None and now < st["written"] + TTL_MS
            count = st["count"] + 1
            ttl_count, ttl_map = (st["ttl_count"] + 1, st["ttl_map"] + 1) if alive else (1, 1)
            ttl_list = 2 * st["ttl_list"] + 1 if alive else 1  # the list holds its count twice
            st["count"] = count
            if not (ttl_count == 2 and key == "0"):
                st.update(ttl_count=ttl_count, ttl_list=ttl_list, ttl_map=ttl_map, written=now)
            expected[batch] |= _ttl_rows(key, ttl_count, count, ttl_list, ttl_map)
    return expected


def _processing_times(outputs):
    """The processing time of Spark's test's batches (after the warm-up batch), as the pace scenario reported it."""
    return [t for b, t in sorted((b, int(r[2])) for b, rows in outputs.items() for r in rows if r[0] == "pace")][1:]


@FLAVOURS
def test_value_state_ttl_expiration(runs, flavour):
    """Skipped by Spark as flaky (SPARK-50908: its sink sleeps 4 s after batches 0 and 1, so whether the 10 s TTL
    expires depends on how long the batches took). Here (after a batch that warms the query up) the sink sleeps
    until 5.5 s after the processing time of batches 0 and 1 (``Pacer``), so batch 2 comes at least 11 s after
    batch 0 and, unless a batch takes more than about 4 s, less than 10 s after batch 1: key "0", which left its
    TTL states alone in batch 1, finds them expired (its counts restart at 1), key "1" renewed them in batch 1.
    Each engine is checked against the TTL's semantics at its own batches' processing times (Spark's table at
    those usual times), and the two engines' outputs against each other when those times give both the same
    expectations."""
    run = runs.ttl_expiration(flavour)
    expected = {}
    for name, outputs in (("spate", run.got), ("Spark", run.want)):
        times = _processing_times(outputs)
        expected[name] = _ttl_expected(times)
        found = {b - 1: rows for b, rows in _sets(run.of("ttl", outputs)).items()}  # after the warm-up batch
        assert found == expected[name], (name, times)
    if expected["spate"] == expected["Spark"]:
        run.both("ttl")


@FLAVOURS
@CHECKPOINT
def test_transform_with_state_init_state(runs, flavour, checkpoint):
    """Key 0's initial state is applied once, key 1 has none, key 3 (initial state only) outputs in batch 1."""
    for outputs in runs.initial_state(flavour, version=checkpoint).both("init", (1, 2)):
        assert _sets(outputs) == {0: {("0", str(789 + 123 + 46)), ("1", str(146 + 346))},
                                  1: {("0", str(789 + 123 + 46 + 67)), ("3", str(987 + 12))}}


@FLAVOURS
@CHECKPOINT
def test_transform_with_state_init_state_with_extra_transformation(runs, flavour, checkpoint):
    """Spark selects the key and the value as JSON in its streaming query; spate's outputs are no streaming
    DataFrame (``select`` on them raises, saying to apply it to each batch's outputs in the sink), so spate's
    run applies the same select in its sink."""
    def as_json(total):
        return json.dumps({"value": str(total)}, separators=(",", ":"))

    for outputs in runs.initial_state(flavour, version=checkpoint).both("extra", (3, 4)):
        assert _sets(outputs) == {0: {("0", as_json(789 + 123 + 46)), ("1", as_json(146 + 346))},
                                  1: {("0", as_json(789 + 123 + 46 + 67)), ("3", as_json(987 + 12))}}


def _check_init_state_with_timers(run):
    """Batch 0: the timers registered in handleInitialState fire, for key 3 (no input) too; batch 1: none.
    A timer's time is each engine's own processing time: its rows are compared without it."""
    for outputs in run.both("timers", (1,)):
        assert _sets(outputs) == {0: {("0",), ("1",), ("0-expired",), ("3-expired",)}, 1: {("0",), ("3",)}}
    for outputs in (run.got, run.want):
        rows = run.of("timers", outputs, (1, 2))
        assert {b: {r for r in found if not r[0].endswith("-expired")} for b, found in rows.items()} == {
            0: {("0", str(789 + 123 + 46)), ("1", str(146 + 346))},
            1: {("0", str(789 + 123 + 46 + 67)), ("3", str(987 + 12))}}
        expired = [(b, int(value)) for b, found in rows.items() for key, value in found if key.endswith("-expired")]
        assert [b for b, _ in expired] == [0, 0] and all(ms > 0 for _, ms in expired)


@FLAVOURS
def test_transform_with_state_init_state_with_timers(runs, flavour):
    _check_init_state_with_timers(runs.initial_state_timers(flavour))


def _check_map_state_metadata(spark, run, flavour, scenario, count_as_string):
    """After the query (one batch): the map state read on both engines, both ways on Spark (flattened, and not);
    Spark's state-metadata lists the TTL map state, the list state and the timers; the list state is empty."""
    for outputs in run.both(scenario, (1, count_as_string)):
        assert _sets(outputs) == {0: {("0", "2"), ("1", "2")}}
    spark_map = _spark_state(spark, run, f"{scenario}_mapState").selectExpr(
        "key.id", "user_map_key.name", "user_map_value.value.count", "user_map_value.ttlExpirationMs").collect()
    nested = _spark_state(spark, run, f"{scenario}_mapState", flattenCollectionTypes=False)
    nested = nested.select("key.id", explode(col("map_value")).alias("map_key", "map_value")).selectExpr(
        "id", "map_key.name", "map_value.value.count").collect()
    spate_map = _spate_state(spark, run.spate_root, f"{scenario}_mapState").selectExpr(
        "key.id", "user_key.name", "value.count", "expires_at_ms").collect()
    assert sorted(tuple(r[:3]) for r in spate_map) == sorted(tuple(r[:3]) for r in spark_map) == sorted(
        tuple(r) for r in nested) == []
    assert _spark_state(spark, run, f"{scenario}_listState").isEmpty()
    assert _spate_state(spark, run.spate_root, f"{scenario}_listState").isEmpty()
    variables = {"mapState": ("MapState", True), "listState": ("ListState", False)}
    _check_spark_metadata(spark, run, flavour, scenario, variables)
    assert _spate_variables(run.spate_root, scenario) == variables


@FLAVOURS
def test_transform_with_map_state_metadata(spark, runs, flavour):
    """Spark's checks of the state sources sit in the branch for batch 1, which its single-batch query never
    runs; here they are made after the query, on both engines. The processor clears its map state in every
    batch (as MapStateProcessor does), so the map state is empty on both, unlike that branch's expectations."""
    _check_map_state_metadata(spark, runs.processing_time(flavour), flavour, "mapmeta", 2)


@FLAVOURS
def test_transform_with_map_state_metadata_with_init_state(spark, runs, flavour):
    """The same with an initial state (``id, temperature``) the processor ignores (Spark: another Python runner)."""
    _check_map_state_metadata(spark, runs.initial_state_timers(flavour), flavour, "mapmetainit", 3)


@FLAVOURS
def test_transform_with_list_state_metadata(spark, runs, flavour):
    """Two batches (batch 1 rewrites the lists as batch 0 did); then three list states in the metadata, and
    listState1 (flattened) and listState2 (not flattened on Spark) read on both engines."""
    run = runs.processing_time(flavour)
    for outputs in run.both("listmeta", (1, 2)):
        assert _sets(outputs) == {0: {("0", "2"), ("1", "2")}, 1: {("0", "3"), ("1", "2")}}
    variables = {name: ("ListState", False) for name in ("listState1", "listState2", "listStateTimestamp")}
    _check_spark_metadata(spark, run, flavour, "listmeta", variables)
    assert _spate_variables(run.spate_root, "listmeta") == variables
    first = _spark_state(spark, run, "listmeta_listState1", flattenCollectionTypes=True)
    first = first.selectExpr("key.id", "list_element.temperature").collect()
    second = _spark_state(spark, run, "listmeta_listState2", flattenCollectionTypes=False)
    second = second.select(col("key.id"), array_sort(col("list_value.temperature"))).collect()
    assert _per_key(first) == {"0": [20, 20, 111, 120, 120], "1": [20, 20, 111, 120, 120]}
    assert {k: v for k, v in second} == {"0": [20, 20, 120, 120, 222], "1": [20, 20, 120, 120, 222]}
    for name, want in (("listState1", _per_key(first)), ("listState2", {k: v for k, v in second})):
        rows = _spate_state(spark, run.spate_root, f"listmeta_{name}").selectExpr("key.id", "value.temperature")
        assert _per_key(rows.collect()) == want, name


@FLAVOURS
def test_transform_with_value_state_metadata(spark, runs, flavour):
    """Changelog checkpointing on. Spark's change feed of numViolations from batch 0 to batch 0 (what the test
    reads in batch 1's sink) holds batch 0's updates; spate has no change feed: a state empty before batch 0
    holds after it exactly those updates, so spate's side reads its checkpoint of batch 0 (``read_state``'s
    ``checkpoint_id``). Spark also checks its snapshot of batch 0 per partition against its change feed."""
    run = runs.processing_time(flavour)
    for outputs in run.both("valuemeta", (1, 2)):
        assert _sets(outputs) == {0: {("0", "2"), ("1", "2")}, 1: {("0", "3"), ("1", "2")}}
    variables = {"numViolations": ("ValueState", False), "tempState": ("ValueState", False)}  # and the timers
    _check_spark_metadata(spark, run, flavour, "valuemeta", variables)
    assert _spate_variables(run.spate_root, "valuemeta") == variables
    changes = _spark_state(spark, run, "valuemeta_numViolations", readChangeFeed=True,
                           changeStartBatchId=0, changeEndBatchId=0).selectExpr(
        "change_type", "key.id AS id", "value.value AS value", "partition_id").collect()
    assert sorted(tuple(r[:3]) for r in changes) == [("update", "0", 1), ("update", "1", 2)]
    for partition in {r.partition_id for r in changes}:
        snapshot = _spark_state(spark, run, "valuemeta_numViolations", snapshotPartitionId=partition,
                                snapshotStartBatchId=0, batchId=0).selectExpr("key.id", "value.value").collect()
        assert sorted(tuple(r) for r in snapshot) == sorted((r.id, r.value) for r in changes
                                                            if r.partition_id == partition)
    at_batch_0 = _spate_state(spark, run.spate_root, "valuemeta_numViolations", checkpoint_id=0)
    assert sorted(tuple(r) for r in at_batch_0.selectExpr("key.id", "value.value").collect()) == sorted(
        tuple(r[1:3]) for r in changes)


def _check_restart_with_multiple_rows_init_state(spark, runs, flavour, partitions=2, version=1):
    """A first query's list state, read back as a DataFrame (Spark's ``statestore``, spate's ``read_state``), is
    a second query's initial state: several rows per key, each appended to the second query's list state."""
    first = runs.none_mode(flavour, partitions, version)
    for outputs in first.both("restart", (1, 2)):
        assert _sets(outputs) == {0: {("0", "2"), ("1", "2")}}
    run = runs.initial_state(flavour, partitions, version)
    for outputs in run.both("restart", (1, 2)):
        assert _sets(outputs) == {0: {("0", str(123 + 46)), ("1", str(146 + 346))},
                                  1: {("0", str(123 + 46 + 67)), ("3", "12")}}
    spark_list = _spark_state(spark, run, "restart_list_state").selectExpr(
        "key.id", "list_element.value").collect()
    spate_list = _spate_state(spark, run.spate_root, "restart_list_state").selectExpr("key.id", "value.value")
    assert _per_key(spate_list.collect()) == _per_key(spark_list) == {"0": [20, 20, 111, 120, 120],
                                                                      "1": [20, 20, 111, 120, 120]}


@FLAVOURS
@CHECKPOINT
def test_transform_with_state_restart_with_multiple_rows_init_state(spark, runs, flavour, checkpoint):
    _check_restart_with_multiple_rows_init_state(spark, runs, flavour, version=checkpoint)


@FLAVOURS
def test_transform_with_state_with_timers_single_partition(spark, runs, flavour):
    """The two tests above with one shuffle partition on Spark, one subtask on spate."""
    _check_init_state_with_timers(runs.initial_state_timers(flavour, partitions=1))
    _check_restart_with_multiple_rows_init_state(spark, runs, flavour, partitions=1)


def test_the_queries_ran_the_batches_spark_runs(runs):
    """The batches of each query (no batch without input: the suite turns them off), on both engines."""
    for flavour in ("pandas", "row"):
        for run, batches in ((runs.none_mode(flavour), [0, 1]), (runs.processing_time(flavour), [0, 1]),
                             (runs.ttl_expiration(flavour), [0, 1, 2, 3]),
                             (runs.initial_state(flavour), [0, 1]), (runs.initial_state_timers(flavour), [0, 1])):
            assert sorted(run.got) == sorted(run.want) == batches
