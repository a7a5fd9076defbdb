"""The input side of the in-process runner: each input row's key (a column, several columns, or a function of the
row), checked so rows are grouped exactly as their state is keyed (:class:`~spate.runtime.keys.KeyCheck`),
hashed to its key group as Spark hashes it, and routed to the subtask that owns the key group at the query's
parallelism."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from spate.errors import SettingError, SpateError, short_repr
from spate.keygroups import compile_key_hasher
from spate.runtime.keys import KeyCheck
from spate.runtime.processor import Row

KeySpec = str | Sequence[str] | Callable[[Row], Any]
Routed = list[list[tuple[int, Any, Row]]]  # per subtask: (key group, key, row) of each of its rows


def key_extractor(key: KeySpec) -> Callable[[Row], Any]:
    """A column name → that column; several names → a tuple; a callable is used as is.

    Raises:
        SettingError: an empty sequence of columns.
    """
    if callable(key):
        return key
    if isinstance(key, str):
        return lambda row: row[key]
    cols = tuple(key)
    if not cols:
        raise SettingError("key needs at least one column: pass key='column', key=['a', 'b'] or a function of the "
                           "row")
    if len(cols) == 1:
        return lambda row: row[cols[0]]
    return lambda row: tuple(row[c] for c in cols)


def key_columns(key: KeySpec) -> tuple[str, ...] | None:
    """The names of the key columns, or None when the key is a function of the row."""
    if callable(key):
        return None
    return (key,) if isinstance(key, str) else tuple(key)


class RowRouter:
    """Routes a query's input rows to its subtasks, keyed by ``key`` (its values of the Spark types ``key_types``
    where they are not Python's default mapping).

    Raises:
        SettingError: an empty sequence of key columns, or ``key_types`` spate does not key by.
    """

    def __init__(self, key: KeySpec, key_types: Any = None) -> None:
        self._key = key_extractor(key)
        self._keys = KeyCheck(key_columns(key))
        self._hash = compile_key_hasher(key_types)

    def route(self, rows: Sequence[Row], parallelism: int, max_parallelism: int) -> Routed:
        """(key group, key, row) of every row, per subtask of ``parallelism``; keys are checked (see
        :class:`KeyCheck`). A batch with a bad key fails whole, and the key types it taught are forgotten (the
        corrected batch may give a column another type).

        Raises:
            InvalidKeyError: a key spate cannot use (a type it does not key by, types mixed in a key column).
            SpateError: a row without the key column, or a key function that failed.
        """
        routed: Routed = [[] for _ in range(parallelism)]
        learned = self._keys.learned()
        try:
            for row in rows:
                kg, key = self._key_group_of(row, max_parallelism)
                routed[kg * parallelism // max_parallelism].append((kg, key, row))
        except SpateError:
            self._keys.forget_since(learned)
            raise
        return routed

    def _key_group_of(self, row: Row, max_parallelism: int) -> tuple[int, Any]:
        try:
            key = self._key(row)
        except Exception as e:  # a row without the column, or the user's key function failing
            raise self._no_key(row, e) from e
        self._keys.check(key)
        try:
            return self._hash(key) % max_parallelism, key
        except (TypeError, ValueError) as e:
            raise self._keys.invalid(key, e) from e

    def _no_key(self, row: Row, error: Exception) -> SpateError:
        columns = self._keys.columns
        if columns is None:
            return SpateError(f"the key function failed on input row {short_repr(row)}: {error!r}")
        have = sorted(row) if isinstance(row, Mapping) else f"a {type(row).__name__}, not a dict of columns"
        return SpateError(f"input row {short_repr(row)} has no key column {', '.join(map(repr, columns))}: each input "
                          f"row must be a dict holding the key= columns; its columns: {have}")
