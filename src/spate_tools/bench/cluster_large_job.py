"""The job ``spate bench cluster --large`` (:mod:`spate_tools.bench.cluster_large`) runs: its shape (parallelism 2,
one subtask per executor), its batches (:class:`Sizes`: load, steady, recovery, verification), the processor that
writes each key's 500-byte value (:class:`Overwrite`), the input files (:func:`generate`) and the check of what the
verification batch reads back (:func:`compare`)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from spate.runtime.batch import BatchProcessor, KeyedBatch
from spate.runtime.processor import Context
from spate.state.descriptors import ValueStateDescriptor

GB = 1_000_000_000
VALUE_BYTES = 500
PARALLELISM = 2  # one subtask per executor: the killed executor's share is one subtask
MAX_PARALLELISM = 128
LOAD_ROWS = 1_000_000  # rows per load batch (at least 2 load batches)
STEADY = 3  # steady batches before the kill
UPDATES_SHARE, UPDATES_MAX = 0.01, 100_000  # keys per steady batch: 1 % of the keys, at most this many
VERIFY_MAX = 1_000_000  # keys the verification batch reads back
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
