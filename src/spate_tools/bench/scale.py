"""``spate bench scale``: proven at 10 GB. One subtask on lmdb holds value state of 500-byte values, 1 GB and
10 GB of it in one invocation (0.2 GB and 1 GB with ``--quick``), with the changelog on (``changelog``) and off
(``full``), file merging across checkpoints.

Per state size and variant, each in a working directory of its own (removed before the next):

1. **load** (not measured): keys ``0..n-1`` (``n = size / 500 bytes``: 2M keys at 1 GB, 20M at 10 GB) written
   in bulk into the subtask's lmdb table, as ``bench blog`` and ``bench rescale`` pre-fill, by a runner with the
   changelog off, then one checkpoint: a full snapshot of the loaded state;
2. **measured phase**: a new runner with the variant's settings on the same root and local directory (it
   reuses the local table) runs one warm-up batch, then batches of ``updates`` random existing keys and
   ``new_keys`` new ones, through a ``BatchProcessor`` that overwrites each key's value in bulk (the value
   carries the batch id). The batches enter the subtask as Arrow tables grouped by key, with their key groups
   computed by Spark's hash, as a Spark task's rows do. Both variants of one size see the same keys. With the
   changelog, the phase goes on past ``batches`` until ``min_materializations`` materializations completed
   (at most ``max_batches``), so the run shows what a materialization does to the batches around it;
3. **copy floor** (``copy_s``): the bytes recovery reads (every segment the last checkpoint references, and its
   ``_metadata``) copied by the operating system to another directory on the same disk, each file fsynced,
   timed and deleted;
4. **recovery** (``recovery_s``): the local directory deleted, a new runner on the root at parallelism 1 with an
   empty local directory restores the last checkpoint and runs an empty batch up to its acknowledgements (its
   checkpoint is not committed): the wall time from constructing the runner until then. ``restore_s`` (extra)
   is the library's own figure for the restore (the slowest subtask's ``restore_ms``);
5. **rescaled recovery** (``recovery_rescaled_s``): the same at parallelism 2 (twice the parallelism), again
   with an empty local directory. After both, the restored subtasks' entries are counted (and, with
   ``verify=True``, every key's value read back and compared with the batch that wrote it last).

Figures per (size, variant): batch p50/p99 (the whole micro-batch: processing, snapshot and commit), checkpoint
p50/p99.9 (``BatchResult.checkpoint_ms``; with fewer than 1,000 checkpoints p99.9 is the maximum),
``materialization_s`` (the longest materialization of the phase, as the library records it: from its start
until the checkpoint that picks up its result; None without the changelog), the batch p99 of the batches while a
materialization ran (± ``NEAR`` batches) and of the others, ``checkpoint_bytes`` (every byte the last checkpoint
references), and ``anon_rss_mb_max``: the largest ``RssAnon`` of the process (sampled every 50 ms from the
measured phase to the end of the rescaled recovery; lmdb's mapped pages are file-backed and do not count; the
load's own peak is ``anon_rss_mb_load``).

Before it starts, the benchmark checks the free space on the disk of its working directory (``--out``'s) and
refuses with the figure needed: :data:`DISK_FACTOR` × the largest state size. While it runs, the process's
private memory is capped at what the machine had available (:func:`memory_guard`): a variant that needs more
fails with an out-of-memory line in the table and the run goes on with the next.
"""

from __future__ import annotations

import contextlib
import gc
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from spate.errors import SpateError
from spate.keygroups import compile_key_hasher
from spate.layout import metadata_path
from spate.report import format_table, human_bytes, percentile, progress
from spate.runtime.batch import BatchProcessor, KeyedBatch
from spate.runtime.local import BatchResult, LocalRunner
from spate.runtime.processor import Context
from spate.state.bulk import BulkValueState
from spate.state.descriptors import ValueStateDescriptor

VALUE: ValueStateDescriptor[bytes] = ValueStateDescriptor("value")
VALUE_BYTES = 500
GB = 1_000_000_000
MAX_PARALLELISM = 128
VARIANTS = ("changelog", "full")
LOAD_VERSION = 0  # the version the loaded values carry; a measured batch's values carry its batch id (≥ 2)
LOAD_CHUNK = 500_000  # keys per bulk write while loading
NEAR = 2  # batches before and after a materialization that count as "around" it
MIN_CHECKPOINTS_FOR_P999 = 1_000
DISK_FACTOR = 6.5  # free disk needed, × the largest state size (one variant's files at a time; 6.0× measured at 1 GB)
MEMORY_RESERVE = 2 * 1024**3  # bytes of the machine's available memory the memory guard leaves to others
COPY_BUFFER = 8 * 1024 * 1024
RSS_SAMPLE_S = 0.05
DISK_SAMPLE_S = 1.0
_PAD = np.random.default_rng(37).bytes(VALUE_BYTES - 8)  # incompressible, like real values
GOALS = {"recovery / copy_s": ("≤ 2", 2.0), "rescaled recovery / copy_s": ("≤ 2.5", 2.5),
         "recovery changelog / full": ("≤ 1.0", 1.0), "batch p99 large / small": ("≤ 1.2", 1.2),
         "changelog checkpoint p99.9 large / small": ("≤ 1.2", 1.2), "anon RSS MB at the largest size": ("≤ 1,024",
                                                                                                       1024.0)}


@dataclass(frozen=True)
class Setup:
    """Sizes of one run."""

    sizes_gb: tuple[float, ...]
    batches: int  # measured batches (at least)
    full_batches: int | None = None  # measured batches with the changelog off (each checkpoint writes the whole
    # state: at 10 GB about a minute each); None: ``batches``
    updates: int = 50_000  # random existing keys per batch
    new_keys: int = 2_500  # new keys per batch
    min_materializations: int = 1  # changelog: go on until this many materializations completed ...
    max_batches: int = 400  # ... but no further than this many batches


FULL = Setup(sizes_gb=(1, 10), batches=40, full_batches=12)
QUICK = Setup(sizes_gb=(0.2, 1), batches=20)


def value_of(version: int) -> bytes:
    """The 500-byte value a batch writes: its version (the batch id) in the first 8 bytes."""
    return version.to_bytes(8, "big") + _PAD


def version_of(value: bytes) -> int:
    return int.from_bytes(value[:8], "big")


class Overwrite(BatchProcessor):
    """Sets every key of the batch to the batch's value, in bulk; emits nothing."""

    def open(self, ctx: Context) -> None:
        self.value = ctx.bulk_state(VALUE)

    def process_batch(self, batch: KeyedBatch, ctx: Context) -> None:
        self.value.put_many(batch, [value_of(ctx.batch_id)] * len(batch))


# -- keys ------------------------------------------------------------------------------------------------------
_C1, _C2, _SEED = np.uint32(0xCC9E2D51), np.uint32(0x1B873593), np.uint32(42)


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


def key_groups(keys: np.ndarray, max_parallelism: int = MAX_PARALLELISM) -> np.ndarray:
    """``pmod(hash(k), max_parallelism)`` of int64 keys: Spark's Murmur3 ``hashLong`` with seed 42, vectorized
    (:func:`spate.keygroups.murmur3.hash_long` key by key; :func:`check_key_groups` compares the two)."""
    words = np.asarray(keys, dtype=np.int64).view(np.uint64)
    h = np.full(len(words), _SEED, dtype=np.uint32)
    with np.errstate(over="ignore"):
        for word in (words & np.uint64(0xFFFFFFFF), words >> np.uint64(32)):
            k = word.astype(np.uint32) * _C1
            h ^= _rotl(k, 15) * _C2
            h = _rotl(h, 13) * np.uint32(5) + np.uint32(0xE6546B64)
        h ^= np.uint32(8)
        h ^= h >> np.uint32(16)
        h *= np.uint32(0x85EBCA6B)
        h ^= h >> np.uint32(13)
        h *= np.uint32(0xC2B2AE35)
        h ^= h >> np.uint32(16)
    return np.mod(h.view(np.int32).astype(np.int64), max_parallelism)


def check_key_groups(sample: int = 2_000) -> None:
    """The vectorized key groups are the library's (a wrong one would put keys in subtasks that do not own
    them: the bulk write refuses those)."""
    keys = np.concatenate([np.arange(sample, dtype=np.int64), np.array([2**31, 2**40 + 7, 2**62], dtype=np.int64)])
    hasher = compile_key_hasher(None)
    expected = np.array([hasher(int(k)) % MAX_PARALLELISM for k in keys], dtype=np.int64)
    if not np.array_equal(key_groups(keys), expected):
        raise AssertionError("spate bench scale: the vectorized key groups differ from spate.keygroups'")


def keyed_batch(keys: np.ndarray) -> KeyedBatch:
    """``keys`` grouped as a Spark task hands them to a subtask (sorted by key group and key)."""
    keys = np.asarray(keys, dtype=np.int64)
    return KeyedBatch.from_arrow(pa.table({"k": keys, "kg": key_groups(keys)}), ["k"], "kg")


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


# -- measuring the process ---------------------------------------------------------------------------------------
def anon_rss_kib() -> int:
    """``RssAnon`` of this process in KiB (Linux): what it holds itself, not lmdb's file-backed pages."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    return 0


class Sampler:
    """On a thread: the largest ``RssAnon`` since the last :meth:`take` (every :data:`RSS_SAMPLE_S`) and the
    largest size of the watched directory since the last :meth:`take_disk` (every :data:`DISK_SAMPLE_S`)."""

    def __init__(self) -> None:
        self._max = anon_rss_kib()
        self._disk_max = 0
        self._watched: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="spate-bench-sampler", daemon=True)

    def _run(self) -> None:
        ticks = 0
        every = max(1, round(DISK_SAMPLE_S / RSS_SAMPLE_S))
        while not self._stop.wait(RSS_SAMPLE_S):
            with contextlib.suppress(MemoryError, OSError):  # under the memory guard, sampling may fail too
                self._max = max(self._max, anon_rss_kib())
                ticks += 1
                if ticks % every == 0:
                    self.sample_disk()

    def sample_disk(self) -> None:
        watched = self._watched
        if watched is not None:
            self._disk_max = max(self._disk_max, dir_bytes(watched))

    def watch(self, path: str | None) -> None:
        self._watched, self._disk_max = path, 0

    def take(self) -> float:
        """The largest anonymous RSS (MB) since the last call; starts the next interval."""
        now = anon_rss_kib()
        peak, self._max = max(self._max, now), now
        return round(peak / 1024, 1)

    def take_disk(self) -> int:
        """The largest size (bytes) of the watched directory since :meth:`watch` or the last call."""
        self.sample_disk()
        peak, self._disk_max = self._disk_max, 0
        return peak

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _proc_kib(path: str, name: str) -> int:
    with open(path) as f:
        for line in f:
            if line.startswith(name + ":"):
                return int(line.split()[1])
    raise SpateError(f"no {name} in {path}")


@contextlib.contextmanager
def memory_guard() -> Iterator[int | None]:
    """Cap this process's private writable memory (``RLIMIT_DATA``) at what it has now plus what the machine
    has available, less :data:`MEMORY_RESERVE`: on a shared machine, a run that would need more memory than
    there is fails with ``MemoryError`` instead of waking the kernel's OOM killer. lmdb's map is file-backed
    and shared, so it does not count. Yields the limit in bytes (None where it cannot be set)."""
    try:
        import resource

        available = _proc_kib("/proc/meminfo", "MemAvailable") * 1024
        data = _proc_kib("/proc/self/status", "VmData") * 1024
        old = resource.getrlimit(resource.RLIMIT_DATA)
    except (ImportError, OSError, SpateError):
        yield None
        return
    limit = data + max(0, available - MEMORY_RESERVE)
    if old[0] != resource.RLIM_INFINITY:
        limit = min(limit, old[0])
    resource.setrlimit(resource.RLIMIT_DATA, (limit, old[1]))
    try:
        yield limit
    finally:
        resource.setrlimit(resource.RLIMIT_DATA, old)


def out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` is, or was caused by, a ``MemoryError``."""
    seen: set[int] = set()
    e: BaseException | None = error
    while e is not None and id(e) not in seen:
        if isinstance(e, MemoryError):
            return True
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return False


def release_memory() -> None:
    """Between variants: hand freed heap back to the system, so one variant's peak does not count in the next."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)


def dir_bytes(path: str) -> int:
    """Bytes the files under ``path`` take on disk (allocated blocks: lmdb's file may be sparse)."""
    total = 0
    for d, _, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.stat(os.path.join(d, f)).st_blocks * 512
    return total


def check_disk(workdir: str, sizes_gb: Sequence[float]) -> None:
    """Refuse to start without :data:`DISK_FACTOR` × the largest state size free on ``workdir``'s disk."""
    need = DISK_FACTOR * max(sizes_gb) * GB
    free = shutil.disk_usage(workdir).free
    if free < need:
        raise SpateError(f"spate bench scale needs about {need / GB:.1f} GB free on the disk of {workdir} "
                         f"({DISK_FACTOR:g} × the largest state, {max(sizes_gb):g} GB: one variant's checkpoint "
                         f"root, lmdb table and copy at a time); it has {free / GB:.1f} GB free. Free space, pass "
                         "--out on a bigger disk, or run with --quick")


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

    def runner(self, changelog: bool, parallelism: int = 1, local_dir: str | None = None,
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


def measure(run: Run, rng: np.random.Generator, versions: np.ndarray | None) -> Measured:
    """The warm-up batch, then the measured batches; ``versions[k]`` follows the batch that last wrote key k."""
    s, changelog = run.setup, run.variant == "changelog"
    next_key = run.keys
    samples: list[dict[str, Any]] = []
    last: BatchResult | None = None

    def one(runner: _Prepared) -> BatchResult:
        nonlocal next_key
        keys = np.unique(np.concatenate([rng.integers(0, next_key, s.updates, dtype=np.int64),
                                         np.arange(next_key, next_key + s.new_keys, dtype=np.int64)]))
        next_key += s.new_keys
        runner.prepared = keyed_batch(keys)
        result = runner.run_batch(runner.next_batch_id, [])
        if versions is not None:
            versions[keys] = result.batch_id
        return result

    with run.runner(changelog=changelog) as runner:
        one(runner)  # warm-up: the first batch of this runner checks and reuses the loaded local table
        started = time.perf_counter()
        for i in range(s.max_batches):
            batch_started = time.perf_counter() - started
            last = one(runner)
            st = last.checkpoint.subtasks[0]
            samples.append({"batch": i, "at_s": round(batch_started, 3), "batch_ms": round(last.batch_ms, 2),
                            "checkpoint_ms": round(last.checkpoint_ms, 2),
                            "materialization_started": bool(st.stats.get("materialization_started")),
                            "materialization_ms": st.stats.get("materialization_ms"),
                            "checkpoint_bytes": last.checkpoint.state_bytes})
            done = sum(x["materialization_ms"] is not None for x in samples)
            _status(f"{run.label}: batch {i + 1} ({s.batches} at least), {done} materialization(s) completed, "
                    f"{time.perf_counter() - started:.0f} s")
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
    return Measured(samples, segments, checkpoint_bytes, next_key, dir_bytes(f"{run.workdir}/local"))


def copy_floor(segments: Sequence[tuple[str, int, int]], target: str, sampler: Sampler | None = None) -> float:
    """Seconds for the operating system to copy ``segments`` (path, offset, length) into files under ``target``
    (same disk), each file fsynced; the copy is deleted after."""
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
        if sampler is not None:
            sampler.sample_disk()  # the copy's bytes count in the disk the run needs
        return elapsed
    finally:
        shutil.rmtree(target, ignore_errors=True)


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
        entries = sum((sub.keyed.table.entry_count() or 0) if sub.keyed is not None else 0 for sub in subs)
        values_ok = None if versions is None else all(_values_match(sub, versions[:expected_keys]) for sub in subs)
        return {"s": round(elapsed, 3), "restore_s": round(max(sub.recovery.restore_ms for sub in subs) / 1000, 3),
                "restore_bytes": sum(sub.recovery.restore_bytes for sub in subs),
                "how": sorted({sub.recovery.recovery for sub in subs}), "entries": entries,
                "ok": entries == expected_keys and values_ok is not False}
    finally:
        runner.close()
        shutil.rmtree(local, ignore_errors=True)


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
    load_s = load(run)
    anon_load = sampler.take()
    rng = np.random.default_rng([37, int(run.state_gb * 1000)])  # the same keys for both variants of a size
    m = measure(run, rng, versions)
    shutil.rmtree(f"{run.workdir}/local")  # before the copy: recovery starts from an empty local directory
    copy_s = copy_floor(m.segments, f"{run.workdir}/copy", sampler)
    rec = recover(run, 1, m.next_key, versions)
    rescaled = recover(run, 2, m.next_key, versions)
    anon_max = sampler.take()
    row = summarize(run, m, copy_s, rec, rescaled, anon_max)
    disk = sampler.take_disk()
    sampler.watch(None)
    row.update({"anon_rss_mb_load": anon_load, "load_s": round(load_s, 1), "disk_bytes_max": disk,
                "disk_per_state": round(disk / (run.state_gb * GB), 2), "lmdb_bytes": m.local_bytes})
    return row, m.samples


def failed(run: Run, error: str) -> dict[str, Any]:
    """The row of a variant that could not finish: its contract keys without figures, and why."""
    return {"state_gb": run.state_gb, "variant": run.variant, "keys": run.keys,
            **{k: None for k in ("batch_ms_p50", "batch_ms_p99", "checkpoint_ms_p50", "checkpoint_ms_p999",
                                 "materialization_s", "checkpoint_bytes", "recovery_s", "recovery_rescaled_s",
                                 "copy_s", "anon_rss_mb_max")}, "error": error}


def materialization_spans(samples: list[dict[str, Any]]) -> tuple[list[tuple[int, int]], list[float]]:
    """Batches during which a materialization ran, as (first, last) sample indexes, and the durations (ms) of
    those that completed. One starts after the batch whose ack says so; its result is picked up by a later
    checkpoint (which reports its duration), at the latest one batch after it finished."""
    spans, done, open_at = [], [], None
    for i, x in enumerate(samples):
        if x["materialization_ms"] is not None and open_at is not None:
            spans.append((open_at, i))
            done.append(x["materialization_ms"])
            open_at = None
        if x["materialization_started"]:
            open_at = i + 1
    if open_at is not None and open_at < len(samples):
        spans.append((open_at, len(samples) - 1))
    return spans, done


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
            "batch_ms_p50": _r(percentile(batch, 50)), "batch_ms_p99": _r(percentile(batch, 99)),
            "checkpoint_ms_p50": _r(percentile(cp, 50)), "checkpoint_ms_p999": _r(percentile(cp, 99.9)),
            "materialization_s": round(max(done) / 1000, 2) if done else None,
            "checkpoint_bytes": m.checkpoint_bytes, "recovery_s": rec["s"], "recovery_rescaled_s": rescaled["s"],
            "copy_s": round(copy_s, 3), "anon_rss_mb_max": anon_max,
            # beyond the contract
            "batches": len(samples), "p999_is_max": len(cp) < MIN_CHECKPOINTS_FOR_P999,
            "checkpoint_ms_p99": _r(percentile(cp, 99)), "checkpoint_ms_max": _r(max(cp)),
            "materializations": len(done),
            "materialization_s_p50": round(statistics.median(done) / 1000, 2) if done else None,
            "batch_ms_p99_materializing": _r(percentile(around, 99)), "batch_ms_p99_other": _r(percentile(away, 99)),
            "restore_s": rec["restore_s"], "restore_rescaled_s": rescaled["restore_s"],
            "restore_bytes": rec["restore_bytes"], "restore_rescaled_bytes": rescaled["restore_bytes"],
            "recovered": rec["how"], "recovered_rescaled": rescaled["how"],
            "recovered_entries": rec["entries"], "recovered_rescaled_entries": rescaled["entries"],
            "state_checked": bool(rec["ok"] and rescaled["ok"])}


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 2)


# -- the benchmark -----------------------------------------------------------------------------------------------
def bench_scale(quick: bool, out_dir: str = "bench-out", sizes_gb: Sequence[float] | None = None,
                batches: int | None = None, verify: bool = False, chart: bool = True,
                **setup: Any) -> tuple[list[dict[str, Any]], str]:
    """Rows per (state size, variant) and the table; the chart ``scale-times.png`` in ``out_dir``. ``sizes_gb``,
    ``batches`` and the other :class:`Setup` fields override the run's sizes (tests run tiny ones);
    ``verify`` reads every restored value back."""
    base = QUICK if quick else FULL
    s = Setup(sizes_gb=tuple(sizes_gb or base.sizes_gb), batches=batches or base.batches,
              **{k: setup.get(k, getattr(base, k)) for k in ("full_batches", "updates", "new_keys",
                                                              "min_materializations", "max_batches")})
    os.makedirs(out_dir, exist_ok=True)
    check_disk(out_dir, s.sizes_gb)
    check_key_groups()
    workdir = tempfile.mkdtemp(prefix=".spate-bench-scale-", dir=out_dir)  # on --out's disk (not a RAM /tmp)
    runs = [Run(gb, v, f"{workdir}/{gb:g}gb-{v}", s) for gb in s.sizes_gb for v in VARIANTS]
    results, series = [], {}
    started = time.perf_counter()
    try:
        with Sampler() as sampler, memory_guard() as limit:
            for run in runs:
                check_disk(workdir, [run.state_gb])
                try:
                    row, samples = run_variant(run, sampler, verify)
                except Exception as e:
                    if not out_of_memory(e):
                        raise
                    row, samples = failed(run, f"out of memory: the process's private memory reached its limit "
                                               f"({(limit or 0) / 2**30:.1f} GiB: what the machine had available "
                                               f"at the start, less {MEMORY_RESERVE / 2**30:g} GiB)"), []
                finally:
                    shutil.rmtree(run.workdir, ignore_errors=True)  # every variant's files go before the next
                    sampler.watch(None)
                    release_memory()
                results.append(row)
                series[(run.state_gb, run.variant)] = samples
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    path = plot_times(series, out_dir) if chart else None
    return results, table(results, s, time.perf_counter() - started) + (f"\nchart: {path}" if path else "")


def ratios(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each goal's ratio, per size and variant where it applies, with whether it is met."""
    by = {(r["state_gb"], r["variant"]): r for r in results}
    sizes = sorted({r["state_gb"] for r in results})
    out: list[dict[str, Any]] = []

    def add(goal: str, where: str, value: float | None) -> None:
        text, bound = GOALS[goal]
        out.append({"goal": goal, "where": where, "value": value, "bound": text,
                    "met": "-" if value is None else ("yes" if value <= bound else "NO")})

    for r in results:
        where = f"{r['state_gb']:g} GB {r['variant']}"
        add("recovery / copy_s", where, _ratio(r["recovery_s"], r["copy_s"]))
        add("rescaled recovery / copy_s", where, _ratio(r["recovery_rescaled_s"], r["copy_s"]))
    for gb in sizes:
        c, f = by.get((gb, "changelog")), by.get((gb, "full"))
        if c and f:
            add("recovery changelog / full", f"{gb:g} GB", _ratio(c["recovery_s"], f["recovery_s"]))
    if len(sizes) > 1:
        small, large = sizes[0], sizes[-1]
        for v in VARIANTS:
            a, b = by.get((small, v)), by.get((large, v))
            if a and b:
                add("batch p99 large / small", f"{v}: {large:g} / {small:g} GB", _ratio(b["batch_ms_p99"],
                                                                                   a["batch_ms_p99"]))
        a, b = by.get((small, "changelog")), by.get((large, "changelog"))
        if a and b:
            add("changelog checkpoint p99.9 large / small", f"{large:g} / {small:g} GB",
                _ratio(b["checkpoint_ms_p999"], a["checkpoint_ms_p999"]))
    for v in VARIANTS:
        largest = by.get((sizes[-1], v)) if sizes else None
        if largest:
            add("anon RSS MB at the largest size", f"{sizes[-1]:g} GB {v}", largest["anon_rss_mb_max"])
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a is not None and b else None


def table(results: list[dict[str, Any]], s: Setup, elapsed_s: float) -> str:
    done = [r for r in results if "error" not in r]
    rows = [{"state": f"{r['state_gb']:g} GB", "variant": r["variant"], "keys": r["keys"], "batches": r["batches"],
             "batch p50 ms": r["batch_ms_p50"], "batch p99 ms": r["batch_ms_p99"],
             "checkpoint p50 ms": r["checkpoint_ms_p50"], "checkpoint p99.9 ms": r["checkpoint_ms_p999"],
             "materialization s (n)": "-" if r["materialization_s"] is None else
             f"{r['materialization_s']:g} ({r['materializations']})",
             "batch p99 ms materializing / other": f"{_cell(r['batch_ms_p99_materializing'])} / "
                                                   f"{_cell(r['batch_ms_p99_other'])}",
             "checkpoint": human_bytes(r["checkpoint_bytes"]), "copy s": r["copy_s"], "recovery s": r["recovery_s"],
             "rescaled s": r["recovery_rescaled_s"],
             "restore s (1 / 2)": f"{r['restore_s']:g} / {r['restore_rescaled_s']:g}",
             "anon RSS MB": r["anon_rss_mb_max"], "load: anon MB, s": f"{r['anon_rss_mb_load']:g}, {r['load_s']:g}",
             "disk peak": f"{human_bytes(r['disk_bytes_max'])} ({r['disk_per_state']:g}×)",
             "state checked": "yes" if r["state_checked"] else "NO"} for r in done]
    title = (f"spate bench scale: one subtask, lmdb, file merging across, value state of {VALUE_BYTES}-byte values; "
             f"batches of {s.updates:,} random existing keys + {s.new_keys:,} new keys ({s.batches} at least, "
             f"{s.full_batches or s.batches} with the changelog off; with the changelog until "
             f"{s.min_materializations} materialization(s) completed, at most "
             f"{s.max_batches}); recovery: a new runner, empty local directory, up to its first batch's acks; "
             f"{elapsed_s / 60:.1f} min in all")
    notes = [f"p99.9 is the maximum below {MIN_CHECKPOINTS_FOR_P999:,} checkpoints; materializing: the batches "
             f"while a materialization ran, ± {NEAR}"] if any(r["p999_is_max"] for r in done) else []
    notes += [f"{r['state_gb']:g} GB {r['variant']}: FAILED, {r['error']}" for r in results if "error" in r]
    return (format_table(rows, title=title) + "".join(f"\n{n}" for n in notes) + "\n\n"
            + format_table(ratios(results), title="goals (10 GB vs 1 GB in a full run; --quick: 1 GB vs 0.2 GB)"))


def _cell(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


# -- chart -------------------------------------------------------------------------------------------------------
def plot_times(series: dict[tuple[float, str], list[dict[str, Any]]], out_dir: str) -> str | None:
    """Batch and checkpoint times over the measured phase, one column per state size, one line per variant;
    the changelog's materializations shaded."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    sizes = sorted({gb for gb, _ in series})
    if not sizes:
        return None
    fig, axes = plt.subplots(2, len(sizes), figsize=(6 * len(sizes), 7), squeeze=False, sharex="col")
    for col, gb in enumerate(sizes):
        for row, (metric, ylabel) in enumerate((("batch_ms", "batch (ms)"), ("checkpoint_ms", "checkpoint (ms)"))):
            ax = axes[row][col]
            for variant in VARIANTS:
                points = series.get((gb, variant), [])
                ax.plot([p["at_s"] for p in points], [p[metric] for p in points], label=variant,
                        marker="." if len(points) < 200 else None, linewidth=0.8)
                if variant == "changelog":
                    spans, _ = materialization_spans(points)
                    for k, (a, b) in enumerate(spans):
                        ax.axvspan(points[a]["at_s"], points[b]["at_s"], color="tab:green", alpha=0.12,
                                   label="materializing" if k == 0 else None)
            ax.set_yscale("log")
            ax.set_ylabel(ylabel)
            if row == 0:
                ax.set_title(f"{gb:g} GB of state")
            else:
                ax.set_xlabel("time since the measured phase started (s)")
            ax.legend()
    fig.suptitle("spate bench scale: batch and checkpoint times, changelog vs full snapshots (lmdb, one subtask)")
    fig.tight_layout()
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "scale-times.png")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
