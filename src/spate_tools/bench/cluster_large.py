"""``spate bench cluster --large``: recovery of a large state on the standalone cluster (a master and 2 workers
with 1 core each on 127.0.0.1, :class:`~spate_tools.standalone.StandaloneCluster`), against the physical floor.

One query, parallelism 2 (one subtask per executor), lmdb, changelog on, file merging across, value state of
500-byte values (``--state-gb``, default 4: 8M keys, about 4 GB over the 2 workers):

1. **load**: keys ``0..n-1`` in a few large micro-batches (1M rows each, at least 2 batches), timed (``load_s``:
   the sum of Spark's ``triggerExecution`` of those batches). The input is one Parquet file of keys per batch;
   the processor (a :class:`~spate.runtime.batch.BatchProcessor`) writes each key's 500-byte value in bulk, the
   batch id in its first 8 bytes;
2. **steady**: 3 batches of random existing keys (1 % of the keys, at most 100,000), overwritten;
3. **kill**: after the last steady batch's checkpoint completed, one executor is SIGKILLed (``_KillOnce``), its
   lmdb copies are deleted (they are in its own block-manager directory, which no other executor reads: this
   frees the disk, as losing the machine would) and the sink waits until the master's replacement executor has
   registered with the driver;
4. **recovery**: the next batch (another steady batch) runs the lost subtask on the replacement, which restores
   its state from checkpoint storage (``recovery`` = ``restored``). Timed: Spark's ``triggerExecution`` of that
   batch (``recovery_batch_ms``) and the restored subtasks' own ``restore_ms`` / ``restore_bytes``. The batch
   also pays for the replacement's first tasks (a cold JVM, a new Python worker): ``recovery_batch_excess_ms`` is
   what it took beyond a steady batch and the restore;
5. **verification**: one more batch reads the previous value of a sample of keys (up to 1M) before it overwrites
   them and emits it; the sink compares each with the batch that wrote the key last. With the subtasks' entry
   counts (``state_rows`` in the checkpoints' statistics: the restored subtask's equals its count at the base,
   and the total is the keys loaded) that is ``state_checked``;
6. **copy floor** (``copy_s``): once the cluster is stopped, exactly the segments the restored subtasks read
   (their keyed snapshots, change sets, change-set lists and operator state in the base checkpoint, per its
   ``_metadata``) are copied by the operating system to another directory on the same disk, each file fsynced,
   timed and deleted. ``recovery_vs_copy`` is ``restore_ms_max / 1000 / copy_s`` (goal: ≤ 2).

Everything (input, checkpoint root, the cluster's work and local dirs, the copy) lives in one working directory
under ``--out``, removed at the end. The free disk is checked first (:data:`DISK_FACTOR` × the state).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from spate.checkpoint.ackinfo import RESTORED
from spate.checkpoint.inspect import load_checkpoint
from spate.checkpoint.metadata import CheckpointMetadata
from spate.errors import SpateError
from spate.fs import CheckpointStorage
from spate.report import format_table, human_bytes, percentile
from spate.runtime.batch import BatchProcessor, KeyedBatch
from spate.runtime.processor import Context
from spate.spark.stream_metrics import BatchMetrics
from spate.state.descriptors import ValueStateDescriptor
from spate_tools.bench.cluster import _KillOnce
from spate_tools.standalone import StandaloneCluster

GB = 1_000_000_000
VALUE_BYTES = 500
PARALLELISM = 2  # one subtask per executor: the killed executor's share is one subtask
MAX_PARALLELISM = 128
LOAD_ROWS = 1_000_000  # rows per load batch (at least 2 load batches)
STEADY = 3  # steady batches before the kill
UPDATES_SHARE, UPDATES_MAX = 0.01, 100_000  # keys per steady batch: 1 % of the keys, at most this many
VERIFY_MAX = 1_000_000  # keys the verification batch reads back
MEMORY_MB = 2048  # each executor's JVM heap (the Python workers are outside it)
DISK_FACTOR = 7.0  # free disk needed, × the state size (checkpoint root, lmdb copies, the restored copy, the copy)
REPLACEMENT_TIMEOUT_S = 180.0
COPY_BUFFER = 8 * 1024 * 1024
DISK_SAMPLE_S = 2.0
GOAL = 2.0  # recovery_vs_copy
VALUE: ValueStateDescriptor[bytes] = ValueStateDescriptor("value")
_PAD = np.random.default_rng(37).bytes(VALUE_BYTES - 8)  # incompressible, like real values


def value_of(version: int) -> bytes:
    """The 500-byte value batch ``version`` writes: its id in the first 8 bytes."""
    return version.to_bytes(8, "big") + _PAD


def version_of(value: bytes) -> int:
    return int.from_bytes(value[:8], "big")


class Overwrite(BatchProcessor):
    """Sets every key of the batch to the batch's value, in bulk. In batch ``verify_batch`` it first reads each
    key's value and emits the version it held (-1: none)."""

    def __init__(self, verify_batch: int) -> None:
        self.verify_batch = verify_batch

    def open(self, ctx: Context) -> None:
        self.value = ctx.bulk_state(VALUE)

    def process_batch(self, batch: KeyedBatch, ctx: Context) -> dict[str, Any] | None:
        out = None
        if ctx.batch_id == self.verify_batch:
            held = self.value.get_many(batch)
            out = {"k": batch.keys, "prev": [-1 if v is None else version_of(v) for v in held]}
        self.value.put_many(batch, [value_of(ctx.batch_id)] * len(batch))
        return out


@dataclass(frozen=True)
class Sizes:
    """The batches of one run: ``load_batches`` load batches, ``steady`` batches up to the kill (after batch
    ``kill_at``), the recovery batch and the verification batch."""

    state_gb: float
    keys: int
    load_batches: int
    updates: int
    verify_keys: int
    steady: int = STEADY

    @staticmethod
    def of(state_gb: float) -> Sizes:
        keys = int(state_gb * GB) // VALUE_BYTES
        if keys < 1_000:
            raise ValueError(f"--state-gb {state_gb:g} is too small: at least {1_000 * VALUE_BYTES / GB:g}")
        return Sizes(state_gb, keys, max(2, -(-keys // LOAD_ROWS)),
                     min(UPDATES_MAX, max(1_000, int(keys * UPDATES_SHARE))), min(VERIFY_MAX, keys))

    @property
    def kill_at(self) -> int:
        return self.load_batches + self.steady - 1

    @property
    def recovery_batch(self) -> int:
        return self.kill_at + 1

    @property
    def verify_batch(self) -> int:
        return self.kill_at + 2

    @property
    def batches(self) -> int:
        return self.verify_batch + 1

    def phase(self, batch_id: int) -> str:
        if batch_id < self.load_batches:
            return "load"
        if batch_id <= self.kill_at:
            return "steady" + (", then the kill" if batch_id == self.kill_at else "")
        return "recovery" if batch_id == self.recovery_batch else "verification"


@dataclass
class Expected:
    """What the verification batch must read: its keys (sorted) and the batch that wrote each last."""

    keys: np.ndarray
    versions: np.ndarray


def generate(directory: str, sizes: Sizes, seed: int = 37) -> Expected:
    """One Parquet file of keys (``k long``) per batch, modification times in batch order (the file source reads
    the oldest first)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(directory, exist_ok=True)
    rng = np.random.default_rng(seed)
    versions = np.empty(sizes.keys, dtype=np.int64)

    def write(batch_id: int, keys: np.ndarray) -> None:
        path = os.path.join(directory, f"batch-{batch_id:05d}.parquet")
        pq.write_table(pa.table({"k": keys.astype(np.int64)}), path)
        os.utime(path, (1_700_000_000 + batch_id, 1_700_000_000 + batch_id))

    bounds = np.linspace(0, sizes.keys, sizes.load_batches + 1).astype(np.int64)
    for b in range(sizes.load_batches):
        keys = np.arange(bounds[b], bounds[b + 1], dtype=np.int64)
        write(b, keys)
        versions[keys] = b
    for b in range(sizes.load_batches, sizes.verify_batch):
        keys = rng.integers(0, sizes.keys, sizes.updates, dtype=np.int64)
        write(b, keys)
        versions[keys] = b
    keys = np.sort(rng.choice(sizes.keys, sizes.verify_keys, replace=False).astype(np.int64))
    write(sizes.verify_batch, keys)
    return Expected(keys, versions[keys].copy())


def compare(keys: np.ndarray, prev: np.ndarray, expected: Expected) -> dict[str, Any]:
    """The verification batch's output (each key and the version its value held) against ``expected``."""
    order = np.argsort(keys, kind="stable")
    keys, prev = np.asarray(keys)[order], np.asarray(prev)[order]
    same_keys = len(keys) == len(expected.keys) and bool(np.array_equal(keys, expected.keys))
    return {"verified_keys": int(len(keys)), "expected_keys": int(len(expected.keys)), "same_keys": same_keys,
            "missing": int(np.count_nonzero(prev < 0)),
            "wrong": int(np.count_nonzero(prev != expected.versions)) if same_keys else None}


# -- the run ------------------------------------------------------------------------------------------------------
def _say(line: str) -> None:
    print(f"bench cluster large: {line}", file=sys.stderr, flush=True)


def dir_bytes(path: str) -> int:
    """Bytes the files under ``path`` take on disk (allocated blocks: lmdb's file may be sparse)."""
    total = 0
    for d, _, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(d, f)).st_blocks * 512
    return total


class DiskPeak:
    """On a thread: the largest size of ``path`` on disk, sampled every :data:`DISK_SAMPLE_S`."""

    def __init__(self, path: str) -> None:
        self.path, self.peak = path, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="spate-bench-disk", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(DISK_SAMPLE_S):
            self.sample()

    def sample(self) -> None:
        self.peak = max(self.peak, dir_bytes(self.path))

    def __enter__(self) -> DiskPeak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def check_disk(directory: str, state_gb: float) -> None:
    """Refuse to start without :data:`DISK_FACTOR` × the state free on ``directory``'s disk."""
    need = DISK_FACTOR * state_gb * GB
    free = shutil.disk_usage(directory).free
    if free < need:
        raise SpateError(f"spate bench cluster --large needs about {need / GB:.1f} GB free on the disk of "
                         f"{directory} ({DISK_FACTOR:g} × the state, {state_gb:g} GB: checkpoint root, lmdb copies "
                         f"on the workers, the restored copy and the copy floor's); it has {free / GB:.1f} GB free. "
                         "Free space, pass --out on a bigger disk, or a smaller --state-gb")


def _registered(sc: Any) -> set[str]:
    from spate.spark.placement import alive_executors

    return alive_executors(sc) or set()


def await_executors(sc: Any, count: int, gone: str | None = None,
                    timeout_s: float = REPLACEMENT_TIMEOUT_S) -> float | None:
    """Seconds until ``count`` executors (none of them ``gone``) are registered with the driver; None if not
    within ``timeout_s``."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        ids = _registered(sc)
        if len(ids) >= count and gone not in ids:
            return time.monotonic() - started
        time.sleep(0.25)
    return None


class _Sink:
    """The query's sink: kills one executor after batch ``kill_at`` (deleting its local state and waiting for
    its replacement), checks the verification batch's outputs, and says where the run is."""

    def __init__(self, cluster: StandaloneCluster, spark: Any, sizes: Sizes, expected: Expected) -> None:
        self.cluster, self.spark, self.sizes, self.expected = cluster, spark, sizes, expected
        self.kill = _KillOnce(cluster, spark, sizes.kill_at)
        self.replacement_s: float | None = None
        self.killed_local_bytes = 0
        self.check: dict[str, Any] | None = None
        self.started = time.perf_counter()

    def __call__(self, outputs: Any, batch_id: int) -> None:
        already = self.kill.killed is not None
        self.kill(outputs, batch_id)
        victim = self.kill.victim
        if victim is not None and not already:
            killed_at = time.monotonic()
            self.killed_local_bytes = self._drop_local_state(victim.worker)
            waited = await_executors(self.spark.sparkContext, 2, gone=victim.executor_id)
            self.replacement_s = None if waited is None else round(time.monotonic() - killed_at, 2)
        if batch_id == self.sizes.verify_batch and self.check is None:
            table = outputs.select("k", "prev").toArrow()
            self.check = compare(table["k"].to_numpy(), table["prev"].to_numpy(), self.expected)
        _say(f"batch {batch_id + 1}/{self.sizes.batches} done ({self.sizes.phase(batch_id)}), "
             f"{time.perf_counter() - self.started:.0f} s")

    def _drop_local_state(self, worker: int) -> int:
        """Delete the lmdb copies under the killed executor's worker's local dir (the replacement has run nothing
        yet; the copies are in the dead executor's block-manager directory): as if the machine's disk were lost
        with it. Returns the bytes they held."""
        dropped = 0
        for d, dirs, _ in os.walk(self.cluster.worker_local_dir(worker)):
            if "spate-local" in dirs:
                path = os.path.join(d, "spate-local")
                dropped += dir_bytes(path)
                shutil.rmtree(path, ignore_errors=True)
                dirs.remove("spate-local")
        return dropped


def copy_floor(segments: Sequence[tuple[str, int, int]], target: str,
               before_delete: Callable[[], None] | None = None) -> float:
    """Seconds for the operating system to copy ``segments`` (path, offset, length) into files under ``target``
    (the same disk), each file fsynced; the copy is deleted after (``before_delete`` is called first)."""
    os.makedirs(target)
    by_file: dict[str, list[tuple[int, int]]] = {}
    for path, offset, length in segments:
        by_file.setdefault(path, []).append((offset, length))
    buf = memoryview(bytearray(COPY_BUFFER))
    started = time.perf_counter()
    try:
        for n, (path, ranges) in enumerate(sorted(by_file.items())):
            with open(path, "rb", buffering=0) as src, open(f"{target}/{n}", "wb", buffering=0) as dst:
                for offset, length in sorted(ranges):
                    src.seek(offset)
                    while length > 0:
                        got = src.readinto(buf[:min(length, COPY_BUFFER)])
                        if not got:
                            raise SpateError(f"{path} ends before offset {offset} + {length}")
                        dst.write(buf[:got])
                        length -= got
                os.fsync(dst.fileno())
        elapsed = time.perf_counter() - started
        if before_delete is not None:
            before_delete()
        return elapsed
    finally:
        shutil.rmtree(target, ignore_errors=True)


def restore_segments(storage: CheckpointStorage, base: CheckpointMetadata,
                     subtasks: Sequence[int]) -> list[tuple[str, int, int]]:
    """(absolute path, offset, length) of every segment a restore of ``subtasks`` from ``base`` reads: their
    keyed snapshots, change sets, change-set lists and operator state."""
    refs = {}
    for i in subtasks:
        st = base.subtasks[i]
        for h in (*st.keyed, *st.changelog, *st.changelog_lists, *((st.operator,) if st.operator else ())):
            refs[h.segment.key] = h.segment
    return [(storage.path(r.path), r.offset, r.length) for r in refs.values()]


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


def _run(cluster: StandaloneCluster, spark: Any, source: str, root: str, sizes: Sizes,
         expected: Expected) -> tuple[Any, dict[int, float], _Sink]:
    from spate.spark.stream import StatefulStream

    df = spark.readStream.schema("k long").option("maxFilesPerTrigger", 1).parquet(source)
    stream = StatefulStream(df, "k", Overwrite(sizes.verify_batch), "k long, prev long", checkpoint_root=root,
                            parallelism=PARALLELISM, max_parallelism=MAX_PARALLELISM, table="lmdb",
                            changelog=True, file_merging="across")
    sink = _Sink(cluster, spark, sizes, expected)
    query = stream.start(sink, trigger={"availableNow": True}, spark_checkpoint=f"{root}-spark")
    try:
        query.awaitTermination()
    finally:
        stream.close()
    trigger_ms = {p["batchId"]: p["durationMs"]["triggerExecution"] for p in query.recentProgress
                  if p["numInputRows"]}
    return stream, trigger_ms, sink


def bench_cluster_large(quick: bool = False, state_gb: float = 4.0,
                        out_dir: str = "bench-out") -> tuple[list[dict[str, Any]], str]:
    """The large-state case (``spate bench cluster --large``): its row and table. Not a quick case."""
    if quick:
        raise ValueError("the large-state case has no --quick size: pass a smaller --state-gb")
    sizes = Sizes.of(state_gb)
    os.makedirs(out_dir, exist_ok=True)
    check_disk(out_dir, state_gb)
    workdir = tempfile.mkdtemp(prefix=".spate-bench-cluster-large-", dir=out_dir)  # on --out's disk
    started = time.perf_counter()
    try:
        source, root = os.path.join(workdir, "in"), os.path.join(workdir, "root")
        _say(f"{sizes.keys:,} keys ({state_gb:g} GB), {sizes.batches} batches; writing the input")
        t = time.perf_counter()
        expected = generate(source, sizes)
        generate_s = time.perf_counter() - t
        with DiskPeak(workdir) as disk:
            _say("starting the cluster")
            with StandaloneCluster(workers=2, cores=1, memory_mb=MEMORY_MB, root=os.path.join(workdir, "cluster"),
                                   stop_timeout_s=60.0) as cluster:
                spark = cluster.session("spate-bench-cluster-large",
                                        extra={"spark.sql.shuffle.partitions": str(PARALLELISM)})
                try:
                    if await_executors(spark.sparkContext, 2) is None:
                        raise SpateError("the cluster's 2 executors did not register with the driver in time")
                    stream, trigger_ms, sink = _run(cluster, spark, source, root, sizes, expected)
                finally:
                    spark.stop()
            disk.sample()
            shutil.rmtree(cluster.root, ignore_errors=True)  # the workers' lmdb copies: not needed for the copy
            storage = CheckpointStorage(root)
            base = load_checkpoint(storage, sizes.kill_at)
            recovered = load_checkpoint(storage, sizes.recovery_batch)
            restored = [i for i, st in enumerate(recovered.subtasks) if st.recovery == RESTORED]
            segments = restore_segments(storage, base, restored)
            _say(f"copy floor: {human_bytes(sum(s[2] for s in segments))}, the base segments of subtasks {restored}")
            copy_s = copy_floor(segments, os.path.join(workdir, "copy"), disk.sample)
        observed = Observed(trigger_ms, list(stream.metrics), base, recovered,
                            load_checkpoint(storage, sizes.verify_batch), sink.kill.killed, copy_s,
                            sum(s[2] for s in segments), sink.check, sink.replacement_s, sink.killed_local_bytes,
                            generate_s, disk.peak, time.perf_counter() - started)
        result = shape_result(sizes, observed)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return [result], table(result)


def table(r: dict[str, Any]) -> str:
    rows = [{"metric": k, "value": human_bytes(v) if "bytes" in k and isinstance(v, int) and v > 4096 else v}
            for k, v in r.items() if k != "variant"]
    title = (f"spate bench cluster --large: standalone master + 2 workers (1 core each) on 127.0.0.1, parallelism "
             f"{PARALLELISM}, lmdb, changelog on, file merging across, {r['state_gb']:g} GB of {VALUE_BYTES}-byte "
             f"values; one executor killed, its subtask restored on the replacement; goal: recovery_vs_copy "
             f"(restore_ms_max / copy_s) <= {GOAL:g}")
    return format_table(rows, title=title)
