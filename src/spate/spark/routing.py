"""Exactly one Spark task per subtask: the partition key that sends subtask i to shuffle partition i.

``repartition(P, col)`` puts a row in partition ``pmod(hash(col), P)`` (Spark's Murmur3, as ``hash()``), and
Spark keeps an explicit partition count even with adaptive query execution on (it coalesces only the
partitions it chose itself). So each subtask gets an int routing value whose hash lands on its own index:
P subtasks run as exactly P tasks, task i running subtask i, whatever ``spark.sql.shuffle.partitions`` says.
"""

from __future__ import annotations

import functools

from spate.keygroups import compile_key_hasher


@functools.lru_cache(maxsize=64)
def routing_values(parallelism: int) -> tuple[int, ...]:
    """``values[i]``: the smallest non-negative int whose Spark hash, mod ``parallelism``, is ``i``."""
    if parallelism < 1:
        raise ValueError(f"parallelism must be >= 1, got {parallelism}")
    hash_int = compile_key_hasher(["int"])
    values: dict[int, int] = {}
    candidate = 0
    while len(values) < parallelism:
        values.setdefault(hash_int(candidate) % parallelism, candidate)
        candidate += 1
    return tuple(values[i] for i in range(parallelism))
