"""``spate bench blog``: the two workloads of Flink's blog post "Improving speed and stability of checkpointing
with generic log-based incremental checkpoints" (2022-05-30), changelog on vs off, side by side in one run.

Like the blog's jobs, input arrives at a fixed rate and checkpoints follow each other as fast as they can (a
short checkpoint interval): a batch takes the rows that arrived while the previous one ran, so a variant with
slow checkpoints makes fewer, bigger ones over the same input (the blog: 10,023 checkpoints without the
changelog, 108,649 with it). Both variants see the same rows in the same order. One subtask on lmdb (state
larger than memory), file merging across checkpoints; the changelog variant materializes on the blog's
3-minute interval or once the log since the last materialization reaches spate's byte bound (set per workload
in :class:`Setup`; the change-set count bound is raised out of the way of checkpoints every ~200 ms).

* value: keyed value state of ≥ 1 GB (pre-filled, not measured), then random updates of existing keys plus
  inserts of new ones (the blog's ValueState job).
* window: a processing-time sliding window (10 s, sliding by 1 s, of the input's own clock) aggregating
  each key's values (count, sum, min, max and a small histogram per window).

Per variant: every checkpoint's duration (p50/p90/p99/p99.9; below 1,000 checkpoints p99.9 is the maximum),
the size of everything the last checkpoint references (``full_checkpoint_bytes``), and recovery: a fresh
runner with an empty local directory restores the last checkpoint and completes its first batch (until the
subtask's acknowledgement; before 2026-11-26 the runner's close was counted too, which waited for a
materialization the restored subtask had started).
Charts: checkpoint duration over time and full checkpoint size over time, per workload.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from spate.changelog.state import ChangelogConfig
from spate.changelog.upload import MB
from spate.fs import CheckpointStorage
from spate.layout import metadata_path
from spate.report import format_table, human_bytes, percentile, progress
from spate.runtime.local import BatchResult, LocalRunner
from spate.runtime.processor import Context, Processor
from spate.state.descriptors import ValueStateDescriptor

VALUE: ValueStateDescriptor[bytes] = ValueStateDescriptor("value")
VALUE_BYTES = 500
ENTRY_BYTES = VALUE_BYTES + 20  # value + table key + framing, roughly
PAYLOAD = random.Random(158).randbytes(VALUE_BYTES)  # incompressible, like real values
UPDATE_SHARE = 0.7  # value workload: updates of random existing keys; the rest inserts new keys
VARIANTS = ("changelog", "full")
WORKLOADS = ("value", "window")
MIN_CHECKPOINTS_FOR_P999 = 1_000
HISTOGRAM_BUCKETS = 16
PREFILL_CHUNK = 20_000

# the blog's published figures (changelog enabled / disabled), for the side-by-side table
BLOG = {"value": {"changelog": {"p50": "311 ms", "p90": "664 ms", "p99": "1 s", "p999": "1 s",
                                "size": "25.6 GB (p99)", "recovery": "35-65 s", "checkpoints": "108,649"},
                  "full": {"p50": "5 s", "p90": "6 s", "p99": "7 s", "p999": "10 s", "size": "19.6 GB (p99)",
                           "recovery": "20-21 s", "checkpoints": "10,023"}},
        "window": {"changelog": {"p50": "791 ms", "p90": "1 s", "p99": "1 s", "p999": "2 s",
                                 "size": "103 GB (p99)", "recovery": "-", "checkpoints": "-"},
                   "full": {"p50": "1 s", "p90": "1 s", "p99": "6 s", "p999": "6 s", "size": "2.26 GB (p99)",
                            "recovery": "-", "checkpoints": "-"}}}
GOALS = {"value": "p99.9 full/changelog ≥ 10× (and ≤ 10× its own p50), size changelog/full ≤ 1.3×, recovery "
                  "changelog/full ≤ 1.0×, _metadata with the longest log ≤ 2× with 10 change sets",
         "window": "p99 full/changelog ≥ 3×, size changelog/full ≤ 3× (the blog's: 45×), recovery ≤ 1.0×"}


@dataclass(frozen=True)
class Setup:
    """Sizes of one run. Rates and durations are per variant; the clock is the input's own (1 s of it is
    ``1 / clock_speed`` s of real time)."""

    state_mb: int  # value workload: live state before the measured input
    value_rows_per_s: int
    value_seconds: float
    window_keys: int
    window_rows_per_s: int
    window_seconds: float
    window_clock_speed: float  # simulated seconds per real second (window firings per real second)
    interval_ms: int  # checkpoint interval: a batch starts at least this long after the previous one started
    materialization_ms: int  # of the input's clock
    value_log_bound_mb: float  # changelog: materialize once the log since the last materialization is this long
    window_log_bound_mb: float


FULL = Setup(state_mb=1_000, value_rows_per_s=2_000, value_seconds=300, window_keys=20_000,
             window_rows_per_s=2_000, window_seconds=60, window_clock_speed=0.25, interval_ms=200,
             materialization_ms=180_000, value_log_bound_mb=128, window_log_bound_mb=2)
QUICK = Setup(state_mb=4, value_rows_per_s=1_000, value_seconds=7, window_keys=500, window_rows_per_s=500,
              window_seconds=7, window_clock_speed=2.0, interval_ms=100, materialization_ms=3_000,
              value_log_bound_mb=1, window_log_bound_mb=0.5)


class Put(Processor):
    """The value workload's job: keep each key's latest value."""

    def open(self, ctx: Context) -> None:
        self.value = ctx.state(VALUE)

    def process(self, key: Any, rows: Sequence[dict], ctx: Context) -> None:
        self.value.update(rows[-1]["v"])


class Stats:
    """The window workload's aggregate: count, sum, min, max and a histogram of the values."""

    def create_accumulator(self) -> list[int]:
        return [0, 0, 0, 0] + [0] * HISTOGRAM_BUCKETS

    def add(self, value: int, acc: list[int]) -> list[int]:
        first = acc[0] == 0
        acc[0] += 1
        acc[1] += value
        acc[2] = value if first else min(acc[2], value)
        acc[3] = value if first else max(acc[3], value)
        acc[4 + min(HISTOGRAM_BUCKETS - 1, value.bit_length())] += 1
        return acc

    def get_result(self, acc: list[int]) -> dict[str, Any]:
        return {"count": acc[0], "sum": acc[1], "min": acc[2], "max": acc[3]}

    def merge(self, a: list[int], b: list[int]) -> list[int]:
        if a[0] == 0 or b[0] == 0:
            return list(b if a[0] == 0 else a)
        return [a[0] + b[0], a[1] + b[1], min(a[2], b[2]), max(a[3], b[3])] + [x + y for x, y in zip(
            a[4:], b[4:], strict=True)]


def window_job() -> Processor:
    """The window workload's job: a processing-time sliding window, 10 s sliding by 1 s."""
    from spate.windows import SlidingWindows, WindowedProcessor

    return WindowedProcessor(SlidingWindows(size_ms=10_000, slide_ms=1_000), time="processing", aggregate=Stats(),
                             value=lambda row: row["v"])


# -- input ---------------------------------------------------------------------------------------------------
class ValueInput:
    """The value workload's rows, in the same order for every variant: updates of random existing keys and
    inserts of new ones."""

    def __init__(self, keys: int) -> None:
        self.next_key = keys
        self.rng = random.Random(2022)

    def take(self, n: int) -> list[dict]:
        rows = []
        for _ in range(n):
            if self.rng.random() < UPDATE_SHARE:
                key = self.rng.randrange(self.next_key)
            else:
                key, self.next_key = self.next_key, self.next_key + 1
            rows.append({"k": key, "v": PAYLOAD})
        return rows


class WindowInput:
    """The window workload's rows: keys drawn uniformly from ``keys``, small integer values."""

    def __init__(self, keys: int) -> None:
        self.keys = keys
        self.rng = random.Random(2205)

    def take(self, n: int) -> list[dict]:
        rng = self.rng
        return [{"k": rng.randrange(self.keys), "v": rng.randrange(1, 10_000)} for _ in range(n)]


class InputClock:
    """Processing time of the input's own clock: the arrival time of the latest row taken (``clock=``)."""

    def __init__(self, rows_per_s: int, speed: float = 1.0) -> None:
        self.rows_per_s, self.speed = rows_per_s, speed
        self.now_ms = 0

    def advance(self, rows_taken: int) -> None:
        self.now_ms = int(rows_taken * 1000 / self.rows_per_s)

    def __call__(self) -> int:
        return self.now_ms


# -- driving a runner ----------------------------------------------------------------------------------------
@dataclass
class Feed:
    """Rows arriving at ``rows_per_s`` (of the input's clock) for ``seconds``, into back-to-back checkpoints."""

    take: Callable[[int], list[dict]]
    clock: InputClock
    seconds: float
    interval_ms: int

    @property
    def total(self) -> int:
        return int(self.clock.rows_per_s * self.seconds)

    def arrived(self, started: float) -> int:
        """Rows arrived by now (real time since ``started``, at the clock's speed)."""
        return min(self.total, int((time.perf_counter() - started) * self.clock.speed * self.clock.rows_per_s))


def drive(runner: LocalRunner, feed: Feed, label: str) -> list[dict[str, Any]]:
    """Run batches until the feed's rows are all taken; one sample per checkpoint."""
    samples: list[dict[str, Any]] = []
    started, taken, last_start = time.perf_counter(), 0, -math.inf
    per_tick = feed.clock.rows_per_s
    for tick in progress(range(math.ceil(feed.seconds)), math.ceil(feed.seconds), label):
        while taken < min(feed.total, (tick + 1) * per_tick):
            _wait(max(last_start + feed.interval_ms / 1000, started + (taken + 1) / per_tick / feed.clock.speed))
            last_start = time.perf_counter()
            due = feed.arrived(started)
            feed.clock.advance(due)
            result = runner.run_batch(runner.next_batch_id, feed.take(due - taken))
            samples.append(_sample(result, last_start - started, due - taken, runner.coordinator.storage))
            taken = due
    return samples


def _wait(until: float) -> None:
    delay = until - time.perf_counter()
    if delay > 0:
        time.sleep(delay)


def _sample(result: BatchResult, at_s: float, rows: int, storage: CheckpointStorage) -> dict[str, Any]:
    meta = result.checkpoint
    metadata_bytes = os.path.getsize(storage.path(metadata_path(meta.checkpoint_id)))
    at_checkpoint = sum(st.stats.get("changelog_bytes_at_checkpoint", st.stats.get("keyed_bytes", 0))
                        for st in meta.subtasks)
    # only numbers: a sample that kept the metadata would keep every checkpoint's handles alive, and cyclic GC
    # passes over them would show up as checkpoint spikes
    return {"at_s": at_s, "checkpoint_ms": result.checkpoint_ms, "rows": rows, "full_bytes": meta.state_bytes,
            "checkpointed_bytes": at_checkpoint, "metadata_bytes": metadata_bytes,
            "log_change_sets": max(len(st.changelog) for st in meta.subtasks)}


# -- variants ------------------------------------------------------------------------------------------------
def changelog_config(workload: str, variant: str, setup: Setup) -> ChangelogConfig | bool:
    """The blog's materialization interval, and spate's bound on the log since the last materialization
    (``materialize_after_bytes``) at a share of the workload's state; the change-set count bound (meant for
    Spark's second-long batches) out of the way of checkpoints every few hundred ms."""
    if variant != "changelog":
        return False
    bound_mb = setup.value_log_bound_mb if workload == "value" else setup.window_log_bound_mb
    return ChangelogConfig(materialization_interval_ms=setup.materialization_ms,
                           materialize_after_change_sets=100_000, materialize_after_bytes=int(bound_mb * MB))


@dataclass
class Variant:
    """One (workload, variant) run's places and settings."""

    workload: str
    variant: str
    workdir: str
    setup: Setup

    @property
    def root(self) -> str:
        return f"{self.workdir}/{self.workload}-{self.variant}"

    def runner(self, clock: InputClock, local_dir: str, **kwargs: Any) -> LocalRunner:
        job: Any = Put if self.workload == "value" else window_job
        return LocalRunner(job, key="k", checkpoint_root=self.root, parallelism=1, table="lmdb",
                           local_dir=local_dir, changelog=changelog_config(self.workload, self.variant, self.setup),
                           file_merging="across", clock=clock, **kwargs)


def prefill(runner: LocalRunner, keys: int) -> None:
    """``keys`` entries of live state, written through the state API (not measured), then checkpointed (and,
    with the changelog, materialized) and written back to disk, so the measured part starts from a settled
    state."""
    runner.run_batch(runner.next_batch_id, [{"k": 0, "v": PAYLOAD}])
    sub = runner.subtasks[0]
    backend, value = sub.keyed, sub.keyed.get_state(VALUE)  # type: ignore[union-attr]
    chunks = range(0, keys, PREFILL_CHUNK)
    for first in progress(chunks, len(chunks), "prefill"):
        for k in range(first, min(keys, first + PREFILL_CHUNK)):
            backend.set_current_key(k)  # type: ignore[union-attr]
            value.update(PAYLOAD)
    runner.run_batch(runner.next_batch_id, [])
    if sub.clog is not None:
        sub.clog.materialize_now(backend)  # type: ignore[arg-type]
        runner.run_batch(runner.next_batch_id, [])


def run_variant(v: Variant) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Measure one (workload, variant): its result row and its per-checkpoint samples."""
    s = v.setup
    value = v.workload == "value"
    keys = s.state_mb * 1_000_000 // ENTRY_BYTES if value else 0
    clock = InputClock(s.value_rows_per_s if value else s.window_rows_per_s, 1.0 if value else s.window_clock_speed)
    source = ValueInput(keys) if value else WindowInput(s.window_keys)
    feed = Feed(source.take, clock, s.value_seconds if value else s.window_seconds, s.interval_ms)
    local = f"{v.root}-local"
    with v.runner(clock, local) as runner:
        if value:
            prefill(runner, keys)
        # settled on disk too: otherwise the OS writes back the pre-fill's ~2 GB (the table and its snapshot), or
        # the previous variant's last gigabytes, during the first measured seconds, and every checkpoint's fsync
        # there waits behind it (measured: 0.5-1.6 s each, the run's slowest checkpoints, against ~35 ms after it)
        os.sync()
        samples = drive(runner, feed, f"{v.workload}/{v.variant}")
        live = _dir_bytes(local)
    shutil.rmtree(local, ignore_errors=True)
    recovery_s = recover(v, clock)
    return summarize(v, samples, keys, live, recovery_s, feed), samples


def recover(v: Variant, clock: InputClock) -> float:
    """Seconds for a new runner with an empty local directory to restore the last checkpoint and finish an
    empty batch: until its subtask's acknowledgement (its checkpoint is not committed), as ``bench scale``
    times a recovery; closing the runner after it is not counted."""
    acked: list[float] = []

    def stop(step: str, batch_id: int) -> None:
        if step == "after_acks":
            acked.append(time.perf_counter())
            raise _Stop

    local = f"{v.root}-recovery"
    started = time.perf_counter()
    with v.runner(clock, local, fault_injector=stop) as runner, contextlib.suppress(_Stop):
        runner.run_batch(runner.next_batch_id, [])
    shutil.rmtree(local, ignore_errors=True)
    return acked[0] - started


class _Stop(Exception):
    """Ends a recovery measurement before its checkpoint completes."""


def _dir_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def summarize(v: Variant, samples: list[dict[str, Any]], keys: int, live: int, recovery_s: float,
              feed: Feed) -> dict[str, Any]:
    cp = [x["checkpoint_ms"] for x in samples]
    full = [x["full_bytes"] for x in samples]
    return {"workload": v.workload, "variant": v.variant, "op": v.workload, "checkpoints_made": len(samples),
            "rows": feed.total, "input_rows_per_s": feed.clock.rows_per_s, "prefilled_keys": keys,
            "live_state_bytes": live,
            "checkpoint_ms_p50": _r(percentile(cp, 50)), "checkpoint_ms_p90": _r(percentile(cp, 90)),
            "checkpoint_ms_p99": _r(percentile(cp, 99)), "checkpoint_ms_p999": _r(percentile(cp, 99.9)),
            "checkpoint_ms_max": _r(max(cp)), "p999_is_max": len(cp) < MIN_CHECKPOINTS_FOR_P999,
            "checkpointed_bytes_p50": percentile([x["checkpointed_bytes"] for x in samples], 50),
            "full_checkpoint_bytes": full[-1], "full_checkpoint_bytes_p99": percentile(full, 99),
            "recovery_s": round(recovery_s, 3), **metadata_growth(samples)}


def metadata_growth(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """``_metadata`` bytes with 10 change sets in the log since the materialization, and with the longest log."""
    longest = max(samples, key=lambda x: x["log_change_sets"])
    at_10 = next((x for x in samples if x["log_change_sets"] == 10), None)
    return {"metadata_bytes_max": max(x["metadata_bytes"] for x in samples),
            "metadata_bytes_log10": at_10["metadata_bytes"] if at_10 else None,
            "metadata_bytes_longest_log": longest["metadata_bytes"],
            "longest_log_change_sets": longest["log_change_sets"]}


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 2)


# -- the benchmark -------------------------------------------------------------------------------------------
def bench_blog(quick: bool, out_dir: str = "bench-out") -> tuple[list[dict[str, Any]], str]:
    setup = QUICK if quick else FULL
    workdir = tempfile.mkdtemp(prefix="spate-bench-blog-")
    steps = [Variant(w, var, workdir, setup) for w in WORKLOADS for var in VARIANTS]
    results, series = [], {}
    try:
        for v in progress(steps, len(steps), "bench blog"):
            row, samples = run_variant(v)
            results.append(row)
            series[(v.workload, v.variant)] = [{k: x[k] for k in ("at_s", "checkpoint_ms", "full_bytes")}
                                               for x in samples]
            shutil.rmtree(v.root, ignore_errors=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    charts = plot_series(series, out_dir)
    return results, table(results, setup, charts)


def ratios(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per workload: full/changelog checkpoint durations, changelog/full size and recovery."""
    by = {(r["workload"], r["variant"]): r for r in results}
    out = []
    for w in WORKLOADS:
        c, f = by.get((w, "changelog")), by.get((w, "full"))
        if c is None or f is None:
            continue
        out.append({"workload": w, **{f"{q} full/changelog": _ratio(f[f"checkpoint_ms_{q}"], c[f"checkpoint_ms_{q}"])
                                      for q in ("p50", "p90", "p99", "p999")},
                    "size changelog/full": _ratio(c["full_checkpoint_bytes"], f["full_checkpoint_bytes"]),
                    "recovery changelog/full": _ratio(c["recovery_s"], f["recovery_s"]), "goals": GOALS[w]})
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a is not None and b else None


def table(results: list[dict[str, Any]], setup: Setup, charts: list[str]) -> str:
    rows = [{"workload": r["workload"], "variant": r["variant"], "checkpoints": r["checkpoints_made"],
             "p50 ms": r["checkpoint_ms_p50"], "p90 ms": r["checkpoint_ms_p90"], "p99 ms": r["checkpoint_ms_p99"],
             "p99.9 ms": r["checkpoint_ms_p999"], "checkpointed p50": human_bytes(r["checkpointed_bytes_p50"] or 0),
             "full checkpoint": human_bytes(r["full_checkpoint_bytes"]),
             "live state": human_bytes(r["live_state_bytes"]), "recovery s": r["recovery_s"],
             "_metadata (log 10 / longest)": f"{human_bytes(r['metadata_bytes_log10'] or 0)} / "
                                             f"{human_bytes(r['metadata_bytes_longest_log'])} "
                                             f"({r['longest_log_change_sets']})"} for r in results]
    few = [f"{r['workload']}/{r['variant']}" for r in results if r["p999_is_max"]]
    note = (f"\nbelow {MIN_CHECKPOINTS_FOR_P999:,} checkpoints ({', '.join(few)}), p99.9 is the maximum"
            if few else "")
    title = (f"spate bench blog: one subtask, lmdb, file merging across; value: {human_bytes(setup.state_mb * 1e6)}"
             f" pre-filled, {setup.value_rows_per_s:,} rows/s for {setup.value_seconds:g} s ({UPDATE_SHARE:.0%} "
             f"updates); window: sliding 10 s / 1 s, {setup.window_keys:,} keys, {setup.window_rows_per_s:,} rows/s "
             f"for {setup.window_seconds:g} s; checkpoint interval {setup.interval_ms} ms, materialization every "
             f"{setup.materialization_ms / 1000:g} s")
    return (format_table(rows, title=title) + note + "\n\n" + format_table(ratios(results), title="ratios")
            + "\n\ncharts: " + (", ".join(charts) if charts else "skipped (matplotlib is not installed)"))


# -- charts --------------------------------------------------------------------------------------------------
def plot_series(series: dict[tuple[str, str], list[dict[str, Any]]], out_dir: str) -> list[str]:
    """Like the blog's: checkpoint duration over time and full checkpoint size over time, per workload."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for metric, ylabel, name in (("checkpoint_ms", "checkpoint duration (ms)", "blog-durations.png"),
                                 ("full_bytes", "full checkpoint size (MB)", "blog-sizes.png")):
        fig, axes = plt.subplots(1, len(WORKLOADS), figsize=(6 * len(WORKLOADS), 4), squeeze=False)
        for ax, w in zip(axes[0], WORKLOADS, strict=True):
            _plot_workload(ax, series, w, metric, ylabel)
        fig.suptitle(f"spate bench blog: {ylabel} over time, changelog vs full snapshots")
        fig.tight_layout()
        path = os.path.join(out_dir, name)
        fig.savefig(path, dpi=100)
        plt.close(fig)
        paths.append(path)
    return paths


def _plot_workload(ax: Any, series: dict[tuple[str, str], list[dict[str, Any]]], workload: str, metric: str,
                   ylabel: str) -> None:
    scale = 1e-6 if metric == "full_bytes" else 1.0
    for variant in VARIANTS:
        points = series.get((workload, variant), [])
        ax.plot([p["at_s"] for p in points], [p[metric] * scale for p in points], label=variant,
                marker="." if len(points) < 200 else None, linewidth=0.8)
    ax.set_title(f"{workload} workload")
    ax.set_xlabel("time (s)")
    ax.set_ylabel(ylabel)
    if metric == "checkpoint_ms":
        ax.set_yscale("log")
    ax.legend()
