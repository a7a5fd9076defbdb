"""Flink's ``KeyGroupRangeAssignment``: key groups ``[0, max_parallelism)`` split into contiguous ranges, one per
parallel subtask, and the checks on (max) parallelism."""

from __future__ import annotations

from spate.errors import IncompatibleStateError, InvalidParallelismError

#: Upper bound for ``max_parallelism`` (Flink's ``UPPER_BOUND_MAX_PARALLELISM``, 2**15).
MAX_MAX_PARALLELISM = 32768


def check_max_parallelism(max_parallelism: int) -> None:
    """Refuse a ``max_parallelism`` that is not an int in ``1..MAX_MAX_PARALLELISM``.

    Raises:
        InvalidParallelismError: not an int (a ``TypeError``) or out of range (a ``ValueError``).
    """
    if not isinstance(max_parallelism, int) or isinstance(max_parallelism, bool):
        raise InvalidParallelismError(f"max_parallelism must be an int, got {type(max_parallelism).__name__}: "
                                      f"pass the number of key groups as an int in 1..{MAX_MAX_PARALLELISM}")
    if not 0 < max_parallelism <= MAX_MAX_PARALLELISM:
        raise InvalidParallelismError(f"max_parallelism must be in 1..{MAX_MAX_PARALLELISM}, got {max_parallelism}: "
                                      "pass a number of key groups in that range")


def _check_parallelisms(max_parallelism: int, parallelism: int) -> None:
    for name, v in (("max_parallelism", max_parallelism), ("parallelism", parallelism)):
        if not isinstance(v, int) or isinstance(v, bool):
            raise InvalidParallelismError(f"{name} must be an int, got {type(v).__name__}: pass an int")
    check_max_parallelism(max_parallelism)
    if not 0 < parallelism <= max_parallelism:
        raise InvalidParallelismError(f"parallelism must be in 1..max_parallelism ({max_parallelism}), got "
                                      f"{parallelism}: use at most {max_parallelism} subtasks")


def check_parallelism(parallelism: int, max_parallelism: int) -> None:
    """Refuse a parallelism a query with ``max_parallelism`` key groups cannot run at, saying what to use.

    Raises:
        InvalidParallelismError: ``parallelism`` is not an int >= 1 (a ``ValueError``).
        IncompatibleStateError: it exceeds ``max_parallelism``.
    """
    if not isinstance(parallelism, int) or isinstance(parallelism, bool) or parallelism < 1:
        raise InvalidParallelismError(f"parallelism must be an int >= 1, got {parallelism!r}: pass the number of "
                                      "subtasks as a positive int")
    if parallelism > max_parallelism:
        raise IncompatibleStateError(
            f"parallelism {parallelism} exceeds the max parallelism {max_parallelism} of the query's state (its "
            f"number of key groups, fixed when the checkpoint root was created): use at most {max_parallelism} "
            "subtasks")


def key_group_range(max_parallelism: int, parallelism: int, index: int) -> range:
    """Key groups owned by subtask ``index`` of ``parallelism`` (Flink's formula), as a Python range.

    ``start = ceil(index * max_parallelism / parallelism)``,
    ``end (inclusive) = floor(((index + 1) * max_parallelism - 1) / parallelism)``; the ranges of all
    subtasks partition ``[0, max_parallelism)`` into contiguous, non-empty pieces.

    Raises:
        InvalidParallelismError: an argument is not an int (a ``TypeError``) or is out of its range (a
            ``ValueError``): ``max_parallelism`` in ``1..32768``, ``parallelism`` in ``1..max_parallelism``,
            ``index`` in ``0..parallelism - 1``.
    """
    _check_parallelisms(max_parallelism, parallelism)
    if not isinstance(index, int) or isinstance(index, bool):
        raise InvalidParallelismError(f"index must be an int, got {type(index).__name__}: pass a subtask's index")
    if not 0 <= index < parallelism:
        raise InvalidParallelismError(f"subtask index must be in 0..{parallelism - 1}, got {index}: a query at "
                                      f"parallelism {parallelism} has subtasks 0..{parallelism - 1}")
    start = (index * max_parallelism + parallelism - 1) // parallelism
    end = ((index + 1) * max_parallelism - 1) // parallelism
    return range(start, end + 1)


def subtask_for_key_group(max_parallelism: int, parallelism: int, key_group: int) -> int:
    """Index of the subtask (of ``parallelism``) owning ``key_group``: ``key_group * parallelism // max_p``.

    Raises:
        InvalidParallelismError: an argument is not an int (a ``TypeError``) or is out of its range (a
            ``ValueError``): ``key_group`` in ``0..max_parallelism - 1``, as for :func:`key_group_range`.
    """
    _check_parallelisms(max_parallelism, parallelism)
    if not isinstance(key_group, int) or isinstance(key_group, bool):
        raise InvalidParallelismError(f"key_group must be an int, got {type(key_group).__name__}: pass a key "
                                      "group (spate.key_group(key, max_parallelism) gives a key's)")
    if not 0 <= key_group < max_parallelism:
        raise InvalidParallelismError(f"key_group must be in 0..{max_parallelism - 1}, got {key_group}: a query "
                                      f"with max_parallelism {max_parallelism} has key groups 0..{max_parallelism - 1}")
    return key_group * parallelism // max_parallelism


def default_max_parallelism(parallelism: int) -> int:
    """Flink's default max parallelism: ``min(max(next_pow2(P + P // 2), 128), 32768)``.

    Raises:
        InvalidParallelismError: ``parallelism`` is not an int (a ``TypeError``) or not in ``1..32768`` (a
            ``ValueError``).
    """
    if not isinstance(parallelism, int) or isinstance(parallelism, bool):
        raise InvalidParallelismError(f"parallelism must be an int, got {type(parallelism).__name__}: pass the "
                                      "number of subtasks as an int")
    if not 0 < parallelism <= MAX_MAX_PARALLELISM:
        raise InvalidParallelismError(f"parallelism must be in 1..{MAX_MAX_PARALLELISM}, got {parallelism}: pass a "
                                      "number of subtasks in that range")
    x = parallelism + parallelism // 2
    pow2 = 1 << (x - 1).bit_length()
    return min(max(pow2, 128), MAX_MAX_PARALLELISM)
