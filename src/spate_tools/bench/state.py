"""``spate bench state``: per-operation throughput of the state API on each table kind, full snapshot and
restore MB/s, and raw lmdb with the same keys and values for comparison."""

from __future__ import annotations

import random
import shutil
import tempfile
import time
from collections.abc import Callable
from typing import Any

import lmdb

from spate.fs import CheckpointStorage
from spate.keygroups import key_groups
from spate.report import format_table, progress
from spate.segments import WholeFileWriter
from spate.serde import MSGPACK
from spate.snapshot.keyed import restore_keyed_snapshot, write_keyed_snapshot
from spate.state.descriptors import ListStateDescriptor, MapStateDescriptor, ValueStateDescriptor
from spate.state.heap import HeapTable
from spate.state.keyed import VOID_NAMESPACE_PART, KeyedStateBackend
from spate.state.layout import U16, length_prefixed
from spate.state.lmdb_table import LmdbTable
from spate.state.table import StateTable

MAX_PARALLELISM = 128


def _rate(n: int, fn: Callable[[], None]) -> float:
    started = time.perf_counter()
    fn()
    return n / (time.perf_counter() - started)


def _backend(kind: str, workdir: str, name: str) -> KeyedStateBackend:
    table: StateTable = HeapTable() if kind == "heap" else LmdbTable(f"{workdir}/{name}")
    return KeyedStateBackend(table, MAX_PARALLELISM, range(MAX_PARALLELISM))


def _bench_table(kind: str, keys: list[int], kgs: list[int], workdir: str) -> list[dict[str, Any]]:
    n = len(keys)
    b = _backend(kind, workdir, kind)
    value = b.get_state(ValueStateDescriptor("value"))
    lst = b.get_state(ListStateDescriptor("list"))
    mp = b.get_state(MapStateDescriptor("map"))
    order = list(range(n))
    random.Random(7).shuffle(order)
    set_key = b.set_current_key

    def value_put() -> None:
        for k, kg in zip(keys, kgs, strict=True):
            set_key(k, kg)
            value.update(k)

    def value_get() -> None:
        for i in order:
            set_key(keys[i], kgs[i])
            value.value()

    def list_add() -> None:
        for k, kg in zip(keys, kgs, strict=True):
            set_key(k, kg)
            lst.add(k)

    def map_put() -> None:
        for k, kg in zip(keys, kgs, strict=True):
            set_key(k, kg)
            mp.put(k & 7, k)

    def map_get() -> None:
        for i in order:
            set_key(keys[i], kgs[i])
            mp.get(keys[i] & 7)

    results = []
    for op, fn in (("value_put", value_put), ("value_get", value_get), ("list_add", list_add),
                   ("map_put", map_put), ("map_get", map_get)):
        results.append({"variant": kind, "op": op, "keys": n, "ops_per_s": round(_rate(n, fn))})
    b.table.commit()

    storage = CheckpointStorage(f"{workdir}/ckpt-{kind}")
    started = time.perf_counter()
    handle = write_keyed_snapshot(b, WholeFileWriter(storage, "snapshot", ".kg"))
    snap_s = time.perf_counter() - started
    assert handle is not None
    mb = handle.size / 1e6
    results.append({"variant": kind, "op": "snapshot", "keys": n, "mb_per_s": round(mb / snap_s, 1),
                    "state_bytes": handle.size})
    b.table.destroy()
    fresh = _backend(kind, workdir, f"{kind}-restored")
    started = time.perf_counter()
    restore_keyed_snapshot(fresh, storage, handle)
    fresh.table.commit()
    restore_s = time.perf_counter() - started
    results.append({"variant": kind, "op": "restore", "keys": n, "mb_per_s": round(mb / restore_s, 1),
                    "state_bytes": handle.size})
    fresh.table.destroy()
    return results


def _bench_raw_lmdb(keys: list[int], kgs: list[int], workdir: str) -> list[dict[str, Any]]:
    """lmdb with the same key and value bytes the state API stores, pre-encoded, one transaction."""
    sid = U16.pack(0)
    enc = [U16.pack(kg) + sid + length_prefixed(MSGPACK.dumps(k)) + VOID_NAMESPACE_PART
           for k, kg in zip(keys, kgs, strict=True)]
    vals = [MSGPACK.dumps(k) for k in keys]
    n = len(keys)
    env = lmdb.open(f"{workdir}/raw", map_size=1 << 33, sync=False, metasync=False, readahead=False)
    order = list(range(n))
    random.Random(7).shuffle(order)

    def put() -> None:
        with env.begin(write=True) as txn:
            for k, v in zip(enc, vals, strict=True):
                txn.put(k, v)

    def get() -> None:
        with env.begin() as txn:
            for i in order:
                txn.get(enc[i])

    out = [{"variant": "raw-lmdb", "op": "value_put", "keys": n, "ops_per_s": round(_rate(n, put))},
           {"variant": "raw-lmdb", "op": "value_get", "keys": n, "ops_per_s": round(_rate(n, get))}]
    env.close()
    return out


def bench_state(quick: bool) -> tuple[list[dict[str, Any]], str]:
    n = 100_000 if quick else 1_000_000
    keys = random.Random(1).sample(range(1 << 40), n)
    kgs = key_groups(keys, MAX_PARALLELISM)
    workdir = tempfile.mkdtemp(prefix="spate-bench-state-")
    results: list[dict[str, Any]] = []
    try:
        steps = [lambda: _bench_table("heap", keys, kgs, workdir), lambda: _bench_table("lmdb", keys, kgs, workdir),
                 lambda: _bench_raw_lmdb(keys, kgs, workdir)]
        for step in progress(steps, len(steps), "bench state"):
            results += step()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return results, _table(results, n)


def _table(results: list[dict[str, Any]], n: int) -> str:
    by = {(r["variant"], r["op"]): r for r in results}
    ops = list(dict.fromkeys(r["op"] for r in results))
    rows = []
    for op in ops:
        row: dict[str, Any] = {"op": op}
        for v in ("heap", "lmdb", "raw-lmdb"):
            r = by.get((v, op))
            row[v] = r.get("ops_per_s", r.get("mb_per_s")) if r else None
        raw, lm = by.get(("raw-lmdb", op)), by.get(("lmdb", op))
        row["raw/lmdb"] = round(raw["ops_per_s"] / lm["ops_per_s"], 2) if raw and lm else None
        row["unit"] = "MB/s" if op in ("snapshot", "restore") else "ops/s"
        rows.append(row)
    return format_table(rows, title=f"spate bench state: {n:,} keys, max parallelism {MAX_PARALLELISM}")
