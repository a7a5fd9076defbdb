"""What ``spate bench scale`` (:mod:`spate_tools.bench.scale`) feeds its subtask: the sizes of a run
(:class:`Setup`), the 500-byte values and the processor that writes them, and the keys grouped as a Spark task
hands them to a subtask, with their key groups computed by Spark's hash, vectorized (:func:`key_groups`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from spate.keygroups import compile_key_hasher
from spate.runtime.batch import BatchProcessor, KeyedBatch
from spate.runtime.processor import Context
from spate.state.descriptors import ValueStateDescriptor

VALUE: ValueStateDescriptor[bytes] = ValueStateDescriptor("value")
VALUE_BYTES = 500
GB = 1_000_000_000
MAX_PARALLELISM = 128
VARIANTS = ("changelog", "full")
_PAD = np.random.default_rng(37).bytes(VALUE_BYTES - 8)  # incompressible, like real values


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
    # changelog: before the measured phase, this many batches with no materialization (what one running beside
    # the batches costs them); 0: none
    quiet_batches: int = 0


FULL = Setup(sizes_gb=(1, 10), batches=40, full_batches=12, quiet_batches=40)
QUICK = Setup(sizes_gb=(0.2, 1), batches=20, quiet_batches=20)


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
