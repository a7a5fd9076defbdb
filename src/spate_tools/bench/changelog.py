"""``spate bench changelog``: checkpoint duration and size with the changelog on vs off (full snapshots), for
growing state. Keyed value state, mostly new keys, one checkpoint per batch; then recovery time."""

from __future__ import annotations

import contextlib
import random
import shutil
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from spate.changelog.state import ChangelogConfig
from spate.report import format_table, human_bytes, percentile, progress
from spate.runtime.local import LocalRunner
from spate.runtime.processor import Context, Processor
from spate.state.descriptors import ValueStateDescriptor

VALUE: ValueStateDescriptor[bytes] = ValueStateDescriptor("value")
VALUE_BYTES = 500
ROWS_PER_BATCH = 2_000


class Put(Processor):
    def open(self, ctx: Context) -> None:
        self.value = ctx.state(VALUE)

    def process(self, key: Any, rows: Sequence[dict], ctx: Context) -> None:
        self.value.update(rows[-1]["v"])


def _entry_bytes() -> int:
    return VALUE_BYTES + 20  # value + table key + framing, roughly


def _batches(n: int, first_key: int, rng: random.Random) -> list[list[dict]]:
    payload = bytes(VALUE_BYTES)
    out, next_key = [], first_key
    for _ in range(n):
        rows = []
        for _ in range(ROWS_PER_BATCH):
            if rng.random() < 0.95:
                key, next_key = next_key, next_key + 1  # mostly new keys
            else:
                key = rng.randrange(max(1, next_key))
            rows.append({"k": key, "v": payload})
        out.append(rows)
    return out


def _run_variant(variant: str, state_mb: int, batches: int, workdir: str) -> dict[str, Any]:
    root = f"{workdir}/{variant}-{state_mb}"
    changelog = ChangelogConfig() if variant == "changelog" else False
    keys = state_mb * 1_000_000 // _entry_bytes()
    rng = random.Random(state_mb)
    with LocalRunner(Put, key="k", checkpoint_root=root, parallelism=1, changelog=changelog) as runner:
        runner.run_batch(0, [{"k": 0, "v": bytes(VALUE_BYTES)}])
        sub = runner.subtasks[0]
        backend, value = sub.keyed, sub.keyed.get_state(VALUE)  # type: ignore[union-attr]
        payload = bytes(VALUE_BYTES)
        for k in range(keys):  # pre-fill through the state API (not measured)
            backend.set_current_key(k)  # type: ignore[union-attr]
            value.update(payload)
        runner.run_batch(1, [])
        if sub.clog is not None:
            sub.clog.materialize_now(backend)  # type: ignore[arg-type]
            runner.run_batch(2, [])
        results = [runner.run_batch(runner.next_batch_id, rows) for rows in _batches(batches, keys, rng)]
        last = results[-1].checkpoint
    cp_ms = [r.checkpoint_ms for r in results]
    at_checkpoint = [st.stats.get("changelog_bytes_at_checkpoint", st.stats.get("keyed_bytes", 0))
                     for r in results for st in r.checkpoint.subtasks]
    recovery_s = min(_recover(root, changelog) for _ in range(2))  # best of two: the machine is noisy
    return {"variant": variant, "state_mb": state_mb, "keys": keys, "checkpoints": batches,
            "checkpoint_ms_p50": percentile(cp_ms, 50), "checkpoint_ms_p90": percentile(cp_ms, 90),
            "checkpoint_ms_p99": percentile(cp_ms, 99), "checkpoint_ms_max": max(cp_ms),
            "checkpointed_bytes_p50": percentile(at_checkpoint, 50), "full_checkpoint_bytes": last.state_bytes,
            "recovery_s": round(recovery_s, 3)}


def _recover(root: str, changelog: ChangelogConfig | bool) -> float:
    """Seconds for a new runner to restore every key and finish an empty batch (the checkpoint is not
    committed, so the next measurement restores the same state)."""

    def stop(step: str, batch_id: int) -> None:
        if step == "after_acks":
            raise _Stop

    started = time.perf_counter()
    with LocalRunner(Put, key="k", checkpoint_root=root, parallelism=1, changelog=changelog,
                     fault_injector=stop) as runner, contextlib.suppress(_Stop):
        runner.run_batch(runner.next_batch_id, [])
    return time.perf_counter() - started


class _Stop(Exception):
    """Ends a recovery measurement before its checkpoint completes."""


def bench_changelog(quick: bool) -> tuple[list[dict[str, Any]], str]:
    sizes, batches = ([2, 10], 8) if quick else ([10, 100, 1000], 20)
    workdir = tempfile.mkdtemp(prefix="spate-bench-changelog-")
    steps = [(v, mb) for mb in sizes for v in ("changelog", "full")]
    results = []
    try:
        for variant, mb in progress(steps, len(steps), "bench changelog"):
            results.append(_run_variant(variant, mb, batches, workdir))
            shutil.rmtree(f"{workdir}/{variant}-{mb}", ignore_errors=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return results, _table(results, sizes)


def _table(results: list[dict[str, Any]], sizes: list[int]) -> str:
    rows = []
    for r in results:
        rows.append({"variant": r["variant"], "state": human_bytes(r["state_mb"] * 1_000_000),
                     "cp p50 ms": round(r["checkpoint_ms_p50"], 1), "cp p90 ms": round(r["checkpoint_ms_p90"], 1),
                     "cp p99 ms": round(r["checkpoint_ms_p99"], 1), "cp max ms": round(r["checkpoint_ms_max"], 1),
                     "bytes at cp": human_bytes(r["checkpointed_bytes_p50"]),
                     "full cp": human_bytes(r["full_checkpoint_bytes"]), "recovery s": r["recovery_s"]})
    by = {(r["variant"], r["state_mb"]): r for r in results}
    ratios = []
    for mb in sizes:
        c, f = by[("changelog", mb)], by[("full", mb)]
        ratios.append({"state": human_bytes(mb * 1_000_000),
                       "p99 full/changelog": round(f["checkpoint_ms_p99"] / c["checkpoint_ms_p99"], 1),
                       "size changelog/full": round(c["full_checkpoint_bytes"] / f["full_checkpoint_bytes"], 2),
                       "recovery changelog/full": round(c["recovery_s"] / f["recovery_s"], 2)})
    small, big = by[("changelog", sizes[0])], by[("changelog", sizes[-1])]
    growth = round(big["checkpoint_ms_p99"] / small["checkpoint_ms_p99"], 2)
    return (format_table(rows, title=f"spate bench changelog: value state, {ROWS_PER_BATCH:,} rows per batch "
                                     f"(95 % new keys), one checkpoint per batch") + "\n\n"
            + format_table(ratios, title="ratios") +
            f"\n\nchangelog p99 at {human_bytes(sizes[-1] * 1_000_000)} / at {human_bytes(sizes[0] * 1_000_000)}: "
            f"{growth}×")
