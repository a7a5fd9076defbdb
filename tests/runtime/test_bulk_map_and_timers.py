"""Bulk map state and bulk timers of a ``BatchProcessor``: each equals a plain model and its per-key twin (a
``Processor`` with ``MapState`` and per-key timers) through restores at other parallelisms and crashes, and the
two APIs read each other's map entries and timers."""

from __future__ import annotations

import sys
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark import cloudpickle

from helpers.rescaling import run_rescaling
from spate import LocalRunner, MapStateDescriptor, Processor, ValueStateDescriptor, keyed_state_entries, load_checkpoint
from spate.checkpoint.inspect import keyed_state_names
from spate.fs import CheckpointStorage
from spate.runtime.batch import BatchProcessor, uses_timers

cloudpickle.register_pickle_by_value(sys.modules[__name__])

TALLY: MapStateDescriptor = MapStateDescriptor("tally")
LIMIT = 3  # an item counted past it is removed; a map of more items than it keeps only its smallest item


class BulkTally(BatchProcessor):
    """Counts rows per (key, item) in map state with single-entry calls; trims with whole-map calls."""

    def open(self, ctx):
        self.tally = ctx.bulk_state(TALLY)

    def process_batch(self, batch, ctx):
        if not len(batch.keys):  # an empty batch of LocalRunner's has no columns
            return None
        pairs = Counter(zip(batch.table.column("k").to_pylist(), batch.table.column("item").to_pylist(),
                            strict=True))
        keys, items = [k for k, _ in pairs], [i for _, i in pairs]
        new = [old + n for old, n in zip(self.tally.get_entries(keys, items, default=0), pairs.values(),
                                         strict=True)]
        over = [j for j, v in enumerate(new) if v > LIMIT]
        self.tally.put_entries(keys, items, new)
        self.tally.remove_entries([keys[j] for j in over], [items[j] for j in over])
        maps = self.tally.get_many(batch)
        big = [j for j, m in enumerate(maps) if len(m) > 2]
        trimmed = [{min(maps[j]): maps[j][min(maps[j])]} for j in big]
        self.tally.update_many([batch.keys[j] for j in big], trimmed)
        for j, m in zip(big, trimmed, strict=True):
            maps[j] = m
        return {"k": batch.keys, "count": [sum(m.values()) for m in maps]}


class RowTally(Processor):
    def open(self, ctx):
        self.tally = ctx.state(TALLY)

    def process(self, key, rows, ctx):
        for item, n in Counter(r["item"] for r in rows).items():
            v = self.tally.get(item, 0) + n
            if v > LIMIT:
                self.tally.remove(item)
            else:
                self.tally.put(item, v)
        entries = dict(self.tally.items())
        if len(entries) > 2:
            self.tally.clear()
            smallest = min(entries)
            self.tally.put(smallest, entries[smallest])
            entries = {smallest: entries[smallest]}
        yield {"k": key, "count": sum(entries.values())}


def _tally_model(batches):
    model: dict[str, dict[str, int]] = {}
    expected = {}
    for n, rows in enumerate(batches):
        for (k, item), c in Counter((r["k"], r["item"]) for r in rows).items():
            m = model.setdefault(k, {})
            v = m.get(item, 0) + c
            if v > LIMIT:
                m.pop(item, None)
            else:
                m[item] = v
        for k in {r["k"] for r in rows}:
            if len(model[k]) > 2:
                smallest = min(model[k])
                model[k] = {smallest: model[k][smallest]}
        expected[n] = sorted((k, sum(model[k].values())) for k in {r["k"] for r in rows})
    return expected, {k: m for k, m in model.items() if m}


def _maps(root: str) -> dict:
    storage = CheckpointStorage(root)
    meta = load_checkpoint(storage)
    if "tally" not in keyed_state_names(meta):
        return {}
    maps: dict = {}
    for e in keyed_state_entries(storage, meta, "tally"):
        maps.setdefault(e.key, {})[e.user_key] = e.value
    return maps


rows_st = st.lists(st.tuples(st.sampled_from("abcde"), st.sampled_from("wxyz")), max_size=10)


@settings(max_examples=12, deadline=None)
@given(st.lists(rows_st, min_size=1, max_size=6), st.lists(st.integers(1, 4), min_size=3, max_size=3),
       st.booleans(), st.integers(0, 6), st.booleans())
def test_bulk_map_state_equals_a_model_through_rescales_and_crashes(tmp_path_factory, batches, ps, lmdb, crash,
                                                                      per_key_after):
    """With ``per_key_after`` the last batches run the per-key twin on the same state."""
    batches = [[{"k": k, "item": i} for k, i in b] for b in batches]
    expected, model = _tally_model(batches)
    root = str(tmp_path_factory.mktemp("bulkmap"))
    kw = dict(table="lmdb" if lmdb else "heap", changelog=lmdb, file_merging="across" if lmdb else False)
    split = len(batches) // 2 if per_key_after else len(batches)
    got = run_rescaling(BulkTally, root, batches[:split], [(0, ps[0]), (2, ps[1]), (4, ps[2])], crash_at=crash, **kw)
    if split < len(batches):
        got |= run_rescaling(RowTally, root, batches, [(0, ps[2])], **kw)
    assert got == expected
    assert _maps(root) == model


def test_bulk_map_state_refuses_mismatched_arguments_and_applies_repeats_in_order(tmp_path):
    seen = []

    class Calls(BatchProcessor):
        def open(self, ctx):
            self.tally = ctx.bulk_state(TALLY)

        def process_batch(self, batch, ctx):
            for call in (lambda: self.tally.put_entries(["a"], ["x", "y"], [1, 2]),
                         lambda: self.tally.put_many(["a"], [[("x", 1)]]),
                         lambda: self.tally.get_entries(["a", "b"], ["x"])):
                with pytest.raises((TypeError, ValueError)) as e:
                    call()
                seen.append(str(e.value))
            self.tally.put_entries(["a", "a"], ["x", "x"], [1, 2])
            self.tally.update_many(["b", "b"], [{"x": 1}, {"y": 2}])
            self.tally.put_many(["c"], [{"z": 3}])
            seen.append(self.tally.get_many(["a", "b", "c", "d"]))
            self.tally.clear_many(["a", "b"])
            seen.append(self.tally.get_many(["a", "b", "c"]))
            return None

    with LocalRunner(Calls, key="k", checkpoint_root=str(tmp_path / "c")) as runner:
        runner.run_batch(0, [{"k": "a"}])
    assert seen[0] == "put_entries on state 'tally': 2 user keys for 1 keys"
    assert seen[1].startswith("put_many on state 'tally': each key's entries must be a mapping")
    assert seen[2] == "get_entries on state 'tally': 1 user keys for 2 keys"
    assert seen[3] == [{"x": 2}, {"y": 2}, {"z": 3}, {}]
    assert seen[4] == [{}, {}, {"z": 3}]


# -- timers --------------------------------------------------------------------------------------------------

DUE: ValueStateDescriptor = ValueStateDescriptor("due")
QUIET_MS = 5  # a key's timer fires once the watermark passes its latest event time by this much


class BulkQuiet(BatchProcessor):
    """For each key, one event-time timer at its latest event time + QUIET_MS (moved on by later rows); when it
    fires, outputs (key, timer time)."""

    def open(self, ctx):
        self.due = ctx.bulk_state(DUE)
        self.timers = ctx.bulk_timers()

    def process_batch(self, batch, ctx):
        if not len(batch.keys):
            return None
        ts = batch.table.column("ts").to_pylist()
        latest = [max(ts[batch.offsets[i]:batch.offsets[i + 1]]) + QUIET_MS for i in range(len(batch.keys))]
        old = self.due.get_many(batch)
        moved = [i for i, (o, n) in enumerate(zip(old, latest, strict=True)) if o is not None and o < n]
        self.timers.delete_many([batch.keys[i] for i in moved], [old[i] for i in moved])
        due = [n if o is None else max(o, n) for o, n in zip(old, latest, strict=True)]
        self.timers.register_many(batch, due)
        self.due.put_many(batch, due)
        return None

    def on_timers(self, timers, ctx):
        assert ctx.timer_domain == timers.domain == "event"
        self.due.clear_many(timers)
        return {"k": timers.keys, "count": timers.timestamps}


class RowQuiet(Processor):
    def open(self, ctx):
        self.due = ctx.state(DUE)

    def process(self, key, rows, ctx):
        old, new = self.due.value(), max(r["ts"] for r in rows) + QUIET_MS
        if old is not None and old < new:
            ctx.delete_event_time_timer(old)
        due = new if old is None else max(old, new)
        ctx.register_event_time_timer(due)
        self.due.update(due)
        return None

    def on_timer(self, key, timestamp, ctx):
        self.due.clear()
        yield {"k": key, "count": timestamp}


ts_rows = st.lists(st.tuples(st.sampled_from("abcd"), st.integers(0, 40)), max_size=8)


@settings(max_examples=12, deadline=None)
@given(st.lists(ts_rows, min_size=1, max_size=7), st.lists(st.integers(1, 4), min_size=3, max_size=3),
       st.booleans(), st.integers(0, 7), st.booleans())
def test_bulk_timers_fire_as_per_key_timers_do_through_rescales_and_crashes(tmp_path_factory, batches, ps, lmdb,
                                                                            crash, per_key_after):
    """The per-key twin is the model (its timers are tested against one in test_timers); with
    ``per_key_after`` the bulk processor's timers fire in the per-key one's batches."""
    batches = [[{"k": k, "ts": t} for k, t in b] for b in batches]
    kw = dict(event_time_column="ts", watermark_delay_ms=0, table="lmdb" if lmdb else "heap", changelog=lmdb)
    want = run_rescaling(RowQuiet, str(tmp_path_factory.mktemp("rowtimers")), batches, [(0, 2)], **kw)
    root = str(tmp_path_factory.mktemp("bulktimers"))
    split = len(batches) // 2 if per_key_after else len(batches)
    got = run_rescaling(BulkQuiet, root, batches[:split], [(0, ps[0]), (2, ps[1]), (4, ps[2])], crash_at=crash, **kw)
    if split < len(batches):
        got |= run_rescaling(RowQuiet, root, batches, [(0, ps[2])], **kw)
    assert got == want


def test_processing_time_timers_fire_in_bulk_then_timers_registered_while_firing(tmp_path):
    now = [1_000]
    fired = []

    class Reminders(BatchProcessor):
        def open(self, ctx):
            self.timers = ctx.bulk_timers()

        def process_batch(self, batch, ctx):
            self.timers.register_many(batch, [ctx.processing_time_ms + 10] * len(batch.keys), domain="processing")
            assert self.timers.list_many(batch, domain="processing") == [[1_010]] * len(batch.keys)
            return None

        def on_timers(self, timers, ctx):
            fired.append((timers.domain, sorted(timers.keys), timers.timestamps.tolist()))
            again = [k for k, t in zip(timers.keys, timers.timestamps, strict=True) if t == 1_010 and k == "a"]
            self.timers.register_many(again, [1_005] * len(again), domain="processing")  # due already
            return None

    with LocalRunner(Reminders, key="k", checkpoint_root=str(tmp_path / "c"), parallelism=2,
                     clock=lambda: now[0]) as runner:
        runner.run_batch(0, [{"k": "a"}, {"k": "b"}])
        assert fired == [] and runner.idle_batch_due_at == 1_010
        now[0] = 1_010
        assert runner.run_idle() is not None
    timers = sorted((domain, k, t) for domain, keys, ts in fired for k, t in zip(keys, ts, strict=True))
    assert timers == [("processing", "a", 1_005), ("processing", "a", 1_010), ("processing", "b", 1_010)]
    calls_with_a = [ts for _, keys, ts in fired if "a" in keys]
    assert calls_with_a == [[1_010] * len(calls_with_a[0]), [1_005]], "the re-registered timer: a call after"


def test_a_batch_processor_has_timers_when_it_defines_on_timers():
    assert uses_timers(BulkQuiet) and uses_timers(BulkQuiet()) and uses_timers(RowQuiet)
    assert not uses_timers(BulkTally) and not uses_timers(BulkTally())
