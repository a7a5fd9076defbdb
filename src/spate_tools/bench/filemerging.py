"""``spate bench filemerging``: the same stateful job with file merging off, within and across checkpoints.

4 subtasks, one checkpoint per batch, changelog on (materialized every minute of the job's clock, one batch
per second), operator state and staged outputs (a sink) in every checkpoint. Counted: physical data files
created and deleted, files alive at the end, bytes written, space amplification (bytes stored / bytes a
retained checkpoint references, after each checkpoint) and checkpoint duration. The variants run
interleaved, batch by batch, on the same input.
"""

from __future__ import annotations

import contextlib
import random
import shutil
import tempfile
from collections.abc import Sequence
from typing import Any

from spate.changelog.state import ChangelogConfig
from spate.fs import CheckpointStorage, FileCounts
from spate.layout import METADATA_FILE, is_marker
from spate.report import format_table, human_bytes, percentile, progress
from spate.runtime.local import LocalRunner
from spate.runtime.processor import Context, Processor
from spate.state.descriptors import ValueStateDescriptor

COUNT: ValueStateDescriptor[int] = ValueStateDescriptor("count", default=0)
VARIANTS = ("off", "within", "across")
PARALLELISM = 4
KEYS = 20_000
ROWS_PER_BATCH = 1_000
BATCH_INTERVAL_MS = 1_000
MATERIALIZATION_INTERVAL_MS = 60_000


class CountJob(Processor):
    """A keyed running count that also keeps the batches it saw as operator state."""

    def open(self, ctx: Context) -> None:
        self.count = ctx.state(COUNT)
        self.seen = ctx.get_list_state("batches")

    def process(self, key: Any, rows: Sequence[dict], ctx: Context) -> list[dict]:
        n = self.count.value() + len(rows)
        self.count.update(n)
        return [{"k": key, "count": n}]

    def end_batch(self, ctx: Context) -> None:
        self.seen.add(ctx.batch_id)


def _batches(n: int) -> list[list[dict]]:
    rng = random.Random(306)
    return [[{"k": rng.randrange(KEYS)} for _ in range(ROWS_PER_BATCH)] for _ in range(n)]


def _runner(variant: str, root: str, clock: list[int]) -> LocalRunner:
    clog = ChangelogConfig(materialization_interval_ms=MATERIALIZATION_INTERVAL_MS)
    return LocalRunner(CountJob, key="k", checkpoint_root=root, parallelism=PARALLELISM, changelog=clog,
                       file_merging=False if variant == "off" else variant, clock=lambda: clock[0],
                       sink=lambda rows, batch_id: None)


def _run(batches: list[list[dict]], workdir: str) -> list[dict[str, Any]]:
    """Every variant takes batch n in turn (in a rotating order) before any takes batch n+1, so drifts of the
    machine's speed hit them alike."""
    clock = [0]
    roots = {v: f"{workdir}/{v}" for v in VARIANTS}
    cp_ms: dict[str, list[float]] = {v: [] for v in VARIANTS}
    amps: dict[str, list[float]] = {v: [] for v in VARIANTS}
    with contextlib.ExitStack() as stack:
        runners = {v: stack.enter_context(_runner(v, roots[v], clock)) for v in VARIANTS}
        for n, rows in progress(list(enumerate(batches)), len(batches), "bench filemerging"):
            clock[0] = n * BATCH_INTERVAL_MS
            order = VARIANTS[n % len(VARIANTS):] + VARIANTS[:n % len(VARIANTS)]
            for v in order:  # rotated: background work of the variant before (materializations) hits all alike
                runner = runners[v]
                cp_ms[v].append(runner.run_batch(n, rows).checkpoint_ms)
                amps[v].append(runner.coordinator.registry.stats().amplification)
        for runner in runners.values():
            runner.coordinator.drain()
        counts = {v: [r.services.storage.counts, r.coordinator.storage.counts] for v, r in runners.items()}
    return [_figures(v, roots[v], len(batches), cp_ms[v], amps[v], counts[v]) for v in VARIANTS]


def _figures(variant: str, root: str, checkpoints: int, cp_ms: list[float], amps: list[float],
             counts: list[FileCounts]) -> dict[str, Any]:
    alive = [p for p, _ in CheckpointStorage(root).list_files() if not is_marker(p)]
    created = sum(c.created for c in counts)
    steady = amps[len(amps) // 10:]
    return {"variant": variant, "checkpoints": checkpoints, "parallelism": PARALLELISM,
            "files_created": created, "files_deleted": sum(c.deleted for c in counts),
            "files_alive": len(alive), "files_per_batch": round(created / checkpoints, 2),
            "bytes_written": sum(c.bytes_written for c in counts),
            "space_amplification": round(percentile(steady, 50) or 1.0, 2),
            "space_amplification_max": round(max(steady), 2),
            "checkpoint_ms_p50": percentile(cp_ms, 50), "checkpoint_ms_p99": percentile(cp_ms, 99)}


def bench_filemerging(quick: bool) -> tuple[list[dict[str, Any]], str]:
    n = 60 if quick else 500
    workdir = tempfile.mkdtemp(prefix="spate-bench-filemerging-")
    try:
        results = _run(_batches(n), workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return results, _table(results, n)


def _table(results: list[dict[str, Any]], checkpoints: int) -> str:
    off = next(r for r in results if r["variant"] == "off")
    rows = []
    for r in results:
        rows.append({"variant": r["variant"], "created": r["files_created"], "deleted": r["files_deleted"],
                     "alive": r["files_alive"], "per batch": r["files_per_batch"],
                     "fewer creations": f"{1 - r['files_created'] / off['files_created']:.1%}",
                     "written": human_bytes(r["bytes_written"]), "amp p50": r["space_amplification"],
                     "amp max": r["space_amplification_max"], "cp p50 ms": round(r["checkpoint_ms_p50"], 2),
                     "cp p99 ms": round(r["checkpoint_ms_p99"], 2),
                     "p99 vs off": round(r["checkpoint_ms_p99"] / off["checkpoint_ms_p99"], 2)})
    return format_table(rows, title=f"spate bench filemerging: {checkpoints} checkpoints, {PARALLELISM} subtasks, "
                                    f"changelog on, operator state and staged outputs; data files only (each "
                                    f"checkpoint also writes its {METADATA_FILE} in every variant)")
