"""Checks on the keys of an in-process query, so rows are grouped exactly as their state is keyed.

A key column holds one type throughout a runner's life, as a Spark column does, with None (null) beside it. State
is keyed by a key's encoded bytes (type and value), while rows are grouped by Python equality, which merges
``1``, ``True``, ``1.0`` and ``Decimal(1)``; and ``1`` beside ``"1"`` is almost always a parsing slip that
would silently count two keys. So a value whose type differs from the type its column held before is refused,
naming the column, both types and the conversion. Unhashable keys (``bytearray``) and values that cannot be
hashed or encoded (strings with lone surrogates) get the same kind of error.
"""

from __future__ import annotations

import datetime as _datetime
import decimal as _decimal
from collections.abc import Sequence
from typing import Any

from spate.errors import InvalidKeyError, short_repr

# Types whose values compare equal across types (1 == True == 1.0 == Decimal(1)), bool before int.
_NUMERIC: tuple[type, ...] = (bool, int, float, _decimal.Decimal)
# A column's type is the first of these a value is an instance of (subclasses, such as numpy floats, count as
# the type they hash and encode as; datetime before date), else the value's own type.
_KINDS: tuple[type, ...] = (*_NUMERIC, str, bytes, _datetime.datetime, _datetime.date)
_UNHASHABLE_FIX: dict[type, str] = {bytearray: "convert it with bytes(value)",
                                    memoryview: "convert it with bytes(value)"}


def _kind(value: Any) -> type | None:
    """The type ``value`` counts as in its key column; None for a null, which any column may hold."""
    if value is None:
        return None
    return next((k for k in _KINDS if isinstance(value, k)), type(value))


class KeyCheck:
    """Checks keys for one runner; ``columns`` names the key columns (None: the key function's result)."""

    def __init__(self, columns: Sequence[str] | None) -> None:
        self.columns = tuple(columns) if columns is not None else None
        self._kinds: dict[int, type] = {}  # column position -> the type its values have
        self._accepted: set[type | tuple[type, ...]] = set()  # scalar key types, tuple keys' column types

    def learned(self) -> tuple[dict[int, type], set[type | tuple[type, ...]]]:
        """What the check has learned so far, for :meth:`forget_since` when the rows it checked are refused."""
        return dict(self._kinds), set(self._accepted)

    def forget_since(self, learned: tuple[dict[int, type], set[type | tuple[type, ...]]]) -> None:
        """Forget the column types learned after ``learned``: a refused batch fixes no column's type."""
        self._kinds, self._accepted = dict(learned[0]), set(learned[1])

    def check(self, key: Any) -> None:
        """Raise :class:`InvalidKeyError` if ``key`` cannot be grouped the way its state is keyed."""
        t = type(key)
        if t in self._accepted:  # the per-row path: a scalar key of a type already checked
            return
        values = key if t is tuple else (key,)
        types = tuple(map(type, values)) if t is tuple else t
        if types not in self._accepted:
            self._admit(key, values)
            self._accepted.add(types)

    def _admit(self, key: Any, values: tuple) -> None:
        """Check a key with column types not seen before; its columns' kinds are remembered if it passes."""
        kinds = {i: k for i, v in enumerate(values) if (k := _kind(v)) is not None}
        for i, v in enumerate(values):
            fix = _UNHASHABLE_FIX.get(type(v))
            if fix is not None:
                raise InvalidKeyError(f"{self.column(i, key)} holds a {type(v).__name__} "
                                      f"({short_repr(v)}), which cannot be a key: {fix}")
            kind = self._kinds.get(i, kinds.get(i))
            if kinds.get(i, kind) is not kind:
                assert kind is not None  # a kind differs from the column's: the column has one
                raise self._mixed(i, key, kind, v)
        self._kinds.update(kinds)

    def _mixed(self, position: int, key: Any, kind: type, value: Any) -> InvalidKeyError:
        other = _kind(value)
        assert other is not None
        why = ("Python groups equal values together (1 == True == 1.0 == Decimal(1)) but state is keyed by type "
               "and value" if kind in _NUMERIC and other in _NUMERIC else
               "values of the two types never group together (1 and '1' would count as two keys)")
        return InvalidKeyError(
            f"{self.column(position, key)} mixes key types {kind.__name__} and {other.__name__} (value "
            f"{short_repr(value)}): {why}; give the column one type, e.g. convert every value with "
            f"{kind.__name__}(...), as a Spark column holds one type")

    def invalid(self, key: Any, error: Exception) -> InvalidKeyError:
        """The error for a key whose hash or encoding failed with ``error``."""
        values = key if type(key) is tuple else (key,)
        for i, v in enumerate(values):
            if isinstance(v, str) and not _is_utf8(v):
                return InvalidKeyError(
                    f"{self.column(i, key)} holds {short_repr(v)}, a string with lone surrogates (not valid "
                    "Unicode): Spark strings and spate keys are UTF-8; clean the data, or key by bytes "
                    "(value.encode('utf-8', 'surrogatepass'))")
        return InvalidKeyError(f"key {short_repr(key)} of {self.column(None, key)} cannot be hashed as Spark "
                               f"does ({error}); use the Python types of the key's Spark types, or pass key_types")

    def column(self, position: int | None, key: Any) -> str:
        """'key column "user"', or the position in the key function's result (None: the whole key)."""
        if self.columns is None:
            return "the key" if position is None or type(key) is not tuple else f"the key's column {position}"
        if position is None and len(self.columns) == 1:
            position = 0
        if position is None or position >= len(self.columns):
            return f"key columns {list(self.columns)}"
        return f"key column {self.columns[position]!r}"


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
