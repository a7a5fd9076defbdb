"""Spark-compatible key -> key group mapping and Flink's key-group range formulas.

A *key group* is the unit of keyed state that is moved around when an operator is rescaled. A key is
assigned to a key group with exactly the same arithmetic Spark SQL uses for ``pmod(hash(cols...), n)``,
so a DataFrame can be pre-partitioned by key group inside Spark (``F.pmod(F.hash(*cols), F.lit(n))``)
and the in-process runner computes the identical value per row in pure Python.

Key groups ``[0, max_parallelism)`` are then split into contiguous ranges, one per parallel subtask,
with Flink's ``KeyGroupRangeAssignment`` formulas.

The modules, from the bottom up:

* :mod:`~spate.keygroups.murmur3`: Spark's Murmur3_x86_32 primitives (seed 42)
* :mod:`~spate.keygroups.updates`: how each Spark type mixes a column value into the hash
* :mod:`~spate.keygroups.type_names`: key schemas (``key_types``) as canonical Spark type names
* :mod:`~spate.keygroups.inference`: hashing without ``key_types`` (PySpark's type inference)
* :mod:`~spate.keygroups.memo`: memoised hashes of the hot single-column keys
* :mod:`~spate.keygroups.hashers`: :func:`compile_key_hasher` and :func:`spark_hash`
* :mod:`~spate.keygroups.normalize`: keys as Spark groups them (``-0.0``, NaN)
* :mod:`~spate.keygroups.ranges`: Flink's key-group ranges and the (max) parallelism checks
* :mod:`~spate.keygroups.vectorized`: key groups of a numpy array
* :mod:`~spate.keygroups.groups`: :func:`key_group` and :func:`key_groups`

Everything is pure Python on masked ints; per-type hash functions are precompiled per key schema with
:func:`compile_key_hasher`, which is what per-row callers should use.
"""

from __future__ import annotations

from spate.keygroups.groups import key_group, key_groups
from spate.keygroups.hashers import compile_key_hasher, spark_hash
from spate.keygroups.memo import KeyHasher
from spate.keygroups.murmur3 import SEED
from spate.keygroups.normalize import CANONICAL_NAN, normalize_key
from spate.keygroups.ranges import (
    MAX_MAX_PARALLELISM,
    check_parallelism,
    default_max_parallelism,
    key_group_range,
    subtask_for_key_group,
)
from spate.keygroups.type_names import normalize_key_types

__all__ = [
    "CANONICAL_NAN",
    "MAX_MAX_PARALLELISM",
    "SEED",
    "KeyHasher",
    "check_parallelism",
    "compile_key_hasher",
    "default_max_parallelism",
    "key_group",
    "key_group_range",
    "key_groups",
    "normalize_key",
    "normalize_key_types",
    "spark_hash",
    "subtask_for_key_group",
]
