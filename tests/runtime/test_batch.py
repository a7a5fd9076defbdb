"""The columnar hot path: a batch grouped by key with Arrow equals the same rows grouped in Python; per-key
processors see row views that behave like lists; ``BatchProcessor`` with bulk state equals a per-key processor
and a plain model, through restores at other parallelisms and crashes; outputs staged as Arrow."""

from __future__ import annotations

import math
import sys

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark import cloudpickle

from helpers.rescaling import COUNT_SCHEMA, run_rescaling
from spate import (
    ListStateDescriptor,
    LocalRunner,
    Processor,
    ReducingStateDescriptor,
    ValueStateDescriptor,
    keyed_state_entries,
    load_checkpoint,
)
from spate.checkpoint.inspect import keyed_state_names
from spate.errors import OutputError
from spate.frames import FrameKind, read_single_frame
from spate.fs import CheckpointStorage
from spate.keygroups import compile_key_hasher
from spate.runtime.batch import BatchProcessor, KeyedBatch, KeyRows
from spate_tools.campaigns.fuzz import checkpointed

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # executors cannot import test modules

COUNT: ValueStateDescriptor[int] = ValueStateDescriptor("count", default=0)


def _state(root: str) -> dict:
    storage = CheckpointStorage(root)
    return checkpointed(storage, load_checkpoint(storage), "count", 0)


def _groups_of(batch: KeyedBatch) -> dict:
    """key -> (key group, rows as sorted tuples); NaN keys mapped to a marker (NaN != NaN)."""
    out = {}
    for i, key in enumerate(batch.keys):
        marker = "NaN" if isinstance(key, float) and math.isnan(key) else key
        assert marker not in out, f"key {key!r} grouped twice"
        rows = sorted(tuple(sorted((k, repr(v)) for k, v in r.items())) for r in batch.rows_of(i))
        out[marker] = (batch.key_groups[i], rows)
    return out


KEYS = st.one_of(st.text(max_size=3), st.none(), st.sampled_from([0.0, -0.0, 1.5, float("nan")]))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(KEYS, st.integers(0, 3)), max_size=40), st.booleans())
def test_arrow_grouping_equals_python_grouping(rows, float_keys):
    """Sorting and splitting with Arrow groups exactly as a dict per key does, with Spark's float rules
    (-0.0 is 0.0, one NaN) and null keys."""
    keys = [k for k, _ in rows if isinstance(k, float) == float_keys or k is None]
    typed = pa.float64() if float_keys else pa.string()
    hash_key = compile_key_hasher()
    triples = []
    for i, key in enumerate(keys):
        kg = hash_key(0.0 if key == 0.0 and float_keys else key) % 16 if key is not None else 7
        if float_keys and key is not None and math.isnan(key):
            kg = 3
        triples.append((kg, key, {"k": key, "v": i}))
    table = pa.table({"k": pa.array([k for _, k, _ in triples], typed),
                      "v": pa.array([r["v"] for _, _, r in triples], pa.int64()),
                      "kg": pa.array([kg for kg, _, _ in triples], pa.int32())})
    arrow = KeyedBatch.from_arrow(table, ["k"], "kg")
    python = KeyedBatch.from_rows(triples)
    assert arrow.num_rows == python.num_rows == len(triples)
    assert arrow.table.column_names == ["k", "v"]
    if float_keys:  # rows keep their values; only the key is normalized
        assert _groups_of(arrow).keys() == _groups_of(python).keys()
    else:
        assert _groups_of(arrow) == _groups_of(python)
    assert list(arrow.counts) == [len(arrow.rows_of(i)) for i in range(len(arrow))]


def test_multi_column_keys_group_by_every_column():
    table = pa.table({"a": ["x", "x", "y", "x"], "b": [1, 2, 1, 1], "kg": [1, 1, 1, 1]})
    batch = KeyedBatch.from_arrow(table, ["a", "b"], "kg")
    assert batch.keys == [("x", 1), ("x", 2), ("y", 1)]
    assert list(batch.counts) == [2, 1, 1]


def test_key_rows_behave_like_the_list_of_rows():
    table = pa.table({"k": ["a", "a", "b"], "v": [1, 2, 3], "kg": [0, 0, 0]})
    batch = KeyedBatch.from_arrow(table, ["k"], "kg")
    rows = batch.rows_of(0)
    assert isinstance(rows, KeyRows) and len(rows) == 2
    assert rows.column("v").to_pylist() == [1, 2]
    assert rows == [{"k": "a", "v": 1}, {"k": "a", "v": 2}]
    assert rows[-1] == {"k": "a", "v": 2} and rows[:1] == [{"k": "a", "v": 1}]
    assert [r["v"] for r in rows] == [1, 2] and sorted(rows, key=lambda r: -r["v"])[0]["v"] == 2
    assert rows + [{"k": "z"}] == [{"k": "a", "v": 1}, {"k": "a", "v": 2}, {"k": "z"}]
    rows[0]["v"] = 10  # a processor may change its rows; they stay changed during the call
    assert rows[0]["v"] == 10 and len(rows) == 2
    assert batch.rows_of(1) == [{"k": "b", "v": 3}]


def test_the_adapter_hands_a_key_its_rows_as_spark_does():
    """pandas: one DataFrame of the key's rows with a fresh index, changeable without touching other keys';
    Row flavour: Rows with the stream's fields."""
    from spate.spark.adapter import _pandas_rows, _spark_rows

    table = pa.table({"k": ["a", "b", "b"], "v": [1, 2, 3], "kg": [0, 0, 0]})
    batch = KeyedBatch.from_arrow(table, ["k"], "kg")
    frame = _pandas_rows(batch.rows_of(1))
    assert frame.to_dict("list") == {"k": ["b", "b"], "v": [2, 3]} and list(frame.index) == [0, 1]
    frame["v"] = frame["v"] * 10
    assert _pandas_rows(batch.rows_of(1))["v"].tolist() == [2, 3]
    assert [r.asDict() for r in _spark_rows(batch.rows_of(1))] == [{"k": "b", "v": 2}, {"k": "b", "v": 3}]


# -- BatchProcessor ----------------------------------------------------------------------------------------

class BatchCount(BatchProcessor):
    def open(self, ctx):
        self.count = ctx.bulk_state(COUNT)

    def process_batch(self, batch, ctx):
        new = np.asarray(self.count.get_many(batch), dtype=np.int64) + batch.counts
        self.count.put_many(batch, new)
        return {"k": batch.keys, "count": new}


class RowCount(Processor):
    def open(self, ctx):
        self.count = ctx.state(COUNT)

    def process(self, key, rows, ctx):
        n = self.count.value() + len(rows)
        self.count.update(n)
        yield {"k": key, "count": n}


@settings(max_examples=12, deadline=None)
@given(st.lists(st.lists(st.sampled_from("abcdefghij"), max_size=12), min_size=1, max_size=6),
       st.lists(st.integers(1, 4), min_size=3, max_size=3), st.booleans(), st.integers(0, 6))
def test_batch_processor_equals_a_model_through_rescales_and_crashes(tmp_path_factory, keys, ps, lmdb, crash):
    batches = [[{"k": k} for k in b] for b in keys]
    model: dict[str, int] = {}
    expected = {}
    for n, b in enumerate(keys):
        for k in b:
            model[k] = model.get(k, 0) + 1
        expected[n] = sorted((k, model[k]) for k in set(b))
    root = str(tmp_path_factory.mktemp("batch"))
    kw = dict(table="lmdb" if lmdb else "heap", changelog=lmdb, file_merging="across" if lmdb else False)
    got = run_rescaling(BatchCount, root, batches, [(0, ps[0]), (2, ps[1]), (4, ps[2])], crash_at=crash, **kw)
    assert got == expected
    assert _state(root) == model


LOG: ListStateDescriptor[int] = ListStateDescriptor("log")


class BulkLog(BatchProcessor):
    """Each key's list gets the batch id once per row; a list longer than 4 is cut to its last 2."""

    def open(self, ctx):
        self.log = ctx.bulk_state(LOG)

    def process_batch(self, batch, ctx):
        self.log.add_many(batch, [[ctx.batch_id] * int(c) for c in batch.counts])
        lists = self.log.get_many(batch)
        long = [i for i, values in enumerate(lists) if len(values) > 4]
        if long:  # by plain keys (their key groups computed by the state), not the batch
            self.log.update_many([batch.keys[i] for i in long], [lists[i][-2:] for i in long])
            for i in long:
                lists[i] = lists[i][-2:]
        return {"k": batch.keys, "count": [len(values) for values in lists]}


class RowLog(Processor):
    def open(self, ctx):
        self.log = ctx.state(LOG)

    def process(self, key, rows, ctx):
        self.log.add_all([ctx.batch_id] * len(rows))
        values = self.log.get()
        if len(values) > 4:
            values = values[-2:]
            self.log.update(values)
        yield {"k": key, "count": len(values)}


def _lists(root: str) -> dict:
    storage = CheckpointStorage(root)
    meta = load_checkpoint(storage)
    if "log" not in keyed_state_names(meta):  # no key ever had a list
        return {}
    return {e.key: e.value for e in keyed_state_entries(storage, meta, "log")}


@settings(max_examples=12, deadline=None)
@given(st.lists(st.lists(st.sampled_from("abcdefg"), max_size=10), min_size=1, max_size=6),
       st.lists(st.integers(1, 4), min_size=3, max_size=3), st.booleans(), st.integers(0, 6), st.booleans())
def test_bulk_list_state_equals_a_model_through_rescales_and_crashes(tmp_path_factory, keys, ps, lmdb, crash,
                                                                       per_key_after):
    """Bulk list state against a model; with ``per_key_after`` the last batches run the per-key twin on the
    same state."""
    batches = [[{"k": k} for k in b] for b in keys]
    model: dict[str, list[int]] = {}
    expected = {}
    for n, b in enumerate(keys):
        for k in b:
            model.setdefault(k, []).append(n)
        for k in set(b):
            if len(model[k]) > 4:
                model[k] = model[k][-2:]
        expected[n] = sorted((k, len(model[k])) for k in set(b))
    root = str(tmp_path_factory.mktemp("bulklist"))
    kw = dict(table="lmdb" if lmdb else "heap", changelog=lmdb, file_merging="across" if lmdb else False)
    split = len(batches) // 2 if per_key_after else len(batches)
    got = run_rescaling(BulkLog, root, batches[:split], [(0, ps[0]), (2, ps[1]), (4, ps[2])], crash_at=crash, **kw)
    if split < len(batches):
        got |= run_rescaling(RowLog, root, batches, [(0, ps[2])], **kw)
    assert got == expected
    assert _lists(root) == {k: v for k, v in model.items() if v}


def test_bulk_list_state_refuses_what_is_not_a_list_per_key(tmp_path):
    problems = []

    class Bad(BatchProcessor):
        def open(self, ctx):
            self.log = ctx.bulk_state(LOG)

        def process_batch(self, batch, ctx):
            for lists in (["ab"], [[1], [2]], [3]):
                with pytest.raises((TypeError, ValueError)) as e:
                    self.log.add_many(["a"], lists)
                problems.append(str(e.value))
            self.log.add_many(["a"], [[]])
            problems.append(self.log.get_many(["a"]))
            self.log.update_many(["b", "b"], [[1], []])  # a key given twice: in order, the last one wins
            self.log.update_many(["c", "c"], [[], [2]])
            problems.append(self.log.get_many(["b", "c"]))
            return None

    with LocalRunner(Bad, key="k", checkpoint_root=str(tmp_path / "c")) as runner:
        runner.run_batch(0, [{"k": "a"}])
    assert problems[0] == "add_many on state 'log': each key's elements must be a list, got 'ab'"
    assert problems[1] == "add_many on state 'log': 2 lists for 1 keys"
    assert "each key's elements must be a list, got 3" in problems[2] and problems[3] == [[]]
    assert problems[4] == [[], [2]]


def test_the_two_apis_share_state_and_outputs(tmp_path):
    batches = [[{"k": "a"}, {"k": "b"}, {"k": "a"}], [{"k": "a"}], [{"k": "b"}, {"k": "c"}]]
    root = str(tmp_path / "c")
    first = run_rescaling(BatchCount, root, batches[:2], [(0, 2)], table="lmdb", changelog=True)
    rest = run_rescaling(RowCount, root, batches, [(0, 3)], table="lmdb", changelog=True)
    assert first == {0: [("a", 2), ("b", 1)], 1: [("a", 3)]}
    assert rest == {2: [("b", 2), ("c", 1)]}


class WrongColumns(BatchProcessor):
    def __init__(self, columns):
        self.columns = columns

    def process_batch(self, batch, ctx):
        return self.columns(batch)


@pytest.mark.parametrize("columns, problem", [
    (lambda b: {"k": b.keys}, "no column 'count'"),
    (lambda b: {"k": b.keys, "count": b.counts, "x": b.counts}, "column 'x', which is not in the output schema"),
    (lambda b: {"k": b.keys, "count": [0.5] * len(b)}, "column 'count' with values"),
    (lambda b: {"k": b.keys, "count": ["1"] * len(b)}, "column 'count' of type string"),
    (lambda b: [{"k": "a", "count": 1}], "returned list, not columns"),
])
def test_batch_processor_outputs_are_checked_against_the_schema(tmp_path, columns, problem):
    with LocalRunner(WrongColumns(columns), key="k", checkpoint_root=str(tmp_path / "c"), output_schema=COUNT_SCHEMA,
                     sink=lambda rows, n: None) as runner:
        with pytest.raises(OutputError, match=problem):
            runner.run_batch(0, [{"k": "a"}])
        assert runner.coordinator.latest is None  # the batch failed before its checkpoint


def test_bulk_state_reads_defaults_clears_with_none_and_refuses_foreign_keys(tmp_path):
    seen = {}

    class Bulk(BatchProcessor):
        def open(self, ctx):
            self.count = ctx.bulk_state(COUNT)

        def process_batch(self, batch, ctx):
            seen["before"] = self.count.get_many(["a", "zz"])
            self.count.put_many(["a", "zz"], [5, None])
            seen["after"] = self.count.get_many(["a", "zz"])
            with pytest.raises(TypeError, match=r"value, list and map state; 'r' is ReducingStateDescriptor: use"):
                ctx.bulk_state(ReducingStateDescriptor("r", max))
            return None

    with LocalRunner(Bulk, key="k", checkpoint_root=str(tmp_path / "c"), parallelism=1) as runner:
        runner.run_batch(0, [{"k": "a"}])
    assert seen == {"before": [0, 0], "after": [5, 0]}
    assert _state(str(tmp_path / "c")) == {"a": 5}


def test_outputs_with_a_schema_are_staged_as_arrow_and_read_back_exactly(tmp_path):
    delivered = []
    root = str(tmp_path / "c")
    with LocalRunner(RowCount, key="k", checkpoint_root=root, output_schema=COUNT_SCHEMA,
                     sink=lambda rows, n: delivered.append(sorted((r["k"], r["count"]) for r in rows))) as runner:
        runner.run_batch(0, [{"k": "a"}, {"k": "a"}, {"k": "b"}])
        meta = runner.coordinator.latest
        assert {st.outputs.serializer for st in meta.subtasks if st.outputs} == {"arrow"}
        staged = sorted((r["k"], r["count"]) for r in runner.coordinator.staged_outputs(meta, False))
        handle = next(st.outputs for st in meta.subtasks if st.outputs)
    assert delivered == [[("a", 2), ("b", 1)]] and staged == [("a", 2), ("b", 1)]
    # as docs/formats.md says: one STAGED_OUTPUTS frame holding an Arrow IPC stream of the output schema
    data = CheckpointStorage(root).read_range(handle.path, handle.file_offset, handle.size, "test")
    with pa.ipc.open_stream(read_single_frame(data, "staged", FrameKind.STAGED_OUTPUTS)) as reader:
        table = reader.read_all()
    assert table.schema == COUNT_SCHEMA and table.num_rows == handle.count


# -- on Spark ----------------------------------------------------------------------------------------------

def _spark_counts(spark, source, root, processor, parallelism):
    from spate.spark.stream import StatefulStream

    df = spark.readStream.schema("k string, v long").option("maxFilesPerTrigger", 1).json(source)
    stream = StatefulStream(df, "k", processor, "k string, count long", checkpoint_root=root,
                            parallelism=parallelism)
    out: dict[int, list] = {}
    query = stream.start(lambda rows, n: out.setdefault(n, sorted(tuple(r) for r in rows.collect())),
                         trigger={"availableNow": True})
    try:
        query.awaitTermination(300)
    finally:
        query.stop()
        stream.close()
    return out


@pytest.mark.spark
def test_on_spark_the_batch_api_and_the_per_key_api_give_the_same_outputs_and_state(spark, tmp_path):
    """Arrow-grouped batches on Spark: BatchProcessor and Processor agree with each other and with a model,
    and the batch processor's state restores into the per-key one at another parallelism."""
    import json
    import os

    keys = [[f"u{(b * 7 + i * 3) % 11}" for i in range(15)] for b in range(4)]
    source = str(tmp_path / "in")
    os.makedirs(source)
    for b, ks in enumerate(keys):
        path = os.path.join(source, f"part-{b:05d}.json")
        with open(path, "w") as f:
            f.write("\n".join(json.dumps({"k": k, "v": 1}) for k in ks))
        os.utime(path, (1_700_000_000 + b, 1_700_000_000 + b))
    model: dict[str, int] = {}
    expected = {}
    for b, ks in enumerate(keys):
        for k in ks:
            model[k] = model.get(k, 0) + 1
        expected[b] = sorted((k, model[k]) for k in set(ks))
    assert _spark_counts(spark, source, str(tmp_path / "batch"), BatchCount, 3) == expected
    assert _spark_counts(spark, source, str(tmp_path / "rows"), RowCount, 2) == expected
    assert _state(str(tmp_path / "batch")) == _state(str(tmp_path / "rows")) == model


# -- the StatefulProcessor adapter's outputs, as columns ------------------------------------------------

class PandasCounter:
    """A transformWithStateInPandas-style processor (duck-typed: the adapter needs no pyspark base class)."""

    def __init__(self, column="count"):
        self.column = column

    def init(self, handle):
        self.count = handle.getValueState("count", "count long")

    def handleInputRows(self, key, rows, timer_values):  # noqa: N802
        import pandas as pd

        n = (self.count.get()[0] if self.count.exists() else 0) + sum(len(df) for df in rows)
        self.count.update((n,))
        yield pd.DataFrame({"k": [key[0]], self.column: [n]})

    def close(self):
        pass


def test_adapter_outputs_go_to_arrow_as_columns_and_a_wrong_column_names_its_key(tmp_path):
    from spate.spark.adapter import StatefulProcessorAdapter

    root = str(tmp_path / "c")
    with LocalRunner(StatefulProcessorAdapter(PandasCounter()), key="k", checkpoint_root=root, parallelism=2,
                     output_schema=COUNT_SCHEMA) as runner:
        result = runner.run_batch(0, [{"k": "a"}, {"k": "b"}, {"k": "a"}])
    assert sorted((r["k"], r["count"]) for r in result.outputs) == [("a", 2), ("b", 1)]
    wrong = StatefulProcessorAdapter(PandasCounter("total"))
    problem = r"PandasCounter.process for key 'a' produced field 'total', which is not in the output schema"
    with LocalRunner(wrong, key="k", checkpoint_root=str(tmp_path / "d"), output_schema=COUNT_SCHEMA) as runner, \
            pytest.raises(OutputError, match=problem):
        runner.run_batch(0, [{"k": "a"}])


class _OverwriteAll(BatchProcessor):
    """Puts every key of the batch in bulk, even when the batch has no keys."""

    def open(self, ctx):
        self.value = ctx.bulk_state(ValueStateDescriptor("v"))

    def process_batch(self, batch, ctx):
        self.value.put_many(batch, [ctx.batch_id] * len(batch))


@pytest.mark.parametrize("table", ["heap", "lmdb"])
def test_an_empty_bulk_write_leaves_the_snapshot_to_reuse(tmp_path, table):
    """A batch without keys writes nothing: its checkpoint names the base's keyed files again, also right after
    a restore (where the full variant would otherwise write the whole state once more)."""
    root = str(tmp_path / "c")
    opts = {"key": "k", "checkpoint_root": root, "table": table, "local_dir": str(tmp_path / "l1")}
    with LocalRunner(_OverwriteAll, **opts) as runner:
        runner.run_batch(0, [{"k": i} for i in range(50)])
        assert runner.run_batch(1, []).checkpoint.subtasks[0].stats["snapshot_reused"]
    with LocalRunner(_OverwriteAll, **{**opts, "local_dir": str(tmp_path / "l2")}) as runner:
        st = runner.run_batch(2, []).checkpoint.subtasks[0]
        assert st.recovery == "restored" and st.stats["snapshot_reused"]
        st = runner.run_batch(3, [{"k": 1}]).checkpoint.subtasks[0]
        assert not st.stats["snapshot_reused"]
