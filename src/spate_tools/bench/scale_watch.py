"""What ``spate bench scale`` (:mod:`spate_tools.bench.scale`) watches in its own process and on its disk: the
process's anonymous RSS and the working directory's size, sampled on a thread (:class:`Sampler`); the cap on
its private memory (:func:`memory_guard`) and how an out-of-memory failure is told (:func:`out_of_memory`); and
the free disk it needs before it starts (:func:`check_disk`)."""

from __future__ import annotations

import contextlib
import gc
import shutil
import threading
from collections.abc import Iterator, Sequence

from spate.errors import SpateError
from spate_tools.bench.disk_floor import dir_bytes
from spate_tools.bench.scale_workload import GB

DISK_FACTOR = 7.0  # free disk needed, × the largest state size (one variant's files at a time; 6.9× measured at 10 GB)
MEMORY_RESERVE = 2 * 1024**3  # bytes of the machine's available memory the memory guard leaves to others
DISK_RESERVE = 8 * 1024**3  # free bytes a measured phase leaves on its disk (it stops the variant first)
RSS_SAMPLE_S = 0.05
DISK_SAMPLE_S = 1.0


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


class OutOfDisk(SpateError):
    """A variant stopped because its disk had less than :data:`DISK_RESERVE` free; ``samples``: the batches it
    measured before."""

    samples: list = []


def guard_disk(workdir: str, local_dir: str) -> None:
    """Stop the variant (:class:`OutOfDisk`) before it fills the disk of ``workdir``; the message says how large
    the local lmdb table (``local_dir``) and the rest had grown."""
    free = shutil.disk_usage(workdir).free
    if free < DISK_RESERVE:
        local = dir_bytes(local_dir)
        raise OutOfDisk(f"out of disk: less than {DISK_RESERVE / 2**30:g} GiB left free on {workdir}'s disk; the "
                        f"local lmdb table had grown to {local / GB:.1f} GB, the checkpoint root and the rest to "
                        f"{(dir_bytes(workdir) - local) / GB:.1f} GB")


def check_disk(workdir: str, sizes_gb: Sequence[float]) -> None:
    """Refuse to start without :data:`DISK_FACTOR` × the largest state size free on ``workdir``'s disk."""
    need = DISK_FACTOR * max(sizes_gb) * GB
    free = shutil.disk_usage(workdir).free
    if free < need:
        raise SpateError(f"spate bench scale needs about {need / GB:.1f} GB free on the disk of {workdir} "
                         f"({DISK_FACTOR:g} × the largest state, {max(sizes_gb):g} GB: one variant's checkpoint "
                         f"root, lmdb table and copy at a time); it has {free / GB:.1f} GB free. Free space, pass "
                         "--out on a bigger disk, or run with --quick")
