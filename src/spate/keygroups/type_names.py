"""Key schemas: ``key_types`` (DDL type names, pyspark DataTypes or a StructType) as canonical Spark type names,
and the hash update of each."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from spate.errors import SettingError
from spate.keygroups.updates import UPDATES, Update, make_decimal_update

_ALIASES = {
    "integer": "int",
    "long": "bigint",
    "short": "smallint",
    "byte": "tinyint",
    "real": "float",
    "timestamp_ltz": "timestamp",
}

_DECIMAL_RE = re.compile(r"^(?:decimal|dec|numeric)\s*(?:\(\s*(\d+)\s*(?:,\s*(\d+)\s*)?\))?$")

_SUPPORTED_TYPES_TEXT = (
    "int/integer, bigint/long, smallint/short, tinyint/byte, boolean, float, double, string, binary, "
    "date, timestamp, timestamp_ntz, decimal(p,s)"
)


def _canonical_type(t: Any) -> str:
    """Canonical Spark type name for a DDL string or a pyspark DataType (duck-typed)."""
    if isinstance(t, str):
        name = t
    elif hasattr(t, "simpleString") and callable(t.simpleString):
        name = t.simpleString()
    else:
        raise SettingError(f"key type must be a Spark DDL type name or a pyspark DataType, got {type(t).__name__}: "
                           f"{t!r}; pass e.g. key_types=['string', 'bigint']")
    name = " ".join(name.strip().lower().split())
    name = _ALIASES.get(name, name)
    if name in UPDATES:
        return name
    m = _DECIMAL_RE.match(name)
    if m:
        precision = int(m.group(1)) if m.group(1) else 10
        scale = int(m.group(2)) if m.group(2) else 0
        if not 1 <= precision <= 38 or not 0 <= scale <= precision:
            raise SettingError(f"invalid decimal type {t!r}: need 1 <= precision <= 38 and 0 <= scale <= precision")
        return f"decimal({precision},{scale})"
    raise SettingError(f"unsupported Spark key type {t!r}; supported types: {_SUPPORTED_TYPES_TEXT}")


def normalize_key_types(key_types: Any) -> tuple[str, ...]:
    """Normalise ``key_types`` to a tuple of canonical Spark type names (one per key column).

    Accepts a sequence of DDL type names / pyspark DataTypes, a pyspark ``StructType`` (its fields'
    types), or a single type name / DataType for a one-column key.

    Raises:
        SettingError: not a sequence of types, no type, or a type spate does not key by (the message lists the
            supported ones).
    """
    if isinstance(key_types, str):
        items: Iterable[Any] = [key_types]
    elif hasattr(key_types, "fields") and hasattr(key_types, "simpleString"):  # StructType
        items = [f.dataType for f in key_types.fields]
    elif hasattr(key_types, "simpleString"):  # a single (non-struct) DataType
        items = [key_types]
    else:
        try:
            items = list(key_types)
        except TypeError:
            raise SettingError(
                f"key_types must be a sequence of Spark types or a StructType, got {type(key_types).__name__}: "
                "pass e.g. key_types=['string'] (one type per key column)"
            ) from None
    result = tuple(_canonical_type(t) for t in items)
    if not result:
        raise SettingError("key_types must name at least one key column: pass one Spark type per key column")
    return result


def update_for(type_name: str) -> Update:
    """The hash update of a canonical type name (see :func:`normalize_key_types`)."""
    upd = UPDATES.get(type_name)
    if upd is None:  # decimal(p,s)
        m = _DECIMAL_RE.match(type_name)
        assert m is not None
        upd = make_decimal_update(int(m.group(1)), int(m.group(2)))
        UPDATES[type_name] = upd
    return upd
