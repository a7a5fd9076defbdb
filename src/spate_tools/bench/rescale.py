"""``spate bench rescale``: online rescaling (``LocalRunner.rescale``) against a normal batch and against stop +
restart at the new parallelism, for value state of 10 MB, 100 MB and 1 GB (10 MB only with ``--quick``).

One machine, in process: a :class:`LocalRunner` on lmdb with the changelog on, max parallelism 128, a persistent
local directory. The job and its input are ``spate bench blog``'s value workload (:class:`~spate_tools.bench.blog.Put`
keeps each key's latest 500-byte value; :class:`~spate_tools.bench.blog.ValueInput` makes the rows). Per state size:

1. pre-fill the state at parallelism 4 (not measured): keys written in bulk into each subtask's state, checkpointed
   and materialized, so the measured part starts from a settled checkpoint;
2. batches until one does no clean-up work (``settle_batches``: after an online rescale the new subtasks fold the
   old tables they read from into their own a bounded number of entries per batch), 3 normal batches at 4, then
   ``rescale(8)`` and one batch (online 4 → 8);
3. the same at 8, then ``rescale(4)`` and one batch (online 8 → 4);
4. stop + restart: close the runner, a new one on the same root and local directory at 8 runs one batch (its
   local copies are of another parallelism, so it restores from checkpoint storage); again back to 4.

A normal batch is 10,000 rows: 70 % updates of random existing keys, 30 % new keys (the blog's mix; ~5 MB of
values, so the state grows ~1.5 MB per batch: ``state_bytes`` is measured, not assumed). ``normal_batch_ms`` is
the median of the 3 normal batches right before the rescale, at the old parallelism; ``online_ms`` the rescaling
batch's ``batch_ms``; ``restart_ms`` from constructing the new runner until its first batch is done.

Bytes: ``bytes_read`` is what the rescaling batch's subtasks read from checkpoint storage (``restore_bytes``),
``local_copy_bytes`` what they copied entry by entry from local lmdb copies of the old parallelism and
``local_moved_bytes`` the size of the local copies they took over as they were (moved, or hard-linked as read-only
bases: no bytes are copied; see :mod:`spate.runtime.rescale`). ``moved_bytes`` is the share
of the state in key groups that moved: every new subtask inherits the local state of at most one old subtask (the
one it overlaps most in key groups, ties to the lowest index, each old subtask inherited once) and every other key
group of its range moved. Per key group bytes are those of the base checkpoint's handles (materialized snapshot
and change sets); ``state_bytes`` is their sum.

Charts: ``rescale.png`` (each timing per state size and direction) and ``rescale-times.png`` (normal, online and
restart side by side on one log axis, per direction).
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from spate.checkpoint.metadata import CheckpointMetadata
from spate.keygroups import compile_key_hasher, key_group_range
from spate.report import format_table, human_bytes, progress
from spate.runtime.local import BatchResult, LocalRunner
from spate.snapshot.handles import NativeSnapshotHandle
from spate.state.bulk import BulkValueState
from spate_tools.bench.blog import ENTRY_BYTES, PAYLOAD, PREFILL_CHUNK, VALUE, Put, ValueInput

STATE_MB = (10, 100, 1_000)
QUICK_STATE_MB = (10,)
BATCH_ROWS = 10_000
NORMAL_BATCHES = 3
MAX_SETTLE_BATCHES = 250
MAX_PARALLELISM = 128
OLD_P, NEW_P = 4, 8
BULK_PUT = 50_000  # keys per bulk write during pre-fill
GOALS = "at 1 GB: online/normal ≤ 2×, restart/online ≥ 10×, bytes read ≤ moved key groups' bytes"


def key_group_bytes(meta: CheckpointMetadata) -> dict[int, int]:
    """Bytes per key group of everything ``meta`` references for keyed state: materialized snapshots and the
    change sets since."""
    out: Counter[int] = Counter()
    for st in meta.subtasks:
        for h in (*st.keyed, *st.changelog):
            if isinstance(h, NativeSnapshotHandle):  # lmdb's own file: its bytes spread over its key groups
                for kg in h.held:
                    out[kg] += h.size // len(h.groups)
                continue
            for kg, (_, length) in h.offsets.items():
                out[kg] += length
    return dict(out)


def inherited(max_p: int, old_p: int, new_p: int) -> list[int | None]:
    """For each new subtask, the old subtask whose local state it takes over (None: none). Each new subtask
    takes the not yet taken old subtask it overlaps most in key groups (ties: the lowest index)."""
    old = [key_group_range(max_p, old_p, i) for i in range(old_p)]
    taken: set[int] = set()
    out: list[int | None] = []
    for j in range(new_p):
        new = key_group_range(max_p, new_p, j)
        best, best_overlap = None, 0
        for i, r in enumerate(old):
            overlap = max(0, min(new.stop, r.stop) - max(new.start, r.start))
            if i not in taken and overlap > best_overlap:
                best, best_overlap = i, overlap
        if best is not None:
            taken.add(best)
        out.append(best)
    return out


def moved_key_groups(max_p: int, old_p: int, new_p: int) -> set[int]:
    """Key groups whose new subtask does not inherit the local state that held them."""
    moved: set[int] = set()
    for j, i in enumerate(inherited(max_p, old_p, new_p)):
        kept = key_group_range(max_p, old_p, i) if i is not None else range(0)
        moved.update(kg for kg in key_group_range(max_p, new_p, j) if kg not in kept)
    return moved


# -- driving the runner ----------------------------------------------------------------------------------------
@dataclass
class Job:
    """One state size's checkpoint root, local directory and input."""

    root: str
    local_dir: str
    source: ValueInput

    def runner(self, parallelism: int) -> LocalRunner:
        return LocalRunner(Put, key="k", checkpoint_root=self.root, parallelism=parallelism,
                           max_parallelism=MAX_PARALLELISM, table="lmdb", local_dir=self.local_dir, changelog=True)

    def batch(self, runner: LocalRunner) -> BatchResult:
        return runner.run_batch(runner.next_batch_id, self.source.take(BATCH_ROWS))


def prefill(runner: LocalRunner, keys: int, label: str) -> None:
    """Keys ``0..keys-1`` with a 500-byte value, written in bulk into the subtask owning each (not measured),
    then checkpointed and materialized."""
    runner.run_batch(runner.next_batch_id, [])  # opens every subtask's state
    hash_long = compile_key_hasher(["long"])
    p, max_p = runner.parallelism, runner.max_parallelism
    bulk = []
    for sub in runner.subtasks:
        assert sub.keyed is not None
        bulk.append(BulkValueState(sub.keyed, sub.keyed.get_state(VALUE)))
    pending: list[list[int]] = [[] for _ in range(p)]

    def flush(i: int) -> None:
        bulk[i].put_many(pending[i], [PAYLOAD] * len(pending[i]))
        pending[i] = []

    chunks = range(0, keys, PREFILL_CHUNK)
    for first in progress(chunks, len(chunks), label):
        for k in range(first, min(keys, first + PREFILL_CHUNK)):
            i = hash_long(k) % max_p * p // max_p
            pending[i].append(k)
            if len(pending[i]) == BULK_PUT:
                flush(i)
    for i in range(p):
        if pending[i]:
            flush(i)
    runner.run_batch(runner.next_batch_id, [])
    for sub in runner.subtasks:
        if sub.clog is not None:
            sub.clog.materialize_now(sub.keyed)  # type: ignore[arg-type]
    runner.run_batch(runner.next_batch_id, [])


def settle(job: Job, runner: LocalRunner) -> tuple[int, float]:
    """Batches until one folds nothing: after an online rescale, the new subtasks move the old tables' entries
    they read from into their own a bounded number per batch, so the first batches at the new parallelism are
    not normal ones yet. Returns how many batches it took (at most :data:`MAX_SETTLE_BATCHES`) and their median ms."""
    times = []
    for _ in range(MAX_SETTLE_BATCHES):
        result = job.batch(runner)
        times.append(result.batch_ms)
        if not any(st.stats.get("folded_entries", 0) for st in result.checkpoint.subtasks):
            break
    return len(times), statistics.median(times)


def normal_batches(job: Job, runner: LocalRunner) -> tuple[float, BatchResult]:
    """The median ``batch_ms`` of :data:`NORMAL_BATCHES` normal batches, and the last one's result."""
    results = [job.batch(runner) for _ in range(NORMAL_BATCHES)]
    return statistics.median(r.batch_ms for r in results), results[-1]


def online(job: Job, runner: LocalRunner, new_p: int, state_mb: int) -> dict[str, Any]:
    """Normal batches at the runner's parallelism, then ``rescale(new_p)`` and one batch: the row's online part."""
    old_p = runner.parallelism
    settled, settle_ms = settle(job, runner)
    normal_ms, last = normal_batches(job, runner)
    base = last.checkpoint
    started = time.perf_counter()
    runner.rescale(new_p)  # closes the old subtasks (their lmdb state stays on disk) and makes the new ones
    rescale_call_ms = (time.perf_counter() - started) * 1000
    result = job.batch(runner)
    subtasks = result.checkpoint.subtasks
    per_kg = key_group_bytes(base)
    moved = moved_key_groups(base.max_parallelism, old_p, new_p)
    state_bytes = sum(per_kg.values())
    moved_bytes = sum(n for kg, n in per_kg.items() if kg in moved)
    bytes_read = sum(st.restore_bytes for st in subtasks)
    local_copy_bytes = sum(st.stats.get("local_copy_bytes", 0) for st in subtasks)
    local_moved_bytes = sum(st.stats.get("local_moved_bytes", 0) for st in subtasks)
    restore_ms = max((st.restore_ms for st in subtasks), default=0.0)
    return {"variant": f"{old_p}->{new_p}", "state_mb": state_mb, "direction": f"{old_p}->{new_p}",
            "online_ms": round(result.batch_ms, 1), "normal_batch_ms": round(normal_ms, 1),
            "bytes_read": bytes_read, "local_copy_bytes": local_copy_bytes, "local_moved_bytes": local_moved_bytes,
            "moved_bytes": moved_bytes,
            "state_bytes": state_bytes, "checkpoint_bytes": base.state_bytes,
            "bytes_read_share": _share(bytes_read, state_bytes), "moved_share": _share(moved_bytes, state_bytes),
            "rescale_call_ms": round(rescale_call_ms, 1), "online_restore_ms": round(restore_ms, 1),
            "online_checkpoint_ms": round(result.checkpoint_ms, 1),
            "recovery": dict(Counter(st.recovery for st in subtasks)), "keys": job.source.next_key,
            "batch_rows": BATCH_ROWS, "settle_batches": settled,
            "settle_batch_ms_p50": round(settle_ms, 1)}


def restart(job: Job, parallelism: int) -> tuple[float, BatchResult]:
    """A new runner at ``parallelism`` on the job's root and local directory, and one batch: (ms, result)."""
    started = time.perf_counter()
    runner = job.runner(parallelism)
    try:
        result = job.batch(runner)
        return (time.perf_counter() - started) * 1000, result
    finally:
        runner.close()


def run_size(state_mb: int, workdir: str) -> list[dict[str, Any]]:
    """Both directions' rows for one state size."""
    keys = state_mb * 1_000_000 // ENTRY_BYTES
    job = Job(f"{workdir}/root-{state_mb}", f"{workdir}/local-{state_mb}", ValueInput(keys))
    try:
        runner = job.runner(OLD_P)
        try:
            prefill(runner, keys, f"bench rescale: prefill {state_mb} MB")
            up = online(job, runner, NEW_P, state_mb)
            down = online(job, runner, OLD_P, state_mb)
        finally:
            runner.close()
        for row, p in ((up, NEW_P), (down, OLD_P)):
            ms, result = restart(job, p)
            row["restart_ms"] = round(ms, 1)
            row["restart_bytes_read"] = sum(st.restore_bytes for st in result.checkpoint.subtasks)
            row["online/normal"] = _ratio(row["online_ms"], row["normal_batch_ms"])
            row["restart/online"] = _ratio(row["restart_ms"], row["online_ms"])
        return [up, down]
    finally:
        shutil.rmtree(job.root, ignore_errors=True)
        shutil.rmtree(job.local_dir, ignore_errors=True)


def _share(a: int, b: int) -> float | None:
    return round(a / b, 4) if b else None


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 2) if b else None


# -- the benchmark ---------------------------------------------------------------------------------------------
def bench_rescale(quick: bool, out_dir: str | None = None) -> tuple[list[dict[str, Any]], str]:
    """The rows (one per state size and direction) and the table; with ``out_dir``, also the chart
    ``rescale-times.png`` there (normal, online and restart side by side)."""
    sizes = QUICK_STATE_MB if quick else STATE_MB
    workdir = tempfile.mkdtemp(prefix="spate-bench-rescale-")
    results: list[dict[str, Any]] = []
    try:
        for state_mb in progress(sizes, len(sizes), "bench rescale"):
            results.extend(run_size(state_mb, workdir))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    chart = plot_times(results, out_dir) if out_dir is not None else None
    return results, table(results) + (f"\nchart: {chart}" if chart else "")


def table(results: list[dict[str, Any]]) -> str:
    rows = [{"state size": f"{r['state_mb']:,} MB", "direction": r["direction"],
             "normal batch ms": r["normal_batch_ms"], "online ms": r["online_ms"], "restart ms": r["restart_ms"],
             "online/normal": r["online/normal"], "restart/online": r["restart/online"],
             "read from storage": human_bytes(r["bytes_read"]),
             "local copies: copied / moved or linked": f"{human_bytes(r['local_copy_bytes'])} / "
                                                       f"{human_bytes(r['local_moved_bytes'])}",
             "moved key groups": human_bytes(r["moved_bytes"]), "state bytes": human_bytes(r["state_bytes"]),
             "read share": r["bytes_read_share"], "moved share": r["moved_share"],
             "restart read": human_bytes(r["restart_bytes_read"]),
             "recovery": ", ".join(f"{k} {n}" for k, n in sorted(r["recovery"].items()))} for r in results]
    title = (f"spate bench rescale: lmdb + changelog, max parallelism {MAX_PARALLELISM}, batches of {BATCH_ROWS:,} "
             f"rows (70 % updates, 30 % new keys, 500-byte values); online = rescale() then one batch, restart = "
             f"a new runner at the new parallelism and one batch")
    return format_table(rows, title=title) + f"\n\ngoals: {GOALS}"


def plot_times(results: list[dict[str, Any]], out_dir: str) -> str | None:
    """One panel per direction: a normal batch, the online rescale batch and stop + restart, per state size, on
    one log axis."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    directions = list(dict.fromkeys(r["direction"] for r in results))
    if not directions:
        return None
    fig, axes = plt.subplots(1, len(directions), figsize=(6 * len(directions), 4.5), squeeze=False, sharey=True)
    bars = (("normal_batch_ms", "normal batch"), ("online_ms", "online rescale batch"),
            ("restart_ms", "stop + restart"))
    for ax, direction in zip(axes[0], directions, strict=True):
        rows = [r for r in results if r["direction"] == direction]
        width = 0.8 / len(bars)
        for j, (metric, label) in enumerate(bars):
            ax.bar([i + j * width for i in range(len(rows))], [r[metric] for r in rows], width, label=label)
        ax.set_xticks([i + width for i in range(len(rows))], [f"{r['state_mb']:,} MB" for r in rows])
        ax.set_title(f"parallelism {direction.replace('->', ' → ')}")
        ax.set_xlabel("state")
        ax.set_ylabel("ms")
        ax.set_yscale("log")
        ax.legend()
    fig.suptitle("spate bench rescale: online rescale vs a normal batch vs stop + restart (lmdb, changelog)")
    fig.tight_layout()
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "rescale-times.png")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
