"""Coalescing beyond Flink: an entry created and removed within one change set leaves no record in the
changelog (a window created, updated and purged between two uploads costs nothing), an entry that outlives an
upload keeps its tombstone, and replay always rebuilds exactly the live state: random operations on value,
list, map state and timers in a few keys and namespaces, with uploads, materializations and restores (also at
another parallelism), against a plain dict model."""

from __future__ import annotations

import copy
import os
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spate import LocalRunner, Processor, keyed_state_entries, load_checkpoint
from spate.changelog.changeset import DELETE, MAP_DELETE, ChangeSet
from spate.changelog.format import read_change_set
from spate.changelog.restore import restore_keyed_state
from spate.changelog.state import ChangelogConfig, ChangelogKeyedState
from spate.changelog.upload import UploadConfig
from spate.checkpoint.inspect import keyed_state_names
from spate.fs import CheckpointStorage
from spate.state.bulk import BulkValueState
from spate.state.descriptors import (
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    ValueStateDescriptor,
)
from spate.state.heap import HeapTable
from spate.state.keyed import KeyedStateBackend
from spate.state.lmdb_table import LmdbTable
from spate.state.table import StateTable
from spate.state.timers import EVENT_TIME

NOW = UploadConfig(persist_delay_s=0.0, timeout_s=5.0)
VALUE, LIST, MAP = ValueStateDescriptor("v"), ListStateDescriptor("l"), MapStateDescriptor("m")
KEYS, NAMESPACES, USER_KEYS = ["a", 7], [None, "w"], [0, 1]

# -- the model: (state, key, namespace) -> value / list / dict / set of timer timestamps -----------------------
Model = dict[tuple[str, Any, Any], Any]


def apply(model: Model, op: tuple) -> None:
    """``op`` on the model (the same op as :func:`run_op` on real state)."""
    kind, key, ns, *args = op
    if kind == "bulk":
        for k, v in args[0]:
            if v is None:
                model.pop(("v", k, None), None)
            else:
                model[("v", k, None)] = v
    elif kind == "put":
        model[("v", key, ns)] = args[0]
    elif kind == "append":
        model.setdefault(("l", key, ns), []).append(args[0])
    elif kind == "list_update":
        model[("l", key, ns)] = list(args[0])
    elif kind == "map_put":
        model.setdefault(("m", key, ns), {})[args[0]] = args[1]
    elif kind == "map_delete":
        model.get(("m", key, ns), {}).pop(args[0], None)
    elif kind == "timer":
        model.setdefault(("t", key, ns), set()).add(args[0])
    elif kind == "timer_delete":
        model.get(("t", key, ns), set()).discard(args[0])
    else:  # clear_value, clear_list, clear_map
        model.pop(({"clear_value": "v", "clear_list": "l", "clear_map": "m"}[kind], key, ns), None)
    for k in [k for k, v in model.items() if v in ([], {}, set())]:
        del model[k]


def run_op(backend: KeyedStateBackend, op: tuple) -> None:
    kind, key, ns, *args = op
    if kind == "bulk":  # value state of many keys at once, default namespace; None clears
        bulk = BulkValueState(backend, backend.get_state(VALUE))
        bulk.put_many([k for k, _v in args[0]], [v for _k, v in args[0]])
        return
    backend.set_current_key(key)
    if kind in ("timer", "timer_delete"):
        getattr(backend.timers, "register" if kind == "timer" else "delete")(EVENT_TIME, args[0], ns)
        return
    apply_state_op(backend.get_state, kind, ns, args)


def apply_state_op(get_state: Any, kind: str, ns: Any, args: list[Any]) -> None:
    """One state operation of the model's vocabulary on the current key, in namespace ``ns``."""
    state = get_state({"put": VALUE, "clear_value": VALUE, "map_put": MAP, "map_delete": MAP,
                       "clear_map": MAP}.get(kind, LIST))
    state.set_namespace(ns)
    if kind.startswith("clear"):
        state.clear()
    else:
        getattr(state, {"put": "update", "list_update": "update", "append": "add", "map_put": "put",
                        "map_delete": "remove"}[kind])(*args)


def read(backend: KeyedStateBackend) -> Model:
    """Every state of the model's key and namespace universe, read through the state API."""
    out: Model = {}
    states = {"v": backend.get_state(VALUE), "l": backend.get_state(LIST), "m": backend.get_state(MAP)}
    for key in KEYS:
        backend.set_current_key(key)
        for ns in NAMESPACES:
            for name, state in states.items():
                state.set_namespace(ns)
                got = state.value() if name == "v" else state.get() if name == "l" else dict(state.items())
                if got not in (None, [], {}):
                    out[(name, key, ns)] = got
            timers = set(backend.timers.list(EVENT_TIME, ns))
            if timers:
                out[("t", key, ns)] = timers
    return out


def raw(table: StateTable) -> dict[int, dict[bytes, bytes]]:
    """Every entry of every key group, as stored."""
    out = {}
    for kg in range(128):
        flat = table.key_group_flat(kg)
        if flat:
            out[kg] = dict(zip(flat[0::2], flat[1::2], strict=True))
    return out


value = st.integers(0, 3)
# skewed towards one key and namespace, so that operations meet on the same entries across intervals
K, N = st.sampled_from(["a", "a", "a", 7]), st.sampled_from([None, "w", "w"])
per_key_ops = [  # what a processor does to its key's state
    st.tuples(st.just("put"), K, N, value),
    st.tuples(st.sampled_from(["clear_value", "clear_list", "clear_map"]), K, N),
    st.tuples(st.just("append"), K, N, value),
    st.tuples(st.just("list_update"), K, N, st.lists(value, max_size=2)),
    st.tuples(st.just("map_put"), K, N, st.sampled_from(USER_KEYS), value),
    st.tuples(st.just("map_delete"), K, N, st.sampled_from(USER_KEYS)),
]
state_op = st.one_of(
    *per_key_ops,
    st.tuples(st.sampled_from(["timer", "timer_delete"]), K, N, st.integers(1, 2)),
    st.tuples(st.just("bulk"), st.none(), st.none(),
              st.lists(st.tuples(K, st.none() | value), max_size=2, unique_by=lambda kv: kv[0])),
)
# what happens between state operations: the log's change set closes (and uploads), a checkpoint, a
# materialization (synchronous or in the background), a restore from the last checkpoint
EVENTS = ["roll", "upload", "checkpoint", "checkpoint", "materialize", "materialize_async", "restore"]
interval = st.tuples(st.lists(state_op, max_size=8), st.sampled_from(EVENTS))


# -- one subtask's changelogged state, driven step by step ----------------------------------------------------
class Harness:
    """A changelogged heap table under a keyed backend, checkpointed and restored like a subtask; with ``parts``, an
    lmdb table whose background materializations are native snapshots written in parts (one per key group that holds
    data), each taken at the checkpoint after it is placed."""

    def __init__(self, root: str, coalesce: bool = True, parts: bool = False) -> None:
        self.storage = CheckpointStorage(root)
        self.root, self.parts, self.tables = root, parts, 0
        native = {"materialize_in_process_from_bytes": 0, "materialization_part_mb": 1e-6} if parts else {}
        self.config = ChangelogConfig(upload=NOW, coalesce=coalesce, **native)
        self.model: Model = {}
        self.checkpoint_id = 0
        self.last: tuple[list, list, Model] = ([], [], {})  # materialized, changelog, model of the last checkpoint
        self.clog, self.backend = self._open([], [])

    def _open(self, materialized: list, changelog: list) -> tuple[ChangelogKeyedState, KeyedStateBackend]:
        self.tables += 1
        table = LmdbTable(f"{self.root}-lmdb-{self.tables}") if self.parts else HeapTable()
        clog = ChangelogKeyedState(table, self.storage, self.config, 0, 1)
        restore_keyed_state(KeyedStateBackend(clog.table, 128, range(128)), self.storage, materialized, changelog,
                            "test")
        clog.restored(materialized, changelog)
        return clog, KeyedStateBackend(clog.table, 128, range(128))  # timers indexed from the restored table

    def step(self, op: tuple) -> None:
        kind = op[0]
        if len(op) > 1:
            run_op(self.backend, op)
            apply(self.model, op)
        elif kind == "roll":
            self.clog.writer.next_sequence_number()
        elif kind == "upload":
            self.clog.writer.persist(self.clog.materialized_to)  # in flight while the next changes arrive
        elif kind == "checkpoint":
            self.checkpoint()
        elif kind == "materialize":
            self.clog.materialize_now(self.backend)
        elif kind == "materialize_async":
            self.clog.wait_for_materialization()
            self.clog.start_materialization(self.backend, self.clog.writer.next_sequence_number(), in_parts=self.parts)
        else:
            self.restore()
        check_change_set(self.clog.writer.active)

    def checkpoint(self) -> tuple[list, list]:
        self.checkpoint_id += 1
        materialized, changelog, _ = self.clog.snapshot(self.checkpoint_id, self.backend)
        self.clog.checkpoint_completed(self.checkpoint_id)
        self.last = (materialized, changelog, copy.deepcopy(self.model))
        restored = self.restored(materialized, changelog)
        assert read(restored) == self.model == read(self.backend)
        assert raw(restored.table) == raw(self.clog.table), "replay rebuilds the table exactly"
        return materialized, changelog

    def restored(self, materialized: list, changelog: list) -> KeyedStateBackend:
        backend = KeyedStateBackend(HeapTable(), 128, range(128))
        restore_keyed_state(backend, self.storage, materialized, changelog, "test")
        return KeyedStateBackend(backend.table, 128, range(128))

    def restore(self) -> None:
        """Fail over: continue from the last checkpoint in a new subtask (its log starts afresh)."""
        self.close()
        materialized, changelog, model = self.last
        self.clog, self.backend = self._open(materialized, changelog)
        self.model = copy.deepcopy(model)
        assert read(self.backend) == self.model

    def close(self) -> None:
        self.clog.close()
        if self.parts:
            self.clog.table.inner.close()


def check_change_set(cs: ChangeSet) -> None:
    """The pending size is what the records weigh; no key group is left without records."""
    weight = 0
    for kg in cs.key_groups():
        records = cs.records(kg)
        assert records, f"key group {kg} has no records"
        weight += sum(len(k) + len(v) + 3 for k, v in zip(records[1::3], records[2::3], strict=True))
    if cs.coalesce:
        assert cs.size == weight


@settings(max_examples=300, deadline=None)
@given(intervals=st.lists(interval, max_size=10), coalesce=st.sampled_from([True, True, True, False]))
def test_replay_equals_the_model(tmp_path_factory, intervals, coalesce):
    _run(Harness(str(tmp_path_factory.mktemp("c")), coalesce), intervals)


def _run(h: Harness, intervals: list) -> None:
    """Each interval's operations and event, then a last checkpoint (each checkpoint checks the model)."""
    try:
        for ops, event in intervals:
            for op in ops:
                h.step(op)
            h.step((event,))
        h.checkpoint()
    finally:
        h.close()


@settings(max_examples=max(1, int(os.environ.get("SPATE_MODEL_EXAMPLES", "40")) // 2), deadline=None)
@given(intervals=st.lists(interval, max_size=10))
def test_replay_equals_the_model_with_materializations_in_parts(tmp_path_factory, intervals):
    """The same on an lmdb table whose background materializations are written in parts by a reader process: a
    checkpoint may list some parts of a running materialization beside the one before it, narrowed, and each part's
    key groups' log from where it was read."""
    _run(Harness(str(tmp_path_factory.mktemp("c")), parts=True), intervals)


# -- window-like patterns cost nothing in the log ---------------------------------------------------------------
class SumAgg:
    def create_accumulator(self) -> int:
        return 0

    def add(self, value: int, acc: int) -> int:
        return acc + value

    def get_result(self, acc: int) -> int:
        return acc

    def merge(self, a: int, b: int) -> int:
        return a + b


WINDOW_STATES = [VALUE, LIST, MAP, ReducingStateDescriptor("r", reduce_fn=lambda a, b: a + b),
                 AggregatingStateDescriptor("g", aggregate_fn=SumAgg())]


def window(backend: KeyedStateBackend, key: Any, start: int, purge: bool) -> None:
    """A window of ``key`` at ``start``: created, updated a few times, fired and (if ``purge``) purged."""
    backend.set_current_key(key)
    v, lst, m, r, g = (backend.get_state(d) for d in WINDOW_STATES)
    for s in (v, lst, m, r, g):
        s.set_namespace(start)
    backend.timers.register(EVENT_TIME, start + 9, start)
    for i in range(5):
        v.update(i)
        lst.add(i)
        m.put(i % 2, i)
        r.add(i)
        g.add(i)
    if purge:
        backend.timers.delete(EVENT_TIME, start + 9, start)
        for s in (v, lst, m, r, g):
            s.clear()


def records_of(storage: CheckpointStorage, handles: list) -> list:
    return [r for h in handles for _kg, records in read_change_set(storage, h) for r in records]


def test_a_window_created_updated_and_purged_between_uploads_adds_nothing(tmp_path):
    h = Harness(str(tmp_path))
    try:
        h.backend.set_current_key("kept")
        h.backend.get_state(VALUE).update("x")
        _, before = h.checkpoint()
        for key in KEYS:  # sliding windows: every window of every key opens and closes within the interval
            for start in range(0, 40, 10):
                window(h.backend, key, start, purge=True)
        _, after = h.checkpoint()
        stats = h.clog._stats(0.0, [])
        assert [(c.path, c.sqn) for c in after] == [(c.path, c.sqn) for c in before], "nothing new uploaded"
        assert stats["changelog_bytes_at_checkpoint"] == 0
        assert h.clog.writer.next_sequence_number() == len(before), "the sequence number did not move"
    finally:
        h.close()


def test_only_what_outlives_the_interval_is_logged(tmp_path):
    h = Harness(str(tmp_path))
    try:
        window(h.backend, "a", 0, purge=True)
        window(h.backend, "a", 10, purge=False)  # spans the checkpoint
        _, first = h.checkpoint()
        ops = records_of(h.storage, first)[0::3]
        assert len(ops) == 6 + 1, "the open window's five states and timer entries, nothing of the purged one"
        assert DELETE not in ops and MAP_DELETE not in ops
    finally:
        h.close()


def test_an_entry_created_before_an_upload_and_deleted_after_keeps_its_tombstone(tmp_path):
    h = Harness(str(tmp_path))
    try:
        window(h.backend, "a", 0, purge=False)
        _, first = h.checkpoint()
        h.backend.set_current_key("a")
        for d in WINDOW_STATES:
            state = h.backend.get_state(d)
            state.set_namespace(0)
            state.clear()
        h.backend.timers.delete(EVENT_TIME, 9, 0)
        _, second = h.checkpoint()  # checkpoint() asserts replay == model: the window is gone
        ops = records_of(h.storage, second[len(first):])[0::3]
        assert sorted(ops) == [DELETE] * 5 + [MAP_DELETE], "one tombstone per state, one for the timer"
    finally:
        h.close()


@pytest.mark.parametrize("between", ["roll", "upload", "materialize", "materialize_async"])
def test_a_change_set_boundary_keeps_the_tombstone(tmp_path, between):
    h = Harness(str(tmp_path))
    try:
        for op in [("put", "a", 1, 5), ("append", "a", 1, 1), ("map_put", "a", 1, 0, 1), ("timer", "a", 1, 2),
                   (between,), ("clear_value", "a", 1), ("clear_list", "a", 1), ("clear_map", "a", 1),
                   ("timer_delete", "a", 1, 2)]:
            h.step(op)
        h.clog.wait_for_materialization()
        _, changelog = h.checkpoint()
        tombstones = [op for op in records_of(h.storage, changelog)[0::3] if op in (DELETE, MAP_DELETE)]
        assert len(tombstones) == 4, "value, list, map and timer each deleted on replay"
    finally:
        h.close()


SCENARIOS = {
    "value created and cleared": ([("put", "a", None, 1), ("put", "a", None, 2), ("clear_value", "a", None)], []),
    "value overwritten and cleared": ([("put", "a", None, 1), ("checkpoint",), ("put", "a", None, 2),
                                       ("clear_value", "a", None)], [DELETE]),
    "list appended and cleared": ([("append", "a", "w", 1), ("append", "a", "w", 2), ("clear_list", "a", "w")], []),
    "list appended to and cleared": ([("append", "a", "w", 1), ("checkpoint",), ("append", "a", "w", 2),
                                      ("clear_list", "a", "w")], [DELETE]),
    "list updated and cleared": ([("list_update", "a", "w", [1]), ("clear_list", "a", "w")], []),
    "map entries put and cleared": ([("map_put", "a", "w", 0, 1), ("map_put", "a", "w", 1, 1),
                                     ("map_delete", "a", "w", 1), ("clear_map", "a", "w")], []),
    "map entry put and removed": ([("map_put", "a", "w", 0, 1), ("map_delete", "a", "w", 0)], []),
    "map entry overwritten and removed": ([("map_put", "a", "w", 0, 1), ("checkpoint",), ("map_put", "a", "w", 0, 2),
                                           ("map_delete", "a", "w", 0)], [MAP_DELETE]),
    "map with an older entry cleared": ([("map_put", "a", "w", 0, 1), ("checkpoint",), ("map_put", "a", "w", 1, 1),
                                         ("clear_map", "a", "w")], [DELETE]),
    "map with an overwritten entry cleared": ([("map_put", "a", "w", 0, 1), ("checkpoint",),
                                               ("map_put", "a", "w", 0, 2), ("map_put", "a", "w", 1, 1),
                                               ("clear_map", "a", "w")], [DELETE]),
    "map cleared twice": ([("map_put", "a", "w", 0, 1), ("checkpoint",), ("clear_map", "a", "w"),
                           ("map_put", "a", "w", 1, 1), ("clear_map", "a", "w")], [DELETE]),
    "timer registered again and deleted": ([("timer", "a", "w", 1), ("checkpoint",), ("timer", "a", "w", 1),
                                            ("timer_delete", "a", "w", 1)], [MAP_DELETE]),
    "bulk put twice and cleared": ([("bulk", None, None, [("a", 1)]), ("bulk", None, None, [("a", 2), (7, 1)]),
                                    ("bulk", None, None, [("a", None), (7, None)])], []),
    "bulk overwrite and clear": ([("bulk", None, None, [("a", 1)]), ("checkpoint",),
                                  ("bulk", None, None, [("a", 2), (7, 1)]),
                                  ("bulk", None, None, [("a", None), (7, None)])], [DELETE]),
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_what_an_interval_logs(tmp_path, name):
    ops, expected = SCENARIOS[name]
    h = Harness(str(tmp_path))
    try:
        h.step(("put", 7, "w", 0))  # the first interval is never empty
        _, before = h.checkpoint()
        for op in ops:
            if op == ("checkpoint",):
                _, before = h.checkpoint()
            else:
                h.step(op)
        _, after = h.checkpoint()
        assert records_of(h.storage, after[len(before):])[0::3] == expected
    finally:
        h.close()


# -- through the runtime: restores at another parallelism -----------------------------------------------------
class OpsJob(Processor):
    """Applies each row's state operation (``op``: kind, namespace, args...) to its key's state."""

    def process(self, key: Any, rows: list[dict], ctx: Any) -> None:
        for row in rows:
            kind, ns, *args = row["op"]
            apply_state_op(ctx.state, kind, ns, args)


def checkpointed(root: str) -> Model:
    storage = CheckpointStorage(root)
    meta, out = load_checkpoint(storage), {}
    for name in keyed_state_names(meta).keys() & {"v", "l", "m"}:  # states without data are not named
        for e in keyed_state_entries(storage, meta, name):
            if name == "m":
                out.setdefault((name, e.key, e.namespace), {})[e.user_key] = e.value
            else:
                out[(name, e.key, e.namespace)] = e.value
    return out


batch = st.lists(st.one_of(*per_key_ops), max_size=10)
segment = st.tuples(st.integers(1, 4), st.sampled_from(["heap", "lmdb"]), st.lists(batch, min_size=1, max_size=4))


@settings(max_examples=40, deadline=None)
@given(segments=st.lists(segment, min_size=2, max_size=3), materialize_often=st.booleans(),
       tiny_uploads=st.booleans(), reader_process=st.booleans())
def test_restores_at_other_parallelisms_equal_the_model(tmp_path_factory, segments, materialize_often,
                                                        tiny_uploads, reader_process):
    """``reader_process``: lmdb tables are materialized by reader processes, whatever their size."""
    root = str(tmp_path_factory.mktemp("r"))
    cfg = ChangelogConfig(materialization_interval_ms=1 if materialize_often else 600_000, upload=NOW,
                          preemptive_threshold=64 if tiny_uploads else 5 << 20,
                          materialize_in_process_from_bytes=0 if reader_process else 64 << 20)
    model: Model = {}
    for parallelism, table, batches in segments:
        with LocalRunner(OpsJob, key="k", checkpoint_root=root, parallelism=parallelism, table=table,
                         changelog=cfg) as runner:
            for ops in batches:
                ops = [(op[0], str(op[1]), *op[2:]) for op in ops]  # a key column holds one type: "a" and "7"
                runner.run_batch(runner.next_batch_id, [{"k": op[1], "op": [op[0], *op[2:]]} for op in ops])
                for op in ops:
                    apply(model, op)
        assert checkpointed(root) == model
