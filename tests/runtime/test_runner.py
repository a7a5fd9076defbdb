"""LocalRunner behaviour: event time and watermarks across restarts, union and broadcast state through a
rescale, local lmdb reuse, key columns and processor forms."""

from __future__ import annotations

import os

import pytest

from spate import LocalRunner, Processor, ValueStateDescriptor, load_checkpoint
from spate.fs import CheckpointStorage


class Sessions(Processor):
    """Emits a key's click count when the watermark passes its last click + 10 ms."""

    def open(self, ctx):
        self.count = ctx.state(ValueStateDescriptor("count", default=0))
        self.last = ctx.state(ValueStateDescriptor("last"))

    def process(self, key, rows, ctx):
        self.count.update(self.count.value() + len(rows))
        if self.last.value() is not None:
            ctx.delete_event_time_timer(self.last.value() + 10)
        self.last.update(max(r["ts"] for r in rows))
        ctx.register_event_time_timer(self.last.value() + 10)
        return None

    def on_timer(self, key, timestamp_ms, ctx):
        assert ctx.timer_domain == "event" and ctx.watermark_ms >= timestamp_ms
        yield {"key": key, "count": self.count.value(), "at": timestamp_ms}
        self.count.clear()
        self.last.clear()


def test_event_time_timers_fire_when_the_watermark_passes_them_across_restarts(tmp_path):
    root = str(tmp_path / "c")
    src = [[{"k": "a", "ts": 100}, {"k": "b", "ts": 101}], [{"k": "a", "ts": 105}], [{"k": "c", "ts": 130}],
           [{"k": "c", "ts": 131}], [{"k": "z", "ts": 200}], [{"k": "z", "ts": 201}]]
    out: dict[int, list] = {}

    def sink(rows, batch_id):
        out[batch_id] = sorted(rows, key=lambda r: r["key"])

    kw = dict(key="k", checkpoint_root=root, event_time_column="ts", watermark_delay_ms=5, sink=sink)
    with LocalRunner(Sessions, parallelism=2, **kw) as r:
        r.run(src, until=3)
    assert load_checkpoint(CheckpointStorage(root)).watermark_ms == 125
    with LocalRunner(Sessions, parallelism=3, table="lmdb", **kw) as r:
        r.run(src)
    # the watermark used by batch n is computed from batches < n (as in Spark)
    assert out[2] == []  # watermark 100 after batch 1... a's timer is at 115
    assert out[3] == [{"key": "a", "count": 2, "at": 115}, {"key": "b", "count": 1, "at": 111}]
    assert out[5] == [{"key": "c", "count": 2, "at": 141}]
    assert load_checkpoint(CheckpointStorage(root)).watermark_ms == 196


class Rules(Processor):
    def open(self, ctx):
        self.rules = ctx.get_broadcast_state("rules")
        self.seen = ctx.get_union_list_state("seen-subtasks")
        self.restored_union = self.seen.get()

    def process(self, key, rows, ctx):
        return [{"key": key, "rule": self.rules.get("threshold"), "union": sorted(map(tuple, self.restored_union))}]

    def end_batch(self, ctx):
        if ctx.batch_id == 0:
            self.rules.put("threshold", 7)
        self.seen.update([(ctx.subtask_index, ctx.parallelism)])


def test_union_and_broadcast_state_through_a_rescale(tmp_path):
    root = str(tmp_path / "c")
    src = [[{"k": i} for i in range(20)]] * 3
    with LocalRunner(Rules, key="k", checkpoint_root=root, parallelism=2) as r:
        r.run(src, until=1)
    with LocalRunner(Rules, key="k", checkpoint_root=root, parallelism=4) as r:
        (res,) = r.run(src, until=2)
    assert {row["rule"] for row in res.outputs} == {7}, "every subtask got a copy of the broadcast state"
    assert {tuple(map(tuple, row["union"])) for row in res.outputs} == {((0, 2), (1, 2))}, "union to all"


def test_lmdb_state_is_reused_locally_after_a_clean_stop(tmp_path):
    root, local = str(tmp_path / "c"), str(tmp_path / "local")
    src = [[{"k": i % 5} for i in range(50)]] * 4

    class Count(Processor):
        def open(self, ctx):
            self.c = ctx.state(ValueStateDescriptor("c", default=0))

        def process(self, key, rows, ctx):
            self.c.update(self.c.value() + len(rows))
            yield {"k": key, "c": self.c.value()}

    with LocalRunner(Count, key="k", checkpoint_root=root, parallelism=2, table="lmdb", local_dir=local) as r:
        r.run(src, until=2)
    with LocalRunner(Count, key="k", checkpoint_root=root, parallelism=2, table="lmdb", local_dir=local) as r:
        (res,) = r.run(src, until=3)
        assert res.restored_subtasks == [], "same parallelism and local dir: nothing downloaded"
        (res4,) = r.run(src)
    assert sorted(o["c"] for o in res4.outputs) == [40] * 5
    with LocalRunner(Count, key="k", checkpoint_root=root, parallelism=3, table="lmdb", local_dir=local) as r:
        query_dir = os.path.join(local, r.coordinator.query.query_id)
        assert sorted(os.listdir(query_dir)) == [], "directories of parallelism 2 are removed"


@pytest.mark.parametrize("key", [("a", "b"), lambda row: (row["a"], row["b"])])
def test_multi_column_keys_and_processor_forms(tmp_path, key):
    class Count(Processor):
        def __init__(self, start=0):
            self.start = start

        def open(self, ctx):
            self.c = ctx.state(ValueStateDescriptor("c", default=self.start))

        def process(self, k, rows, ctx):
            self.c.update(self.c.value() + len(rows))
            yield {"k": k, "c": self.c.value()}

    src = [[{"a": 1, "b": "x"}, {"a": 1, "b": "y"}, {"a": 1, "b": "x"}]]
    for proc in (Count, Count(100), lambda: Count(1000)):
        with LocalRunner(proc, key=key, checkpoint_root=str(tmp_path / repr(id(proc))), parallelism=2) as r:
            (res,) = r.run(src)
        base = 0 if proc is Count else 100 if isinstance(proc, Count) else 1000
        assert sorted((o["k"], o["c"]) for o in res.outputs) == [((1, "x"), base + 2), ((1, "y"), base + 1)]


def test_bad_settings_are_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="unknown state table"):
        LocalRunner(Sessions, key="k", checkpoint_root=str(tmp_path / "a"), table="rocks")
    with pytest.raises(ValueError, match="parallelism must be >= 1"):
        LocalRunner(Sessions, key="k", checkpoint_root=str(tmp_path / "b"), parallelism=0)
    with pytest.raises(TypeError, match="processor must be"):
        LocalRunner(42, key="k", checkpoint_root=str(tmp_path / "c"))  # type: ignore[arg-type]


def test_initial_state_goes_to_the_first_batch_of_a_new_query_only(tmp_path):
    from spate import Processor, ValueStateDescriptor

    class Counts(Processor):
        def open(self, ctx):
            self.count = ctx.state(ValueStateDescriptor("count", default=0))

        def process_initial(self, key, rows, ctx):
            self.count.update(self.count.value() + sum(r["start"] for r in rows))

        def process(self, key, rows, ctx):
            self.count.update(self.count.value() + len(rows))
            yield {"user": key, "count": self.count.value()}

    initial = [{"user": "a", "start": 10}, {"user": "a", "start": 5}, {"user": "b", "start": 100}]
    root = str(tmp_path / "root")
    with LocalRunner(Counts(), key="user", checkpoint_root=root, parallelism=2, initial_state=initial) as r:
        first = sorted((o["user"], o["count"]) for o in r.run_batch(0, [{"user": "a"}, {"user": "c"}]).outputs)
    with LocalRunner(Counts(), key="user", checkpoint_root=root, parallelism=3, initial_state=initial) as r:
        again = sorted((o["user"], o["count"]) for o in r.run_batch(1, [{"user": "a"}, {"user": "b"}]).outputs)
    assert first == [("a", 16), ("c", 1)]
    assert again == [("a", 17), ("b", 101)], "a restart (here at another parallelism) does not apply it again"


def test_an_initial_state_for_a_processor_without_process_initial_is_a_clear_error(tmp_path):
    from spate import Processor

    class Plain(Processor):
        def process(self, key, rows, ctx):
            yield {"user": key}

    root = str(tmp_path / "root")
    with LocalRunner(Plain(), key="user", checkpoint_root=root, initial_state=[{"user": "a"}]) as r:
        with pytest.raises(ValueError, match="does not override process_initial.*or drop initial_state"):
            r.run_batch(0, [{"user": "a"}])
        assert r.next_batch_id == 0, "nothing of the failed batch was committed"
    with LocalRunner(Plain(), key="user", checkpoint_root=root) as r:
        assert [o["user"] for o in r.run_batch(0, [{"user": "a"}]).outputs] == ["a"]
