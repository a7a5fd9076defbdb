"""The current key of a subtask's keyed state: what the state objects and the timers read on every access.

:class:`KeyScope` holds the table, the key groups the subtask owns, the current key (its key group and its
encoded part of every primary), the processing-time clock that TTLs use and whether anything was written. The
keyed state backend is a :class:`KeyScope` with a registry of states; the state objects and the timer service
depend only on this part.
"""

from __future__ import annotations

from typing import Any

from spate.errors import InvalidKeyError, short_repr
from spate.keygroups import compile_key_hasher, normalize_key
from spate.serde import decode_key, encode_key
from spate.state.layout import U16, length_prefixed
from spate.state.table import StateTable

_U16_PACK = U16.pack


class KeyScope:
    """The table, the owned key groups and the current key (with its key group and primary part)."""

    def __init__(self, table: StateTable, max_parallelism: int, key_groups: range, key_types: Any = None) -> None:
        self.table = table
        self.max_parallelism = max_parallelism
        self.key_groups = key_groups
        self.now_ms = 0
        self.dirty = False
        self.current_key: Any = None
        self._kg = -1
        self._key_part = b""
        self._hash = compile_key_hasher(key_types)

    def set_current_key(self, key: Any, key_group: int | None = None) -> None:
        """Scope every state to ``key``. ``key_group`` may be passed when already computed (e.g. by Spark).
        Float columns are normalized as Spark groups them (``-0.0`` → ``0.0``, one NaN)."""
        key = normalize_key(key)
        kg = self._hash(key) % self.max_parallelism if key_group is None else key_group
        if kg not in self.key_groups:
            raise InvalidKeyError(f"key {short_repr(key)} is in key group {kg}, which this subtask does not own "
                                  f"({self.key_groups.start}..{self.key_groups.stop - 1}); route keys with "
                                  "spate.keygroups.key_group")
        kb = encode_key(key)
        if len(kb) > 0xFFFF:
            raise InvalidKeyError(f"key {short_repr(key)} encodes to {len(kb)} bytes; the limit is 65535: key by "
                                  "a shorter value (e.g. a hash of it)")
        self.current_key = key
        self._kg = kg
        self._key_part = _U16_PACK(len(kb)) + kb

    def enter_key(self, key: Any, key_group: int, key_bytes: bytes) -> None:
        """:meth:`set_current_key` for a key already normalized, with its key group and canonical bytes
        (``encode_key``) computed in bulk: a batch's keys one after another."""
        if key_group not in self.key_groups or len(key_bytes) > 0xFFFF:
            self.set_current_key(key, key_group)  # raises the error that explains
        self.current_key = key
        self._kg = key_group
        self._key_part = _U16_PACK(len(key_bytes)) + key_bytes

    def clear_current_key(self) -> None:
        """Leave key scope: keyed state used now raises instead of touching the last key's state."""
        self.current_key = None
        self._kg = -1
        self._key_part = b""

    def set_current_key_encoded(self, key_group: int, key_bytes: bytes) -> None:
        self.current_key = decode_key(key_bytes)
        self._kg = key_group
        self._key_part = length_prefixed(key_bytes)

    @property
    def current_key_group(self) -> int:
        return self._kg
