"""Reading the pages of a large batch of keys from disk concurrently, before lmdb goes through the keys one by one.

Why. A table larger than the page cache serves a batch of random keys with a page read from disk per key, and
lmdb reads them one at a time (the file is memory-mapped: each is a page fault inside ``get`` or ``replace``).
The disk serves many reads at once far faster than one after another: 50,000 random updates to a 24 GB lmdb file
with a cold cache took 5.7–6.4 s one by one, and 2.1–2.5 s with the pages first read by 16 threads
(docs/benchmarks.md). py-lmdb lets go of the GIL inside each read, so threads wait on the disk together.

When. Only if a probe of a few of the batch's keys, spread over it, is slow (the pages are not in memory): a
batch whose pages are cached pays the probe alone (a few hundred reads, well under a millisecond). Warming is
best effort: a reader that fails stops, and the batch reads what is left itself.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import lmdb

MIN_KEYS = 4096  # smaller batches are not worth the threads
PROBE_KEYS = 256
COLD_PROBE_S = 20e-6 * PROBE_KEYS  # more than 20 µs a read on average: most of the probe came from disk
THREADS = 16  # reads in flight; the measured gain grew from 4 to 16


def warm(env: lmdb.Environment, keys: Sequence[bytes]) -> bool:
    """Bring the pages of ``keys`` into memory concurrently if a probe finds them on disk; whether it did."""
    if len(keys) < MIN_KEYS:
        return False
    probe = keys[::len(keys) // PROBE_KEYS][:PROBE_KEYS]
    started = time.perf_counter()
    if not _read(env, probe) or time.perf_counter() - started < COLD_PROBE_S:
        return False
    readers = [threading.Thread(target=_read, args=(env, keys[i::THREADS]), name="spate-prefetch", daemon=True)
               for i in range(THREADS)]
    for reader in readers:
        reader.start()
    for reader in readers:
        reader.join()
    return True


def _read(env: lmdb.Environment, keys: Sequence[bytes]) -> bool:
    """Read ``keys`` in a read transaction of their own (the values are dropped); False if lmdb refused."""
    try:
        with env.begin() as txn:
            get = txn.get
            for key in keys:
                get(key)
    except lmdb.Error:  # e.g. the map grown by another process since: the batch reads the pages itself
        return False
    return True
