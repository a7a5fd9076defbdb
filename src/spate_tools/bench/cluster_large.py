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

This module runs the case; :mod:`~spate_tools.bench.cluster_large_job` holds the job (sizes, input, processor,
the check of what it reads back), :mod:`~spate_tools.bench.cluster_large_result` the result row and its table, and
:mod:`~spate_tools.bench.disk_floor` the copy floor.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from typing import Any

from spate.checkpoint.ackinfo import RESTORED
from spate.checkpoint.inspect import load_checkpoint
from spate.checkpoint.metadata import CheckpointMetadata
from spate.errors import SpateError
from spate.fs import CheckpointStorage
from spate.report import human_bytes
from spate_tools.bench.cluster import _KillOnce
from spate_tools.bench.cluster_large_job import (
    GB,
    MAX_PARALLELISM,
    PARALLELISM,
    Expected,
    Overwrite,
    Sizes,
    compare,
    generate,
)
from spate_tools.bench.cluster_large_result import Observed, shape_result, table
from spate_tools.bench.disk_floor import copy_floor, dir_bytes
from spate_tools.standalone import StandaloneCluster

MEMORY_MB = 2048  # each executor's JVM heap (the Python workers are outside it)
DISK_FACTOR = 7.0  # free disk needed, × the state size (checkpoint root, lmdb copies, the restored copy, the copy)
REPLACEMENT_TIMEOUT_S = 180.0
DISK_SAMPLE_S = 2.0


def _say(line: str) -> None:
    print(f"bench cluster large: {line}", file=sys.stderr, flush=True)


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
