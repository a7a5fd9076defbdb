"""The key group of a key: Spark's ``pmod(hash(cols...), max_parallelism)``, for one key or many."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from spate.keygroups.hashers import compile_key_hasher
from spate.keygroups.inference import hash_inferred
from spate.keygroups.memo import cached_long_hash, cached_str_hash, long_miss, str_miss
from spate.keygroups.ranges import MAX_MAX_PARALLELISM, check_max_parallelism
from spate.keygroups.vectorized import numpy_key_groups


def key_group(key: Any, max_parallelism: int, key_types: Any = None) -> int:
    """Key group of ``key``: Spark's ``pmod(hash(cols...), max_parallelism)``, in ``[0, max_parallelism)``.

    For per-row use with a fixed schema prefer ``compile_key_hasher(key_types)(key) % max_parallelism``.

    Raises:
        InvalidParallelismError: ``max_parallelism`` is not an int in ``1..32768``.
        InvalidKeyError: a key value whose type spate cannot hash, out of its Spark type's range, or with
            another number of columns than ``key_types`` (a ``TypeError`` and a ``ValueError``).
        SettingError: ``key_types`` spate cannot key by.
    """
    if type(max_parallelism) is not int or not 0 < max_parallelism <= MAX_MAX_PARALLELISM:
        check_max_parallelism(max_parallelism)
    if key_types is None:  # hashers.hash_dynamic, inlined: one call less per key
        t = type(key)
        if t is int:
            h = cached_long_hash(key)
            return (long_miss(key) if h is None else h) % max_parallelism
        if t is str:
            h = cached_str_hash(key)
            return (str_miss(key) if h is None else h) % max_parallelism
        h = hash_inferred(key)
        return (h - 0x100000000 if h & 0x80000000 else h) % max_parallelism
    return compile_key_hasher(key_types)(key) % max_parallelism


def key_groups(keys: Sequence[Any] | Any, max_parallelism: int, key_types: Any = None) -> list[int]:
    """Key groups of many keys (see :func:`key_group`).

    A 1-D numpy array of integers (single ``bigint`` column, or ``int``/``smallint``/``tinyint``/``date``
    when given as ``key_types``) or of float64 (``double``) is hashed vectorised.
    """
    check_max_parallelism(max_parallelism)
    vectorised = numpy_key_groups(keys, max_parallelism, key_types)
    if vectorised is not None:
        return vectorised
    if hasattr(keys, "dtype") and hasattr(keys, "tolist"):  # other numpy arrays: hash Python scalars
        keys = keys.tolist()
    hasher = compile_key_hasher(key_types)
    return [hasher(k) % max_parallelism for k in keys]
