"""``spate bench bigstate``: state larger than a worker's memory. One subtask on lmdb (changelog and file
merging on, as on Spark) takes batches of new keys through a ``BatchProcessor`` (a running count in bulk
value state) until it holds 10M keys (1M with ``--quick``); after each batch: the batch's time, the state's
size on disk, and the process's memory: peak RSS (``VmHWM``, which counts lmdb's memory-mapped pages that
were resident: the kernel can drop those) and anonymous RSS (``RssAnon``: what the process itself holds).

The batches enter the subtask as Arrow tables grouped by key, as a Spark task's rows do, with their key
groups computed by Spark's hash, so the state is a real query's (restorable at any parallelism).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from typing import Any

import numpy as np
import pyarrow as pa

from spate.keygroups import compile_key_hasher
from spate.report import format_table, human_bytes, progress
from spate.runtime.batch import BatchProcessor, KeyedBatch
from spate.runtime.local import LocalRunner
from spate.state.descriptors import ValueStateDescriptor

COUNT: ValueStateDescriptor[int] = ValueStateDescriptor("count", default=0)
OUTPUT = pa.schema([("k", pa.int64()), ("count", pa.int64())])
MAX_PARALLELISM = 128


class BulkCount(BatchProcessor):
    """A running count per key, read and written in bulk; emits nothing (the state is what is measured)."""

    def open(self, ctx: Any) -> None:
        self.count = ctx.bulk_state(COUNT)

    def process_batch(self, batch: KeyedBatch, ctx: Any) -> None:
        self.count.put_many(batch, np.asarray(self.count.get_many(batch), dtype=np.int64) + batch.counts)


def memory_kib() -> dict[str, int]:
    """``VmHWM`` and ``RssAnon`` of this process, in KiB (Linux)."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            name, _, value = line.partition(":")
            if name in ("VmHWM", "RssAnon"):
                out[name] = int(value.split()[0])
    return out


def _batch(first_key: int, rows: int, hash_long: Any) -> KeyedBatch:
    keys = np.arange(first_key, first_key + rows, dtype=np.int64)
    kgs = np.fromiter((hash_long(k) % MAX_PARALLELISM for k in keys.tolist()), dtype=np.int32, count=rows)
    return KeyedBatch.from_arrow(pa.table({"k": keys, "kg": kgs}), ["k"], "kg")


class _OneSubtask(LocalRunner):
    """A LocalRunner whose single subtask takes a prepared :class:`KeyedBatch` (as a Spark task builds it)."""

    prepared: KeyedBatch | None = None

    def _route(self, rows: Any) -> list[Any]:
        return [self.prepared]


def bench_bigstate(quick: bool) -> tuple[list[dict[str, Any]], str]:
    total, per_batch = (1_000_000, 250_000) if quick else (10_000_000, 1_000_000)
    workdir = tempfile.mkdtemp(prefix="spate-bench-bigstate-")
    hash_long = compile_key_hasher(["long"])
    results = []
    try:
        runner = _OneSubtask(BulkCount, key="k", checkpoint_root=f"{workdir}/root", parallelism=1,
                             max_parallelism=MAX_PARALLELISM, table="lmdb", local_dir=f"{workdir}/local",
                             changelog=True, file_merging="across", output_schema=OUTPUT)
        with runner:
            for n in progress(range(total // per_batch), total // per_batch, "bench bigstate"):
                runner.prepared = _batch(n * per_batch, per_batch, hash_long)
                started = time.perf_counter()
                runner.run_batch(n, [])
                batch_s = time.perf_counter() - started
                mem = memory_kib()
                results.append({"variant": "spate-batch", "batch": n, "keys": (n + 1) * per_batch,
                                "batch_s": round(batch_s, 2), "keys_per_s": round(per_batch / batch_s),
                                "lmdb_bytes": _dir_bytes(f"{workdir}/local"),
                                "checkpoint_bytes": _dir_bytes(f"{workdir}/root"),
                                "peak_rss_mb": round(mem["VmHWM"] / 1024, 1),
                                "anon_rss_mb": round(mem["RssAnon"] / 1024, 1)})
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return results, _table(results)


def _dir_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def _table(results: list[dict[str, Any]]) -> str:
    rows = [{"keys": f"{r['keys']:,}", "batch s": r["batch_s"], "keys/s": f"{r['keys_per_s']:,}",
             "lmdb on disk": human_bytes(r["lmdb_bytes"]), "checkpoint": human_bytes(r["checkpoint_bytes"]),
             "peak RSS MB": r["peak_rss_mb"], "anon RSS MB": r["anon_rss_mb"]} for r in results]
    return format_table(rows, title="spate bench bigstate: one subtask, lmdb + changelog + file merging, batches "
                                    "of new keys through a BatchProcessor (bulk value state). Peak RSS counts "
                                    "lmdb's resident mapped pages (the kernel drops them under pressure); anon "
                                    "RSS is what the process holds itself")
