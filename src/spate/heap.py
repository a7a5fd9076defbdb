"""The process heap around spate's bulk phases (a keyed snapshot written, keyed state restored): the cyclic GC
paused while they run, and the free memory of the process's heap handed back to the operating system before and
after. A materialization, which runs beside the batches, only hands the memory back when it ends
(:func:`return_free_heap`).

Why the GC pause: a bulk phase allocates millions of short-lived objects, none of which form cycles, and cyclic
GC passes over a large live heap would dominate its cost.

Why the hand-back: glibc's ``malloc`` keeps what a phase freed for the process to reuse, and returns little of it
to the operating system by itself. A process that took a snapshot, or restored, kept that memory however little it
used afterwards: after the ``bench scale`` workload's load and measured phase at 1 GB, 439 MB of anonymous RSS, of
which ``malloc_trim`` returned 334 MB (docs/benchmarks.md). On an executor that memory is the JVM's and the other
Python workers'. And a restore did not reuse what the batches before it had freed: at 10 GB, the restore after the
measured phase peaked at 1,282 MB in the same process, at 908 MB once the heap was trimmed before it.
``malloc_trim(0)`` returns the free pages of every arena, in milliseconds; where the C library has none (not glibc),
nothing is done.

Why a restore collects garbage cycles first: it often follows a query that ran and closed in the same process, and
what that query left in cycles waits for a full collection, which the pause would put off until the restore ended.
After the ``bench scale`` workload's measured phase at 1 GB, a full collection found 1,544 objects in cycles, and
with them trimmed the process held 104 MB instead of 182 (docs/benchmarks.md). A collection costs a pass over the
live containers, so only a restore from checkpoint storage of at least 64 MB takes it, not every small one.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
from collections.abc import Callable, Iterator


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None where the C library has none."""
    try:
        return ctypes.CDLL(None).malloc_trim  # type: ignore[no-any-return]
    except (OSError, AttributeError, TypeError):
        return None


MALLOC_TRIM = _malloc_trim()


def return_free_heap() -> None:
    """Hand the free pages of the C heap back to the operating system (glibc; elsewhere nothing)."""
    if MALLOC_TRIM is not None:
        MALLOC_TRIM(0)


@contextlib.contextmanager
def bulk_phase(collect: bool = False) -> Iterator[None]:
    """Run a snapshot or a restore: the free heap returned to the operating system before and after it, the
    cyclic GC paused while it runs (enabled again after, if it was). ``collect``: garbage cycles collected first
    (a restore: module doc)."""
    if collect:
        gc.collect()
    return_free_heap()  # what ran before (batches) freed: the phase's threads would not reuse it (module doc)
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
        return_free_heap()
