"""``spate bench connect``: the same stream on a classic session and on Spark Connect, on one machine's
multi-executor cluster (``local-cluster[2,1,1024]``: two executor JVMs), the changelog on.

On Connect spate cannot prefer the executor that holds a subtask's state (no RDDs, no locality in the protocol):
a subtask that lands on the other executor catches up from checkpoint storage. This measures what that costs:
per variant, the batch time (Spark's ``addBatch``, median and 90th percentile over the run's batches) and
``local_reuse`` (the fraction of subtask-batches that ran on their local state), and Connect's batch time over
classic mode's (``vs_classic``; the goal: ≤ 1.3). Variants: ``classic`` (a classic session of the cluster),
``connect`` (a Connect server of the same cluster; its client in a process of its own) and ``connect-local``
(a Connect server in local mode: one executor, nothing to lose). Each run is a fresh process and a fresh root;
rounds alternate the variants so that the machine's drift hits all alike.

JSON keys per row: ``variant``, ``executors``, ``rounds``, ``batches``, ``batch_ms_p50``, ``batch_ms_p90``,
``local_reuse``, ``restored``, ``caught_up``, ``vs_classic``.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from typing import Any

from spate.report import format_table
from spate_tools.connect_server import ConnectServer
from spate_tools.spark_demo import write_batches

CLUSTER = "local-cluster[2,1,1024]"
VARIANTS = {"classic": (CLUSTER, False), "connect": (CLUSTER, True), "connect-local": ("local[2]", True)}
JOB_TIMEOUT_S = 900


def _batches(n: int, per_batch: int, keys: int) -> list[list[dict[str, Any]]]:
    return [[{"k": f"k{(b * per_batch + i) * 7 % keys}", "v": i} for i in range(per_batch)] for b in range(n)]


def _run_job(source: str, root: str, master: str, remote: str | None, jvm_options: str) -> dict[str, Any]:
    args = [sys.executable, "-m", "spate_tools.bench.connect_job", "--source", source, "--root", root,
            "--master", master, f"--jvm-options={jvm_options}"]
    if remote:
        args += ["--remote", remote]
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
    done = subprocess.run(args, capture_output=True, text=True, timeout=JOB_TIMEOUT_S, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"bench connect job failed ({master}, remote={remote}): {done.stderr[-3000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def _one(variant: str, source: str, workdir: str, jvm_options: str) -> dict[str, Any]:
    master, remote = VARIANTS[variant]
    root = os.path.join(workdir, f"{variant}-root")
    if not remote:
        return _run_job(source, root, master, None, jvm_options)
    log = os.path.join(workdir, f"{variant}-server.log")
    with ConnectServer(log, master=master, jvm_options=jvm_options) as server:
        return _run_job(source, root, master, server.url, jvm_options)


def bench_connect(quick: bool = False, jvm_options: str = "") -> tuple[list[dict[str, Any]], str]:
    """The variants' rows and the table. ``jvm_options`` go to every variant's driver, server and executor JVMs
    (the tests pass :data:`~spate_tools.standalone.QUICK_JVM_OPTIONS`; figures are measured without)."""
    n, per_batch, keys, rounds = (6, 2_000, 1_000, 1) if quick else (20, 20_000, 20_000, 2)
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
    base = tempfile.mkdtemp(prefix="spate-bench-connect-")
    try:
        source = os.path.join(base, "in")
        write_batches(source, _batches(n, per_batch, keys))
        for r in range(rounds):
            for variant in VARIANTS:
                workdir = os.path.join(base, f"round-{r}")
                os.makedirs(workdir, exist_ok=True)
                print(f"  round {r + 1}/{rounds}: {variant}", file=sys.stderr, flush=True)
                runs[variant].append(_one(variant, source, workdir, jvm_options))
                shutil.rmtree(workdir, ignore_errors=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    rows = _rows(runs)
    return rows, format_table(rows, title=f"one stream on classic and Spark Connect sessions, {n} batches of "
                                          f"{per_batch:,} rows, lmdb + changelog, parallelism 4, {rounds} round(s)")


def _rows(runs: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    def median(variant: str, key: str) -> float:
        return statistics.median(float(r[key]) for r in runs[variant])

    classic = median("classic", "batch_ms_p50")
    rows = []
    for variant, done in runs.items():
        p50 = median(variant, "batch_ms_p50")
        rows.append({"variant": variant, "executors": 2 if VARIANTS[variant][0] == CLUSTER else 1,
                     "rounds": len(done), "batches": done[0]["batches"], "batch_ms_p50": round(p50, 1),
                     "batch_ms_p90": round(median(variant, "batch_ms_p90"), 1),
                     "local_reuse": round(median(variant, "local_reuse"), 3),
                     "restored": int(median(variant, "restored")), "caught_up": int(median(variant, "caught_up")),
                     "vs_classic": round(p50 / classic, 2) if classic else None})
    return rows


__all__ = ["bench_connect"]
