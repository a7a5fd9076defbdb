"""State as a DataFrame: ``read_state`` against Spark's own ``statestore`` data source on the same
StatefulProcessor and input, TTL expiry, errors, and savepoints bootstrapped from a DataFrame restored at
other parallelisms."""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from collections.abc import Iterator

import pandas as pd
import pytest
from pyspark import cloudpickle
from pyspark.sql import functions as F
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle

from helpers.file_source import write_files
from helpers.readme_blocks import python_block, run_block
from helpers.spark_query import drain
from spate import ListStateDescriptor, LocalRunner, MapStateDescriptor, Processor, ValueStateDescriptor
from spate.errors import CheckpointError
from spate.spark.adapter import StatefulProcessorAdapter
from spate.spark.state_frame import read_state, write_savepoint
from spate.spark.stream import transform_with_state

pytestmark = pytest.mark.spark
cloudpickle.register_pickle_by_value(sys.modules[__name__])
INPUT = "user string, page string, n long"
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


class Tracker(StatefulProcessor):
    """Value (two fields), list and map state; emits, per key, the state it found before the batch's rows.
    ``handleInitialState`` writes the same state from initial rows."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.count = handle.getValueState("count", "count long, last string")
        self.history = handle.getListState("history", "n long")
        self.pages = handle.getMapState("pages", "page string", "clicks long")

    def _seen(self) -> str:
        count = tuple(self.count.get()) if self.count.exists() else None
        pages = sorted((k[0], v[0]) for k, v in self.pages.iterator()) if self.pages.exists() else []
        return json.dumps([count, [h[0] for h in self.history.get()], pages])

    def _add(self, frame: pd.DataFrame) -> None:
        count, last = self.count.get() if self.count.exists() else (0, "")
        for page, n in zip(frame["page"], frame["n"], strict=True):
            count, last = count + 1, max(last, page)
            self.count.update((count, last))
            self.history.appendValue((int(n),))
            before = self.pages.getValue((page,))
            self.pages.updateValue((page,), ((before[0] if before else 0) + 1,))

    def handleInputRows(self, key, rows, timerValues) -> Iterator[pd.DataFrame]:  # noqa: N802,N803
        seen = self._seen()
        for frame in rows:
            self._add(frame)
        yield pd.DataFrame({"user": [key[0]], "seen": [seen]})

    def handleInitialState(self, key, initialState, timerValues) -> None:  # noqa: N802,N803
        self._add(initialState)

    def close(self) -> None:
        pass


def _clicks(n_files=2, users=7, per_file=30):
    return [[{"user": f"u{(f * 11 + i * 3) % users}", "page": f"/p{(i + f) % 4}", "n": f * 100 + i}
             for i in range(per_file)] for f in range(n_files)]


def _model(rows):
    """user → [(count, greatest page), history, sorted [(page, clicks)]] after ``rows`` in order."""
    out: dict = {}
    for r in rows:
        count, history, pages = out.setdefault(r["user"], [None, [], {}])
        out[r["user"]][0] = ((count[0] if count else 0) + 1, max(count[1] if count else "", r["page"]))
        history.append(r["n"])
        pages[r["page"]] = pages.get(r["page"], 0) + 1
    return {u: [list(c), h, sorted(map(list, p.items()))] for u, (c, h, p) in out.items()}


# -- side by side with Spark's statestore reader ---------------------------------------------------------

def _run_spark(spark, source, location):
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", ROCKSDB)
    df = spark.readStream.schema(INPUT).option("maxFilesPerTrigger", 1).json(source)
    out = df.groupBy("user").transformWithStateInPandas(Tracker(), "user string, seen string", "Update", "None")
    drain(lambda: out.writeStream.format("noop").option("checkpointLocation", location).start())


def _run_spate(spark, source, root, local, **settings):
    df = spark.readStream.schema(INPUT).option("maxFilesPerTrigger", 1).json(source)
    stream = transform_with_state(df, "user", Tracker(), "user string, seen string", checkpoint_root=root,
                                  local_dir=local, **settings)
    out = os.path.join(root, "..", os.path.basename(root) + "-outputs")  # the sink runs on the server on Connect
    stream.start(lambda d, _n: d.write.mode("append").json(out), trigger={"availableNow": True}).awaitTermination()
    stream.close()
    return spark.read.schema("user string, seen string").json(out).collect()


def _statestore(spark, location, name, **options):
    reader = spark.read.format("statestore").option("path", location).option("stateVarName", name)
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load().collect()


def test_read_state_matches_sparks_statestore_reader(spark, tmp_path):
    source, location, root = str(tmp_path / "in"), str(tmp_path / "spark"), str(tmp_path / "spate")
    files = _clicks()
    write_files(source, files)
    _run_spark(spark, source, location)
    _run_spate(spark, source, root, str(tmp_path / "local"), parallelism=3)

    value = read_state(spark, root, "count", key_schema="user string")
    assert value.schema.simpleString() == ("struct<key:struct<user:string>,user_key:string,value:struct<count:"
                                           "bigint,last:string>,key_group:int,expires_at_ms:bigint>")
    spark_values = _statestore(spark, location, "count")
    assert Counter((tuple(r.key), tuple(r.value)) for r in spark_values) == Counter(
        (tuple(r.key), tuple(r.value)) for r in value.collect())
    assert len(spark_values) == 7

    history = read_state(spark, root, "history", key_schema="user string").collect()
    assert Counter((tuple(r.key), tuple(r.list_element)) for r in _statestore(spark, location, "history")) == Counter(
        (tuple(r.key), tuple(r.value)) for r in history)
    in_order = {r.key.user: [tuple(e) for e in r.list_value]
                for r in _statestore(spark, location, "history", flattenCollectionTypes="false")}
    mine: dict = {}
    for r in sorted(history, key=lambda r: r.list_index):
        mine.setdefault(r.key.user, []).append(tuple(r.value))
    assert mine == in_order and all(r.expires_at_ms is None and r.user_key is None for r in history)

    pages = read_state(spark, root, "pages", key_schema="user string")
    assert Counter((tuple(r.key), tuple(r.user_map_key), tuple(r.user_map_value))
                   for r in _statestore(spark, location, "pages")) == Counter(
        (tuple(r.key), tuple(r.user_key), tuple(r.value)) for r in pages.collect())

    # both agree with the model, and key_group is Spark's pmod(hash(key), max parallelism)
    model = _model([r for f in files for r in f])
    assert {r.key.user: [list(r.value)] for r in value.collect()} == {u: [m[0]] for u, m in model.items()}
    assert pages.where(F.pmod(F.hash("key.user"), F.lit(128)) != F.col("key_group")).count() == 0
    assert pages.select(F.spark_partition_id()).distinct().count() == 3  # one Spark task per subtask


# -- TTL -------------------------------------------------------------------------------------------------

class TtlTracker(StatefulProcessor):
    def init(self, handle: StatefulProcessorHandle) -> None:
        self.count = handle.getValueState("count", "count long", ttlDurationMs=5_000)
        self.seen = handle.getListState("seen", "at long", ttlDurationMs=5_000)
        self.pages = handle.getMapState("pages", "page string", "at long", ttlDurationMs=5_000)

    def handleInputRows(self, key, rows, timerValues) -> Iterator[pd.DataFrame]:  # noqa: N802,N803
        now = timerValues.getCurrentProcessingTimeInMs()
        for frame in rows:
            for page in frame["page"]:
                self.count.update(((self.count.get()[0] if self.count.exists() else 0) + 1,))
                self.seen.appendValue((now,))
                self.pages.updateValue((page,), (now,))
        return iter(())

    def close(self) -> None:
        pass


def test_ttl_expiry_column(spark, tmp_path):
    """expires_at_ms is the last write + TTL (per list element and per map entry); expired items are left out
    as a restore leaves them out."""
    clock = [0]
    with LocalRunner(StatefulProcessorAdapter(TtlTracker(), "pandas", "ProcessingTime"), key="user",
                     checkpoint_root=str(tmp_path), clock=lambda: clock[0], parallelism=2) as runner:
        for n, (t, clicks) in enumerate([(0, [("a", "/x"), ("b", "/x")]), (3000, [("a", "/y")])]):
            clock[0] = t
            runner.run_batch(n, [{"user": u, "page": p} for u, p in clicks])

    def rows(name, now_ms):
        frame = read_state(spark, str(tmp_path), name, key_schema="user string", now_ms=now_ms)
        return sorted((r.key.user, r.user_key and tuple(r.user_key), tuple(r.value), r.expires_at_ms)
                      for r in frame.collect())

    assert rows("count", 4000) == [("a", None, (2,), 8000), ("b", None, (1,), 5000)]
    assert rows("count", 5000) == [("a", None, (2,), 8000)]
    assert rows("seen", 4000) == [("a", None, (0,), 5000), ("a", None, (3000,), 8000), ("b", None, (0,), 5000)]
    assert rows("seen", 6000) == [("a", None, (3000,), 8000)]
    assert rows("pages", 4000) == [("a", ("/x",), (0,), 5000), ("a", ("/y",), (3000,), 8000),
                                   ("b", ("/x",), (0,), 5000)]
    assert rows("pages", 8000) == []


class Windowed(Processor):
    """spate's own state in namespaces (as windows keep it): a sum per key and window of 10."""

    def open(self, ctx):
        self.sums = ctx.state(ValueStateDescriptor("sums", default=0))

    def process(self, key, rows, ctx):
        for r in rows:
            self.sums.set_namespace((r["n"] // 10 * 10, r["n"] // 10 * 10 + 10))  # (start, end)
            self.sums.update(self.sums.value() + r["n"])


def test_namespaces_and_composite_keys(spark, tmp_path):
    rows = [{"user": u, "day": d, "n": n} for u, d, n in [("a", 1, 3), ("a", 1, 14), ("a", 2, 5), ("b", 1, 7),
                                                            ("a", 1, 16)]]
    with LocalRunner(Windowed, key=["user", "day"], checkpoint_root=str(tmp_path), parallelism=2) as runner:
        runner.run_batch(0, rows)
    frame = read_state(spark, str(tmp_path), "sums")
    assert frame.columns == ["key", "user_key", "value", "key_group", "expires_at_ms", "namespace"]
    assert frame.schema["key"].dataType.simpleString() == "struct<_1:string,_2:bigint>"
    assert sorted((tuple(r.key), list(r.namespace), r.value) for r in frame.collect()) == [
        (("a", 1), [0, 10], 3), (("a", 1), [10, 20], 30), (("a", 2), [0, 10], 5), (("b", 1), [0, 10], 7)]


# -- errors ----------------------------------------------------------------------------------------------

class Count(Processor):
    def open(self, ctx):
        self.count = ctx.state(ValueStateDescriptor("views", default=0))

    def process(self, key, rows, ctx):
        self.count.update(self.count.value() + len(rows))


def test_errors_name_what_exists(spark, tmp_path):
    root, empty = str(tmp_path / "root"), tmp_path / "empty"
    empty.mkdir()
    with LocalRunner(Count, key="user", checkpoint_root=root) as runner:
        runner.run([[{"user": "a"}], [{"user": "b"}]])
    with pytest.raises(CheckpointError, match=r"no keyed state named 'clicks'; it has \['views'\]"):
        read_state(spark, root, "clicks")
    with pytest.raises(CheckpointError, match=r"checkpoint 7 does not exist .*complete: \[0, 1\]"):
        read_state(spark, root, "views", checkpoint_id=7)
    with pytest.raises(CheckpointError, match="empty is not a spate checkpoint root: .*no query ran there yet"):
        read_state(spark, str(empty), "views")
    with pytest.raises(CheckpointError, match="does not exist; check the path"):
        read_state(spark, str(tmp_path / "missing"), "views")
    with pytest.raises(ValueError, match="the values have no common type .*pass value_schema="):
        _mixed_values(spark, tmp_path)
    assert sorted(tuple(r) for r in read_state(spark, root, "views", checkpoint_id=0).select("key", "value")
                  .collect()) == [(("a",), 1)]


def _mixed_values(spark, tmp_path):
    class Mixed(Processor):
        def open(self, ctx):
            self.v = ctx.state(ValueStateDescriptor("v"))

        def process(self, key, rows, ctx):
            self.v.update({"n": 1} if key == "a" else 1)

    root = str(tmp_path / "mixed")
    with LocalRunner(Mixed, key="user", checkpoint_root=root) as runner:
        runner.run([[{"user": "a"}, {"user": "b"}]])
    return read_state(spark, root, "v")


def test_bootstrap_needs_handle_initial_state(spark, tmp_path):
    class NoInitial(StatefulProcessor):
        def init(self, handle):
            pass

        def handleInputRows(self, key, rows, timerValues):  # noqa: N802,N803
            return iter(())

        def close(self):
            pass

    df = spark.createDataFrame([("a", "/x", 1)], INPUT)
    with pytest.raises(ValueError, match="NoInitial does not implement handleInitialState"):
        write_savepoint(df, "user", str(tmp_path / "sp"), NoInitial())


def test_bootstrap_refuses_a_directory_holding_other_files(spark, tmp_path):
    target = tmp_path / "mine"
    target.mkdir()
    (target / "notes.txt").write_text("the user's")
    with pytest.raises(CheckpointError, match=r"is not empty \(it holds \['notes.txt'\]\)"):
        write_savepoint(spark.createDataFrame([("a", "/x", 1)], INPUT), "user", str(target), Bootstrap())
    assert sorted(p.name for p in target.iterdir()) == ["notes.txt"], "nothing written or deleted"


# -- savepoints bootstrapped from a DataFrame ------------------------------------------------------------

class Bootstrap(Processor):
    """spate's own states from each key's rows: a dict value, a list and a map."""

    def open(self, ctx):
        self.total = ctx.state(ValueStateDescriptor("total"))
        self.amounts = ctx.state(ListStateDescriptor("amounts"))
        self.pages = ctx.state(MapStateDescriptor("pages"))

    def process(self, key, rows, ctx):
        self.total.update({"rows": len(rows), "sum": sum(r["n"] for r in rows)})
        self.amounts.add_all([r["n"] for r in rows])
        for r in rows:
            self.pages.put(r["page"], self.pages.get(r["page"], 0) + 1)
        yield {"ignored": True}  # a bootstrap's outputs are dropped


class Report(Bootstrap):
    """The same states read back, as one row per key."""

    def process(self, key, rows, ctx):
        yield {"user": key, "seen": json.dumps([self.total.value(), self.amounts.get(), sorted(self.pages.items())])}


def test_bootstrap_spate_states_restored_at_other_parallelisms(spark, tmp_path):
    rows = [r for f in _clicks() for r in f]
    target = str(tmp_path / "sp")
    meta = write_savepoint(spark.createDataFrame(rows, INPUT).orderBy("n"), "user", target, Bootstrap(),
                           parallelism=2, max_parallelism=64)
    assert (meta.parallelism, meta.max_parallelism, meta.is_savepoint) == (2, 64, True)
    assert [p.name for p in (tmp_path / "sp").iterdir() if p.name.startswith("_bootstrap")] == []
    want = {}
    for u, (count, history, pages) in _model(rows).items():
        want[u] = [{"rows": count[0], "sum": sum(history)}, sorted(history), pages]

    total = read_state(spark, target, "total", key_schema="user string")
    assert total.schema["value"].dataType.simpleString() == "struct<rows:bigint,sum:bigint>"
    assert {r.key.user: r.value.asDict() for r in total.collect()} == {u: w[0] for u, w in want.items()}
    amounts = Counter((r.key.user, r.value) for r in read_state(spark, target, "amounts", key_schema="user string")
                      .collect())
    assert amounts == Counter((u, n) for u, w in want.items() for n in w[1])
    assert sorted((r.key._1, r.user_key, r.value) for r in read_state(spark, target, "pages").collect()) == sorted(
        (u, p, c) for u, w in want.items() for p, c in w[2])

    for p in (3, 1):  # restored at other parallelisms, every key sees exactly what was bootstrapped
        with LocalRunner(Report, key="user", checkpoint_root=str(tmp_path / f"run{p}"), parallelism=p,
                         restore_from=target) as runner:
            out = runner.run_batch(0, [{"user": u} for u in [*want, "new"]]).outputs
        seen = {o["user"]: json.loads(o["seen"]) for o in out}
        assert {u: [s[0], sorted(s[1]), s[2]] for u, s in seen.items()} == {
            **want, "new": [None, [], []]}, p


def test_bootstrap_stateful_processor_restored_by_spark_and_locally(spark, tmp_path):
    """A StatefulProcessor's handleInitialState bootstraps its states (schemas recorded, values encoded as the
    adapter does); a transform_with_state query at parallelism 3 and a LocalRunner at 1 see them."""
    initial = [r for f in _clicks() for r in f]
    target = str(tmp_path / "sp")
    write_savepoint(spark.createDataFrame(initial, INPUT).repartition(1).orderBy("n"), "user", target, Tracker(),
                    parallelism=2)
    model = _model(initial)
    count = read_state(spark, target, "count", key_schema="user string")
    assert count.schema["value"].dataType.simpleString() == "struct<count:bigint,last:string>"
    assert {r.key.user: list(r.value) for r in count.collect()} == {u: m[0] for u, m in model.items()}
    pages = read_state(spark, target, "pages", key_schema="user string").collect()
    assert sorted((r.key.user, r.user_key.page, r.value.clicks) for r in pages) == sorted(
        (u, p, c) for u, m in model.items() for p, c in m[2])

    source = str(tmp_path / "in")
    probe = [{"user": u, "page": "/probe", "n": -1} for u in [*model, "new"]]
    write_files(source, [probe])
    want = {u: [m[0], sorted(m[1]), m[2]] for u, m in model.items()} | {"new": [None, [], []]}
    outputs = _run_spate(spark, source, str(tmp_path / "spark-run"), str(tmp_path / "local"), parallelism=3,
                         restore_from=target)
    seen = {r.user: json.loads(r.seen) for r in outputs}
    assert {u: [s[0], sorted(s[1]), s[2]] for u, s in seen.items()} == want
    with LocalRunner(StatefulProcessorAdapter(Tracker()), key="user", checkpoint_root=str(tmp_path / "local-run"),
                     parallelism=1, restore_from=target) as runner:
        out = runner.run_batch(0, probe).outputs
    seen = {o["user"]: json.loads(o["seen"]) for o in out}
    assert {u: [s[0], sorted(s[1]), s[2]] for u, s in seen.items()} == want


def test_readme_state_frame_example_runs(spark, example_form, capsys):
    run_block(example_form(python_block("write_savepoint(")), "readme_state_frame_example")
    assert capsys.readouterr().out.splitlines() == ["[('ann', 15, None), ('bob', 3, None)]"]
