"""Windows on keyed state equal a plain model (Flink's window semantics, batch by batch): tumbling, sliding and
session windows in event time with allowed lateness and late rows, through restarts at other parallelisms and
injected crashes; processing-time windows and early firings; the purge leaves no state behind."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers.aggregates import CountSum
from helpers.faults import CrashOnce
from spate import LocalRunner
from spate.windows import SessionWindows, SlidingWindows, TumblingWindows, Window, WindowedProcessor

DELAY = 1_000


def late_row(key, row):
    return {"key": key, "window_start": -1, "window_end": -1, "value": (0, row["v"])}


class Model:
    """Flink's window operator over micro-batches: rows of a batch are added with the batch's watermark, then
    every window whose timers the watermark reached fires (and is purged at its end plus the lateness)."""

    def __init__(self, assigner, lateness):
        self.assigner, self.lateness = assigner, lateness
        self.windows: dict[tuple, dict[Window, dict]] = {}  # key -> window -> {acc, fire}

    def late(self, w, wm):
        return wm is not None and w.max_timestamp + self.lateness <= wm

    def batch(self, rows, wm):
        out = []
        for key in dict.fromkeys(r["user"] for r in rows):
            touched = {}
            for r in (r for r in rows if r["user"] == key):
                windows = [w for w in self.assigner.assign(r["ts"]) if not self.late(w, wm)]
                if windows and self.assigner.merging:
                    windows = [self.merge(key, windows[0])]
                    if self.late(windows[0], wm):
                        windows = []
                if not windows:
                    out.append((key, -1, -1, (0, r["v"])))
                    continue
                for w in windows:
                    entry = self.windows.setdefault(key, {}).setdefault(w, {"acc": (0, 0), "fire": False})
                    entry["acc"] = (entry["acc"][0] + 1, entry["acc"][1] + r["v"])
                    entry["fire"] = entry["fire"] or wm is None or w.max_timestamp > wm
                    touched[w] = None
            out += [(key, w.start, w.end, self.windows[key][w]["acc"]) for w in touched
                    if w in self.windows[key] and wm is not None and w.max_timestamp <= wm]
        if wm is not None:
            for key, windows in self.windows.items():
                for w, entry in list(windows.items()):
                    if entry["fire"] and w.max_timestamp <= wm:
                        out.append((key, w.start, w.end, entry["acc"]))
                        entry["fire"] = False
                    if w.max_timestamp + self.lateness <= wm:
                        del windows[w]
        return sorted(out)

    def merge(self, key, new):
        windows = self.windows.setdefault(key, {})
        touching = [w for w in windows if w.touches(new)]
        merged = new
        for w in touching:
            merged = merged.cover(w)
        acc, fire = (0, 0), False
        for w in touching:
            entry = windows.pop(w)
            acc = (acc[0] + entry["acc"][0], acc[1] + entry["acc"][1])
            fire = fire or entry["fire"] and w == merged
        windows[merged] = {"acc": acc, "fire": fire}
        return merged


def watermarks(batches):
    """spate's watermark per batch: max event time of the batches before, minus the delay (never down)."""
    out, wm, max_event = [], None, None
    for rows in batches:
        out.append(wm)
        for r in rows:
            max_event = r["ts"] if max_event is None else max(max_event, r["ts"])
        if max_event is not None:
            wm = max_event - DELAY if wm is None else max(wm, max_event - DELAY)
    return out


ASSIGNERS = {"tumbling": TumblingWindows(2_000), "sliding": SlidingWindows(3_000, 1_000),
             "session": SessionWindows(1_500)}
batch_strategy = st.lists(st.fixed_dictionaries({"user": st.sampled_from("abc"),
                                                 "ts": st.integers(0, 30).map(lambda t: t * 250),
                                                 "v": st.integers(1, 9)}), max_size=8)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(sorted(ASSIGNERS)), st.sampled_from([0, 1_000]),
       st.lists(batch_strategy, min_size=1, max_size=7), st.lists(st.integers(1, 4), min_size=3, max_size=3),
       st.integers(0, 8), st.sampled_from(["after_acks", "after_complete", "after_subtask_0", None]),
       st.booleans(), st.sampled_from([False, "within", "across"]))
def test_event_time_windows_equal_the_model(tmp_path_factory, kind, lateness, batches, parallelisms, crash_at,
                                            step, changelog, file_merging):
    assigner = ASSIGNERS[kind]
    batches = [*batches, [{"user": "z", "ts": 100_000, "v": 0}], []]  # the watermark passes every window
    model = Model(assigner, lateness)
    want = [model.batch(rows, wm) for rows, wm in zip(batches, watermarks(batches), strict=True)]
    root = str(tmp_path_factory.mktemp("root"))
    got: dict[int, list] = {}
    fault = CrashOnce(step, crash_at)

    def sink(outputs, batch_id):
        got[batch_id] = sorted((o["key"], o["window_start"], o["window_end"], tuple(o["value"])) for o in outputs)

    runs = 0
    while len(got) < len(batches) and runs < 8:
        processor = WindowedProcessor(assigner, timestamp="ts", aggregate=CountSum(), value=lambda r: r["v"],
                                      allowed_lateness_ms=lateness, late_rows=late_row)
        with LocalRunner(processor, key="user", checkpoint_root=root, parallelism=parallelisms[runs % 3],
                         max_parallelism=8, event_time_column="ts", watermark_delay_ms=DELAY, changelog=changelog,
                         file_merging=file_merging,
                         fault_injector=fault, sink=sink) as runner:
            runs += 1
            try:
                for n in range(runner.next_batch_id, min(runner.next_batch_id + 3, len(batches))):
                    runner.run_batch(n, batches[n])
            except RuntimeError as e:
                assert "injected crash" in str(e)
    assert [got[n] for n in range(len(batches))] == want


def test_purged_windows_leave_no_state(tmp_path):
    from spate.state.layout import U16

    processor = WindowedProcessor(SlidingWindows(2_000, 500), timestamp="ts", reduce=lambda a, b: a + b,
                                  value=lambda r: r["v"])
    with LocalRunner(processor, key="user", checkpoint_root=str(tmp_path), event_time_column="ts",
                     watermark_delay_ms=0) as runner:
        runner.run_batch(0, [{"user": "a", "ts": 100, "v": 1}, {"user": "b", "ts": 1_900, "v": 2}])
        fired = runner.run_batch(1, [{"user": "a", "ts": 10_000, "v": 5}]).outputs  # watermark 1 900: a's first
        fired += runner.run_batch(2, []).outputs  # watermark 10 000: every other window of batch 0
        keyed = runner.subtasks[0].keyed
        sid = next(m.sid for m in keyed.state_metas if m.name == "window-contents")
        left = sum(1 for kg in keyed.key_groups for _ in keyed.table.state_entries(kg, U16.pack(sid)))
    assert sorted((o["key"], o["window_start"], o["value"]) for o in fired) == [
        ("a", -1500, 1), ("a", -1000, 1), ("a", -500, 1), ("a", 0, 1),
        ("b", 0, 2), ("b", 500, 2), ("b", 1000, 2), ("b", 1500, 2)]
    assert left == 4, "only the four windows of the row at 10 000 still hold state"


def test_processing_time_windows_and_early_firings(tmp_path):
    clock = [0]
    processor = WindowedProcessor(TumblingWindows(10_000), time="processing", reduce=lambda a, b: a + b,
                                  value=lambda r: r["v"], early_fire_ms=3_000)
    with LocalRunner(processor, key="user", checkpoint_root=str(tmp_path), clock=lambda: clock[0]) as runner:
        outputs = []
        for t, rows in [(1_000, [{"user": "a", "v": 1}]), (2_000, [{"user": "a", "v": 2}]), (4_500, []),
                        (9_000, [{"user": "a", "v": 4}]), (10_500, [{"user": "a", "v": 8}]), (20_000, [])]:
            clock[0] = t
            result = runner.run_batch(len(outputs), rows)
            outputs.append(sorted((o["window_start"], o["value"]) for o in result.outputs))
    # early firings at 4 000 (the first row at 1 000 + 3 000, due at 4 500) and 7 500 (due at 9 000, after that
    # batch's row: the input comes before the timers); on time at 9 999 (due at 10 500); [10 000, 20 000) fires
    # once at 20 000: its early timer (13 500) is due in the same batch, so it does not fire
    assert outputs == [[], [], [(0, 3)], [(0, 7)], [(0, 7)], [(10_000, 8)]]


def test_process_function_sees_the_windows_rows(tmp_path):
    def process(key, window, rows):
        yield {"key": key, "window_start": window.start, "window_end": window.end,
               "value": sorted(r["v"] for r in rows)}

    processor = WindowedProcessor(SessionWindows(1_000), timestamp="ts", process=process)
    with LocalRunner(processor, key="user", checkpoint_root=str(tmp_path), event_time_column="ts",
                     watermark_delay_ms=0) as runner:
        runner.run_batch(0, [{"user": "a", "ts": 0, "v": 1}, {"user": "a", "ts": 1_800, "v": 3},
                             {"user": "a", "ts": 900, "v": 2}])  # [900, 1 900) bridges [0, 1 000) and [1 800, ...)
        out = runner.run_batch(1, [{"user": "b", "ts": 9_000, "v": 0}]).outputs  # watermark 1 800
        out += runner.run_batch(2, []).outputs  # watermark 9 000
    assert [(o["window_start"], o["window_end"], o["value"]) for o in out] == [(0, 2_800, [1, 2, 3])]


@pytest.mark.parametrize("kwargs,message", [
    ({"time": "event"}, "timestamp="),
    ({"timestamp": "ts"}, "exactly one of aggregate="),
    ({"timestamp": "ts", "reduce": max, "aggregate": CountSum()}, "exactly one of"),
    ({"time": "processing", "reduce": max, "allowed_lateness_ms": 5}, "allowed_lateness_ms is for event time"),
    ({"timestamp": "ts", "reduce": max, "late_rows": "side"}, "late_rows must be 'drop' or a function"),
    ({"time": "fast", "reduce": max}, "time must be one of"),
])
def test_bad_arguments_are_clear_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        WindowedProcessor(TumblingWindows(1_000), **kwargs)


class ProcessingTimeModel:
    """Processing-time windows over micro-batches at times ``now``: the batch's rows first, then the due timers
    (early firings skipped when the window completes in the same batch), all at the batch's time."""

    def __init__(self, assigner, early):
        self.assigner, self.early = assigner, early
        self.windows: dict[str, dict[Window, dict]] = {}  # key -> window -> {sum, early_at}

    def batch(self, rows, now):
        out = []
        for r in rows:
            windows = self.windows.setdefault(r["user"], {})
            targets = self.assigner.assign(now)
            if self.assigner.merging:
                targets = [self.merge(windows, targets[0], now)]
            for w in targets:
                entry = windows.setdefault(w, {"sum": 0, "early_at": now + self.early if self.early else None})
                entry["sum"] += r["v"]
        for key, windows in self.windows.items():
            for w, entry in sorted(windows.items()):
                if entry["early_at"] is not None and entry["early_at"] <= now and now < w.max_timestamp:
                    out.append((key, w.start, w.end, entry["sum"]))
                    following = max(entry["early_at"], now) + self.early
                    entry["early_at"] = following if following < w.max_timestamp else None
                if w.max_timestamp <= now:
                    out.append((key, w.start, w.end, entry["sum"]))
                    del windows[w]
        return sorted(out)

    def merge(self, windows, new, now):
        touching = [w for w in windows if w.touches(new)]
        merged = new
        for w in touching:
            merged = merged.cover(w)
        if touching and touching != [merged]:
            total = sum(windows.pop(w)["sum"] for w in touching)
            windows[merged] = {"sum": total, "early_at": now + self.early if self.early else None}
        return merged


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(sorted(ASSIGNERS)), st.sampled_from([None, 700]),
       st.lists(st.tuples(st.integers(0, 2_500), st.lists(st.fixed_dictionaries(
           {"user": st.sampled_from("ab"), "v": st.integers(1, 9)}), max_size=4)), min_size=1, max_size=8),
       st.lists(st.integers(1, 3), min_size=2, max_size=2))
def test_processing_time_windows_equal_the_model(tmp_path_factory, kind, early, steps, parallelisms):
    assigner = ASSIGNERS[kind]
    model = ProcessingTimeModel(assigner, early)
    clock, times = [0], []
    for advance, _rows in steps:
        clock[0] += advance
        times.append(clock[0])
    want = [model.batch(rows, now) for (_a, rows), now in zip(steps, times, strict=True)]
    root = str(tmp_path_factory.mktemp("root"))
    got = []
    for part in range(2):  # a restart halfway, at another parallelism
        processor = WindowedProcessor(assigner, time="processing", reduce=lambda a, b: a + b,
                                      value=lambda r: r["v"], early_fire_ms=early)
        with LocalRunner(processor, key="user", checkpoint_root=root, parallelism=parallelisms[part],
                         max_parallelism=8, clock=lambda: clock[0], changelog=part == 1) as runner:
            half = (len(steps) + 1) // 2
            for n in range(part * half, len(steps) if part else half):
                clock[0] = times[n]
                result = runner.run_batch(n, steps[n][1])
                got.append(sorted((o["key"], o["window_start"], o["window_end"], o["value"])
                                  for o in result.outputs))
    assert got == want
