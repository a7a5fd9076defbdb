"""The result of ``spate bench cluster --large`` (:mod:`spate_tools.bench.cluster_large`): what one run observed
(:class:`Observed`), whether the state after the recovery is the one written (:func:`state_problems`), and the
result row (:func:`shape_result`) and its table."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from spate.checkpoint.ackinfo import RESTORED
from spate.checkpoint.metadata import CheckpointMetadata
from spate.report import format_table, human_bytes, percentile
from spate.spark.stream_metrics import BatchMetrics
from spate_tools.bench.cluster_large_job import GB, PARALLELISM, VALUE_BYTES, Sizes

GOAL = 2.0  # recovery_vs_copy


@dataclass
class Observed:
    """What one run measured, for :func:`shape_result`."""

    trigger_ms: dict[int, float]  # Spark's triggerExecution per batch id
    metrics: list[BatchMetrics]
    base: CheckpointMetadata  # the checkpoint of the batch before the kill
    recovered: CheckpointMetadata  # of the recovery batch
    last: CheckpointMetadata  # of the verification batch
    killed: str | None
    copy_s: float
    copy_bytes: int
    check: dict[str, Any] | None
    replacement_s: float | None = None
    killed_local_bytes: int = 0
    generate_s: float = 0.0
    disk_peak_bytes: int = 0
    elapsed_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


def _rows(meta: CheckpointMetadata, i: int) -> int | None:
    rows = meta.subtasks[i].stats.get("state_rows")
    return rows if isinstance(rows, int) else None


def state_problems(sizes: Sizes, o: Observed, killed_subtasks: list[int], restored: list[int]) -> list[str]:
    """Why the state after the recovery is not the one written ([] if it is)."""
    problems = []
    if not restored:
        problems.append("no subtask restored from checkpoint storage in the recovery batch")
    if sorted(restored) != sorted(killed_subtasks):
        problems.append(f"restored subtasks {restored} are not the killed executor's {killed_subtasks}")
    for i in restored:
        if _rows(o.recovered, i) is None or _rows(o.recovered, i) != _rows(o.base, i):
            problems.append(f"subtask {i} holds {_rows(o.recovered, i)} entries after its restore, "
                            f"{_rows(o.base, i)} before the kill")
    for name, meta in (("recovery", o.recovered), ("verification", o.last)):
        total = sum(_rows(meta, i) or 0 for i in range(len(meta.subtasks)))
        if total != sizes.keys:
            problems.append(f"{total} entries after the {name} batch, {sizes.keys} keys loaded")
    if not all(st.rows > 0 for st in o.last.subtasks):
        problems.append(f"a subtask read no key in the verification batch: {[st.rows for st in o.last.subtasks]}")
    c = o.check
    if c is None:
        problems.append("the verification batch's outputs were not checked")
    elif not c["same_keys"] or c["missing"] or c["wrong"]:
        problems.append(f"verification: {c}")
    return problems


def shape_result(sizes: Sizes, o: Observed) -> dict[str, Any]:
    """The result row of one run."""
    by_id = {m.batch_id: m for m in o.metrics if not m.replayed}
    rec = by_id.get(sizes.recovery_batch)
    before = by_id.get(sizes.kill_at)
    killed_subtasks = [i for i, r in enumerate(before.subtasks if before else [])
                       if o.killed is not None and (r.executor or "").split("@")[0] == o.killed]
    restored = [i for i, r in enumerate(rec.subtasks if rec else []) if r.recovery == RESTORED]
    restore_ms_max = max((rec.subtasks[i].restore_ms for i in restored), default=0.0) if rec else 0.0
    load_ms = [o.trigger_ms.get(b) for b in range(sizes.load_batches)]
    steady_ms = [o.trigger_ms[b] for b in range(sizes.load_batches, sizes.kill_at + 1) if b in o.trigger_ms]
    recovery_ms = o.trigger_ms.get(sizes.recovery_batch)
    problems = state_problems(sizes, o, killed_subtasks, restored)
    load_s = sum(load_ms) / 1000 if None not in load_ms else None  # type: ignore[arg-type]
    steady_p50 = percentile(steady_ms, 50)
    return {"variant": "large-state", "workers": 2, "parallelism": PARALLELISM, "state_gb": sizes.state_gb,
            "keys": sizes.keys, "value_bytes": VALUE_BYTES, "batches": sizes.batches,
            "load_batches": sizes.load_batches, "updates_per_batch": sizes.updates,
            "generate_s": round(o.generate_s, 1),
            "load_s": None if load_s is None else round(load_s, 1),
            "load_mb_per_s": round(sizes.keys * VALUE_BYTES / 1e6 / load_s, 1) if load_s else None,
            "batch_ms_p50_steady": steady_p50,
            "checkpoint_bytes": o.base.state_bytes,
            "killed_executor": o.killed, "killed_subtasks": killed_subtasks,
            "killed_local_bytes": o.killed_local_bytes, "replacement_s": o.replacement_s,
            "restored_subtasks": restored,
            "recovery": [r.recovery for r in rec.subtasks] if rec else None,
            "restore_bytes": sum(rec.subtasks[i].restore_bytes for i in restored) if rec else 0,
            "copy_bytes": o.copy_bytes,
            "recovery_batch_ms": recovery_ms,
            "recovery_batch_spate_ms": round(rec.batch_ms, 1) if rec else None,
            "restore_ms_max": round(restore_ms_max, 1),
            "recovery_batch_excess_ms": round(recovery_ms - steady_p50 - restore_ms_max)
            if recovery_ms and steady_p50 and restored else None,
            "copy_s": round(o.copy_s, 3),
            "recovery_vs_copy": round(restore_ms_max / 1000 / o.copy_s, 2) if restored and o.copy_s else None,
            "recovery_batch_vs_copy": round(recovery_ms / 1000 / o.copy_s, 2) if recovery_ms and o.copy_s
            else None,
            "worker_peak_rss_mb": round(max((m.worker_peak_rss_bytes for m in o.metrics), default=0) / 2**20),
            "disk_peak_bytes": o.disk_peak_bytes,
            "disk_per_state": round(o.disk_peak_bytes / (sizes.state_gb * GB), 2),
            "verified_keys": (o.check or {}).get("verified_keys", 0),
            "state_checked": not problems, "state_problems": problems,
            "elapsed_s": round(o.elapsed_s, 1), **o.extra}


def table(r: dict[str, Any]) -> str:
    rows = [{"metric": k, "value": human_bytes(v) if "bytes" in k and isinstance(v, int) and v > 4096 else v}
            for k, v in r.items() if k != "variant"]
    title = (f"spate bench cluster --large: standalone master + 2 workers (1 core each) on 127.0.0.1, parallelism "
             f"{PARALLELISM}, lmdb, changelog on, file merging across, {r['state_gb']:g} GB of {VALUE_BYTES}-byte "
             f"values; one executor killed, its subtask restored on the replacement; goal: recovery_vs_copy "
             f"(restore_ms_max / copy_s) <= {GOAL:g}")
    return format_table(rows, title=title)
