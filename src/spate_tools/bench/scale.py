"""``spate bench scale``: proven at 10 GB. One subtask on lmdb holds value state of 500-byte values, 1 GB and
10 GB of it in one invocation (0.2 GB and 1 GB with ``--quick``), with the changelog on (``changelog``) and off
(``full``), file merging across checkpoints.

Per state size and variant, each in a working directory of its own (removed before the next):

1. **no materialization** (changelog only, ``quiet_batches``; not in the batch figures): a table of its own
   loaded the same way, then a runner with the changelog on and every materialization trigger out of reach runs
   the measured phase's first ``quiet_batches`` batches (the same keys) on it; then it is removed. With the
   default triggers a materialization runs beside nearly every batch of the measured phase (one starts as soon as
   the last ends), so these are the batches to compare with, in the same run and at the same point of a table's
   life;
2. **load** (not measured): keys ``0..n-1`` (``n = size / 500 bytes``: 2M keys at 1 GB, 20M at 10 GB) written
   in bulk into the subtask's lmdb table, as ``bench blog`` and ``bench rescale`` pre-fill, by a runner with the
   changelog off, then one checkpoint: a full snapshot of the loaded state;
3. **measured phase**: a new runner with the variant's settings on the same root and local directory (it
   reuses the local table) runs one warm-up batch, then batches of ``updates`` random existing keys and
   ``new_keys`` new ones, through a ``BatchProcessor`` that overwrites each key's value in bulk (the value
   carries the batch id). The batches enter the subtask as Arrow tables grouped by key, with their key groups
   computed by Spark's hash, as a Spark task's rows do. Both variants of one size see the same keys. With the
   changelog, the phase goes on past ``batches`` until ``min_materializations`` materializations completed
   (at most ``max_batches``), so the run shows what a materialization does to the batches around it;
4. **copy floor** (``copy_s``): the bytes recovery reads (every segment the last checkpoint references, and its
   ``_metadata``) copied by the operating system to another directory on the same disk, each file fsynced,
   timed and deleted;
5. **recovery** (``recovery_s``): the local directory deleted, a new runner on the root at parallelism 1 with an
   empty local directory restores the last checkpoint and runs an empty batch up to its acknowledgements (its
   checkpoint is not committed): the wall time from constructing the runner until then. ``restore_s`` (extra)
   is the library's own figure for the restore (the slowest subtask's ``restore_ms``);
6. **rescaled recovery** (``recovery_rescaled_s``): the same at parallelism 2 (twice the parallelism), again
   with an empty local directory. After both, the restored subtasks' entries are counted (and, with
   ``verify=True``, every key's value read back and compared with the batch that wrote it last).

Figures per (size, variant): batch p50/p99 (the whole micro-batch: processing, snapshot and commit), checkpoint
p50/p99.9 (``BatchResult.checkpoint_ms``; with fewer than 1,000 checkpoints p99.9 is the maximum),
``materialization_s`` (the longest materialization of the phase, as the library records it: from its start
until the checkpoint that picks up its result; None without the changelog), the batch p99 of the batches while a
materialization ran (± ``NEAR`` batches) and of the others, the batch p50 and p99 with no materialization
(``batch_ms_p50_no_materialization``, ``batch_ms_p99_no_materialization``), those of the measured phase's
first as many batches (``batch_ms_p50_first_measured``, ...) and their ratios (``batch_p50_vs_no_materialization``,
``batch_p99_vs_no_materialization``), ``checkpoint_bytes`` (every byte
the last checkpoint references), and ``anon_rss_mb_max``: the largest ``RssAnon`` of the variant's process
(sampled every 50 ms from the end of the load to the end of the rescaled recovery; lmdb's mapped pages are
file-backed and do not count; the load's own peak is ``anon_rss_mb_load``, and ``anon_rss_mb_by_phase`` splits
the maximum into the batches with no materialization, the measured phase with the copy, the recovery and the
rescaled recovery).

Before it starts, the benchmark checks the free space on the disk of its working directory (``--out``'s) and
refuses with the figure needed: :data:`~spate_tools.bench.scale_watch.DISK_FACTOR` × the largest state size.
Each variant runs in a process of its own (:func:`variant_in_process`), so that its memory figures are its own;
there, the process's private memory is capped at what the machine had available
(:func:`~spate_tools.bench.scale_watch.memory_guard`): a variant that needs more fails with an out-of-memory line
in the table and the run goes on with the next.

The modules beside this one hold the rest: :mod:`~spate_tools.bench.scale_workload` (the sizes, values and keys),
:mod:`~spate_tools.bench.scale_watch` (the process's memory and disk, watched), :mod:`~spate_tools.bench.disk_floor`
(the copy floor) and :mod:`~spate_tools.bench.scale_report` (the goals, the table and the chart).
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from spate.changelog.state import ChangelogConfig
from spate.layout import metadata_path
from spate.report import percentile, progress
from spate.runtime.batch import KeyedBatch
from spate.runtime.local import BatchResult, LocalRunner
from spate.state.bulk import BulkValueState
from spate_tools.bench.disk_floor import copy_floor, dir_bytes
from spate_tools.bench.scale_report import (
    MIN_CHECKPOINTS_FOR_P999,
    NEAR,
    materialization_spans,
    plot_times,
    quiet_figures,
    rounded,
    table,
)
from spate_tools.bench.scale_watch import (
    MEMORY_RESERVE,
    OutOfDisk,
    Sampler,
    check_disk,
    guard_disk,
    memory_guard,
    out_of_memory,
    release_memory,
)
from spate_tools.bench.scale_workload import (
    FULL,
    GB,
    MAX_PARALLELISM,
    QUICK,
    VALUE,
    VALUE_BYTES,
    VARIANTS,
    Overwrite,
    Setup,
    check_key_groups,
    key_groups,
    keyed_batch,
    value_of,
    version_of,
)

LOAD_VERSION = 0  # the version the loaded values carry; a measured batch's values carry its batch id (≥ 2)
LOAD_CHUNK = 500_000  # keys per bulk write while loading
NEVER = 10**15
# the changelog on, every materialization trigger out of reach (the batches with no materialization beside them)
NO_MATERIALIZATION = ChangelogConfig(materialization_interval_ms=NEVER, materialize_after_change_sets=NEVER,
                                     materialize_after_bytes=NEVER)


class _Prepared(LocalRunner):
    """A LocalRunner whose single subtask takes a prepared :class:`KeyedBatch` (as a Spark task builds it);
    without one (``run_batch(n, [])``) it routes as usual."""

    prepared: KeyedBatch | None = None

    def _route(self, rows: Any) -> list[Any]:
        if self.prepared is None:
            return super()._route(rows)
        assert self.parallelism == 1
        batch, self.prepared = self.prepared, None
        return [batch]

    def __enter__(self) -> _Prepared:
        return self


# -- one (size, variant) -----------------------------------------------------------------------------------------
@dataclass
class Run:
    """One (state size, variant): its places, settings and input."""

    state_gb: float
    variant: str
    workdir: str
    setup: Setup
    keys: int = field(init=False)

    def __post_init__(self) -> None:
        self.keys = int(self.state_gb * GB) // VALUE_BYTES

    @property
    def label(self) -> str:
        return f"bench scale {self.state_gb:g} GB {self.variant}"

    @property
    def root(self) -> str:
        return f"{self.workdir}/root"

    def runner(self, changelog: bool | ChangelogConfig, parallelism: int = 1, local_dir: str | None = None,
               **kwargs: Any) -> _Prepared:
        return _Prepared(Overwrite, key="k", checkpoint_root=self.root, parallelism=parallelism,
                         max_parallelism=MAX_PARALLELISM, table="lmdb", local_dir=local_dir or f"{self.workdir}/local",
                         changelog=changelog, file_merging="across", **kwargs)


def load(run: Run) -> float:
    """Keys ``0..keys-1`` with the load's value, written in bulk into the subtask's table, then a full snapshot
    of them (changelog off). Returns the seconds it took."""
    started = time.perf_counter()
    with run.runner(changelog=False) as runner:
        runner.run_batch(runner.next_batch_id, [])  # opens the subtask's state
        sub = runner.subtasks[0]
        assert sub.keyed is not None
        bulk = BulkValueState(sub.keyed, sub.keyed.get_state(VALUE))
        value = value_of(LOAD_VERSION)
        chunks = range(0, run.keys, LOAD_CHUNK)
        for first in progress(chunks, len(chunks), f"{run.label}: load"):
            batch = keyed_batch(np.arange(first, min(run.keys, first + LOAD_CHUNK), dtype=np.int64))
            bulk.put_many(batch, [value] * len(batch))
        runner.run_batch(runner.next_batch_id, [])  # the loaded state's checkpoint
    return time.perf_counter() - started


@dataclass
class Measured:
    """What the measured phase leaves: per-batch samples, the last checkpoint's files, the input's end."""

    samples: list[dict[str, Any]]
    segments: list[tuple[str, int, int]]  # (absolute path, offset, length) of every segment, and the _metadata
    checkpoint_bytes: int
    next_key: int
    local_bytes: int


@dataclass
class Feed:
    """The measured batches' keys: ``updates`` random existing keys and ``new_keys`` new ones a batch;
    ``versions[k]`` (when checked) follows the batch that last wrote key k."""

    rng: np.random.Generator
    next_key: int
    updates: int
    new_keys: int
    versions: np.ndarray | None

    def batch(self, runner: _Prepared) -> BatchResult:
        keys = np.unique(np.concatenate([self.rng.integers(0, self.next_key, self.updates, dtype=np.int64),
                                         np.arange(self.next_key, self.next_key + self.new_keys, dtype=np.int64)]))
        self.next_key += self.new_keys
        runner.prepared = keyed_batch(keys)
        result = runner.run_batch(runner.next_batch_id, [])
        if self.versions is not None:
            self.versions[keys] = result.batch_id
        return result


def measure(run: Run, feed: Feed) -> Measured:
    """The warm-up batch, then the measured batches."""
    s, changelog = run.setup, run.variant == "changelog"
    samples: list[dict[str, Any]] = []
    last: BatchResult | None = None
    with run.runner(changelog=changelog) as runner:
        # warm-up: the first batch of this runner checks and reuses the loaded local table; a materialization it
        # starts (a log long enough since the load) runs beside the first measured batch on
        warm = feed.batch(runner)
        started_before = bool(warm.checkpoint.subtasks[0].stats.get("materialization_started"))
        started = time.perf_counter()
        for i in range(s.max_batches):
            batch_started = time.perf_counter() - started
            last = feed.batch(runner)
            st = last.checkpoint.subtasks[0]
            samples.append({"batch": i, "at_s": round(batch_started, 3), "batch_ms": round(last.batch_ms, 2),
                            "checkpoint_ms": round(last.checkpoint_ms, 2),
                            "materialization_started": bool(st.stats.get("materialization_started")),
                            "materialization_running": started_before and i == 0,
                            "materialization_ms": st.stats.get("materialization_ms"),
                            "checkpoint_bytes": last.checkpoint.state_bytes})
            done = sum(x["materialization_ms"] is not None for x in samples)
            _status(f"{run.label}: batch {i + 1} ({s.batches} at least), {done} materialization(s) completed, "
                    f"{time.perf_counter() - started:.0f} s")
            _guard_disk(run, samples)
            wanted = s.batches if changelog else (s.full_batches or s.batches)
            if i + 1 >= wanted and (not changelog or done >= s.min_materializations):
                break
        _status(None)
        assert last is not None
        meta, storage = last.checkpoint, runner.coordinator.storage
        segments = [(storage.path(ref.path), ref.offset, ref.length) for ref in meta.segments()]
        meta_path = storage.path(metadata_path(meta.checkpoint_id))
        segments.append((meta_path, 0, os.path.getsize(meta_path)))
        checkpoint_bytes = meta.state_bytes
    return Measured(samples, segments, checkpoint_bytes, feed.next_key, dir_bytes(f"{run.workdir}/local"))


def no_materialization(run: Run) -> list[float]:
    """``quiet_batches`` batches (ms each) with the changelog on and its materialization triggers out of reach, on
    a table of their own, loaded as the measured phase's is and removed after: the measured phase's first batches
    (the same keys) with no materialization beside them, at the same point of a table's life. Nothing of them is
    left to the measured phase: the pages they dirtied go with their files (run on the measured phase's own table,
    they left it a gigabyte of log, and its 1 GB batches ran a quarter slower from the fifteenth on)."""
    s = run.setup
    own = Run(run.state_gb, run.variant, f"{run.workdir}/no-materialization", s)
    os.makedirs(own.workdir)
    batch_ms: list[float] = []
    try:
        load(own)
        feed = Feed(_measured_keys(run), own.keys, s.updates, s.new_keys, None)
        with own.runner(changelog=NO_MATERIALIZATION) as runner:
            feed.batch(runner)  # warm-up, as in the measured phase
            for i in range(s.quiet_batches):
                batch_ms.append(feed.batch(runner).batch_ms)
                _status(f"{run.label}: no materialization, batch {i + 1} of {s.quiet_batches}")
                _guard_disk(own, [])
            _status(None)
    finally:
        shutil.rmtree(own.workdir, ignore_errors=True)
    return batch_ms


def _measured_keys(run: Run) -> np.random.Generator:
    """The measured phase's random keys: the same for both variants of a size."""
    return np.random.default_rng([37, int(run.state_gb * 1000)])


def _guard_disk(run: Run, samples: list[dict[str, Any]]) -> None:
    try:
        guard_disk(run.workdir, f"{run.workdir}/local")
    except OutOfDisk as e:
        e.samples = samples  # what the variant measured before it stopped
        raise


def _status(line: str | None) -> None:
    """A progress line on standard error, redrawn in place, only when it is a terminal (None: end it)."""
    if sys.stderr.isatty():
        sys.stderr.write("\n" if line is None else f"\r{line}\033[K")
        sys.stderr.flush()


class _Stop(Exception):
    """Ends a recovery measurement before its checkpoint completes."""


def _stop_after_acks(step: str, batch_id: int) -> None:
    if step == "after_acks":
        raise _Stop


def recover(run: Run, parallelism: int, expected_keys: int, versions: np.ndarray | None) -> dict[str, Any]:
    """A new runner at ``parallelism`` with an empty local directory restores the last checkpoint and runs an
    empty batch up to its acknowledgements: the seconds that took, the library's restore figures, and whether
    the restored state is the one written (entry count; with ``versions``, every value)."""
    local = f"{run.workdir}/recovery-{parallelism}"
    started = time.perf_counter()
    runner = run.runner(changelog=run.variant == "changelog", parallelism=parallelism, local_dir=local,
                        fault_injector=_stop_after_acks)
    try:
        with contextlib.suppress(_Stop):
            runner.run_batch(runner.next_batch_id, [])
        elapsed = time.perf_counter() - started
        subs = runner.subtasks
        entries = sum(_entries(sub.keyed) for sub in subs if sub.keyed is not None)
        values_ok = None if versions is None else all(_values_match(sub, versions[:expected_keys]) for sub in subs)
        return {"s": round(elapsed, 3), "restore_s": round(max(sub.recovery.restore_ms for sub in subs) / 1000, 3),
                "restore_bytes": sum(sub.recovery.restore_bytes for sub in subs),
                "how": sorted({sub.recovery.recovery for sub in subs}), "entries": entries,
                "ok": entries == expected_keys and values_ok is not False}
    finally:
        runner.close()
        shutil.rmtree(local, ignore_errors=True)


def _entries(keyed: Any) -> int:
    """The state entries of a subtask's table; counted key group by key group where the table does not know
    (a table over read-only bases: a restore from a native snapshot)."""
    count = keyed.table.entry_count()
    if count is not None:
        return int(count)
    return sum(len(keyed.table.key_group_flat(kg)) // 2 for kg in keyed.key_groups)


def _values_match(sub: Any, versions: np.ndarray) -> bool:
    """Every key the subtask owns holds the value of the batch that wrote it last."""
    keys = np.arange(len(versions), dtype=np.int64)
    owned = sub.keyed.key_groups
    kgs = key_groups(keys)
    mine = keys[(kgs >= owned.start) & (kgs < owned.stop)]
    if not len(mine):
        return True
    batch = keyed_batch(mine)
    got = BulkValueState(sub.keyed, sub.keyed.get_state(VALUE)).get_many(batch)
    if any(v is None for v in got):
        return False
    return bool(np.array_equal(np.array([version_of(v) for v in got], dtype=np.int64),
                               versions[np.asarray(batch.keys, dtype=np.int64)]))


def run_variant(run: Run, sampler: Sampler, verify: bool) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One (size, variant): its result row and its per-batch samples."""
    s = run.setup
    os.makedirs(run.workdir)
    versions = np.full(run.keys + s.new_keys * (s.max_batches + 1), -1, dtype=np.int64) if verify else None
    if versions is not None:
        versions[:run.keys] = LOAD_VERSION
    sampler.watch(run.workdir)
    sampler.take()
    quiet = no_materialization(run) if run.variant == "changelog" and s.quiet_batches else []
    phases = {"no materialization": sampler.take()} if quiet else {}
    load_s = load(run)
    anon_load = sampler.take()
    m = measure(run, Feed(_measured_keys(run), run.keys, s.updates, s.new_keys, versions))
    shutil.rmtree(f"{run.workdir}/local")  # before the copy: recovery starts from an empty local directory
    copy_s = copy_floor(m.segments, f"{run.workdir}/copy", sampler.sample_disk)  # its bytes count in the disk needed
    phases["measure"] = sampler.take()
    rec = recover(run, 1, m.next_key, versions)
    phases["recovery"] = sampler.take()
    rescaled = recover(run, 2, m.next_key, versions)
    phases["rescaled"] = sampler.take()
    row = summarize(run, m, copy_s, rec, rescaled, max(phases.values()))
    row.update(quiet_figures(quiet, [x["batch_ms"] for x in m.samples[:len(quiet)]]))
    disk = sampler.take_disk()
    sampler.watch(None)
    row.update({"anon_rss_mb_load": anon_load, "anon_rss_mb_by_phase": phases, "load_s": round(load_s, 1),
                "disk_bytes_max": disk,
                "disk_per_state": round(disk / (run.state_gb * GB), 2), "lmdb_bytes": m.local_bytes})
    return row, m.samples


def variant_here(run: Run, verify: bool) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One (size, variant) in this process, its memory watched and capped; a variant that runs out of disk or
    memory gets a failed row (what it measured before, and why)."""
    with Sampler() as sampler, memory_guard() as limit:
        try:
            return run_variant(run, sampler, verify)
        except OutOfDisk as e:
            return failed(run, str(e), e.samples), e.samples
        except Exception as e:
            if not out_of_memory(e):
                raise
            return failed(run, f"out of memory: the process's private memory reached its limit "
                               f"({(limit or 0) / 2**30:.1f} GiB: what the machine had available at the start, "
                               f"less {MEMORY_RESERVE / 2**30:g} GiB)"), []
        finally:
            sampler.watch(None)
            release_memory()


def variant_in_process(run: Run, verify: bool) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """:func:`variant_here` in a new process (spawned: nothing of this one's heap or threads), so that each
    variant's ``anon_rss_mb_max`` is its own: in one process, the heap the earlier variants left (Python keeps
    its small-object arenas while any object in them lives) counted in the later ones, about 400 MB at 10 GB.
    A process that dies (the kernel's OOM killer) gets a failed row."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        try:
            return pool.submit(variant_here, run, verify).result()
        except BrokenProcessPool as e:
            return failed(run, f"the variant's process died: {e}"), []


def failed(run: Run, error: str, samples: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    """The row of a variant that could not finish: its contract keys without figures, and why; the batches it
    measured before it stopped, if any, give the batch and checkpoint figures."""
    row: dict[str, Any] = {
        "state_gb": run.state_gb, "variant": run.variant, "keys": run.keys,
        **{k: None for k in ("batch_ms_p50", "batch_ms_p99", "checkpoint_ms_p50", "checkpoint_ms_p999",
                             "materialization_s", "checkpoint_bytes", "recovery_s", "recovery_rescaled_s",
                             "copy_s", "anon_rss_mb_max")}, "error": error, "batches": len(samples)}
    if samples:
        batch_ms, checkpoint_ms = [x["batch_ms"] for x in samples], [x["checkpoint_ms"] for x in samples]
        row.update(batch_ms_p50=percentile(batch_ms, 50), batch_ms_p99=percentile(batch_ms, 99),
                   checkpoint_ms_p50=percentile(checkpoint_ms, 50), checkpoint_ms_p999=max(checkpoint_ms))
    return row


def summarize(run: Run, m: Measured, copy_s: float, rec: dict[str, Any], rescaled: dict[str, Any],
              anon_max: float) -> dict[str, Any]:
    samples = m.samples
    batch = [x["batch_ms"] for x in samples]
    cp = [x["checkpoint_ms"] for x in samples]
    spans, done = materialization_spans(samples)
    near = {i for a, b in spans for i in range(a - NEAR, b + NEAR + 1)}
    around = [x["batch_ms"] for i, x in enumerate(samples) if i in near]
    away = [x["batch_ms"] for i, x in enumerate(samples) if i not in near]
    return {"state_gb": run.state_gb, "variant": run.variant, "keys": m.next_key,
            "batch_ms_p50": rounded(percentile(batch, 50)), "batch_ms_p99": rounded(percentile(batch, 99)),
            "checkpoint_ms_p50": rounded(percentile(cp, 50)), "checkpoint_ms_p999": rounded(percentile(cp, 99.9)),
            "materialization_s": round(max(done) / 1000, 2) if done else None,
            "checkpoint_bytes": m.checkpoint_bytes, "recovery_s": rec["s"], "recovery_rescaled_s": rescaled["s"],
            "copy_s": round(copy_s, 3), "anon_rss_mb_max": anon_max,
            # beyond the contract
            "batches": len(samples), "p999_is_max": len(cp) < MIN_CHECKPOINTS_FOR_P999,
            "checkpoint_ms_p99": rounded(percentile(cp, 99)), "checkpoint_ms_max": rounded(max(cp)),
            "materializations": len(done),
            "materialization_s_p50": round(statistics.median(done) / 1000, 2) if done else None,
            "batch_ms_p99_materializing": rounded(percentile(around, 99)),
            "batch_ms_p99_other": rounded(percentile(away, 99)),
            "restore_s": rec["restore_s"], "restore_rescaled_s": rescaled["restore_s"],
            "restore_bytes": rec["restore_bytes"], "restore_rescaled_bytes": rescaled["restore_bytes"],
            "recovered": rec["how"], "recovered_rescaled": rescaled["how"],
            "recovered_entries": rec["entries"], "recovered_rescaled_entries": rescaled["entries"],
            "state_checked": bool(rec["ok"] and rescaled["ok"])}


def rows_log(path: str) -> Callable[[dict[str, Any]], None]:
    """An ``on_row`` that appends each finished row to ``path`` as one JSON line (the file starts empty), so a
    run stopped in its last variant keeps the rows it measured."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    open(path, "w").close()

    def append(row: dict[str, Any]) -> None:
        with open(path, "a") as f:
            f.write(json.dumps(row) + "\n")

    return append


# -- the benchmark -----------------------------------------------------------------------------------------------
def bench_scale(quick: bool, *, out_dir: str = "bench-out", sizes_gb: Sequence[float] | None = None,
                batches: int | None = None, verify: bool = False, chart: bool = True,
                variants: Sequence[str] = VARIANTS, on_row: Callable[[dict[str, Any]], None] | None = None,
                isolate: bool = True, **setup: Any) -> tuple[list[dict[str, Any]], str]:
    """Rows per (state size, variant) and the table; the chart ``scale-times.png`` in ``out_dir``. ``sizes_gb``,
    ``batches`` and the other :class:`Setup` fields override the run's sizes (tests run tiny ones);
    ``verify`` reads every restored value back; ``variants`` in the order they run; ``on_row`` gets each
    row as soon as its variant finished (a long run keeps what it measured). ``isolate``: each variant in a
    process of its own (:func:`variant_in_process`; a script that calls this does so under
    ``if __name__ == "__main__":``, as any code that spawns processes); False: in this one (tests that patch the
    bench)."""
    base = QUICK if quick else FULL
    s = Setup(sizes_gb=tuple(sizes_gb or base.sizes_gb), batches=batches or base.batches,
              **{k: setup.get(k, getattr(base, k)) for k in ("full_batches", "updates", "new_keys",
                                                              "min_materializations", "max_batches",
                                                              "quiet_batches")})
    os.makedirs(out_dir, exist_ok=True)
    check_disk(out_dir, s.sizes_gb)
    check_key_groups()
    workdir = tempfile.mkdtemp(prefix=".spate-bench-scale-", dir=out_dir)  # on --out's disk (not a RAM /tmp)
    runs = [Run(gb, v, f"{workdir}/{gb:g}gb-{v}", s) for gb in s.sizes_gb for v in variants]
    results, series = [], {}
    started = time.perf_counter()
    try:
        for run in runs:
            check_disk(workdir, [run.state_gb])
            try:
                row, samples = variant_in_process(run, verify) if isolate else variant_here(run, verify)
            finally:
                shutil.rmtree(run.workdir, ignore_errors=True)  # every variant's files go before the next
            results.append(row)
            series[(run.state_gb, run.variant)] = samples
            if on_row is not None:
                on_row(row)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    path = plot_times(series, out_dir) if chart else None
    return results, table(results, s, time.perf_counter() - started) + (f"\nchart: {path}" if path else "")
