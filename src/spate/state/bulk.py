"""Bulk access to value and list state: read or write the values (lists) of many keys with one call, for
processors that handle a whole batch at once (``BatchProcessor``). The entries are the same the per-key
:class:`~spate.state.keyed.ValueState` and :class:`~spate.state.keyed.ListState` read and write: the two views
of one state agree.

Keys are given as :mod:`spate.state.bulk_keys` describes: a sequence of keys, or a ``KeyedBatch``.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from spate.errors import StateAccessError, short_repr
from spate.serde import packb_many
from spate.state.bulk_keys import Keys, KeySet, key_parts, plain_values
from spate.state.keyed import KeyedStateBackend
from spate.state.keyed_states import IMMUTABLE_TYPES, KeyedState, ListState, ValueState, encode_error
from spate.state.layout import VOID_NAMESPACE_PART
from spate.state.stored import pack_expiry, unpack_expiry


class BulkState:
    """What bulk views of one keyed state share: the keys' key groups and primaries (default namespace).

    Args:
        backend: the subtask's keyed state backend.
        state: the per-key state of the same descriptor.
    """

    def __init__(self, backend: KeyedStateBackend, state: KeyedState) -> None:
        self._b = backend
        self._table = backend.table
        self._sid = state._sid
        self._ttl = state._ttl
        self._last: tuple[Any, Sequence[int], list[bytes]] | None = None  # the last keys and their primaries
        self._state = state

    @property
    def name(self) -> str:
        return self._state.name

    def _primaries(self, keys: Keys) -> tuple[Sequence[int], list[bytes]]:
        """(key groups, primaries) of ``keys`` in the default namespace; the last answer is kept, so a batch's
        ``get_many`` and ``put_many`` compute them once."""
        if self._last is not None and self._last[0] is keys:
            return self._last[1], self._last[2]
        kgs, parts = key_parts(self._b, keys)
        sid, ns = self._sid, VOID_NAMESPACE_PART
        primaries = [sid + part + ns for part in parts]
        self._last = (keys, kgs, primaries)
        return kgs, primaries


class BulkValueState(BulkState):
    """Value state of many keys at once: ``get_many(keys)``, ``put_many(keys, values)``, ``clear_many(keys)``."""

    _state: ValueState

    def __init__(self, backend: KeyedStateBackend, state: ValueState) -> None:
        super().__init__(backend, state)
        self._default = state.descriptor.default  # type: ignore[attr-defined]
        self._copy_default = not isinstance(self._default, IMMUTABLE_TYPES)

    def get_many(self, keys: Keys) -> list[Any]:
        """The value of each key (the descriptor's default where there is none), in the order of ``keys``."""
        kgs, primaries = self._primaries(keys)
        raws = self._table.get_many(kgs, primaries)
        loads, default, now, ttl = self._state._unpack, self._default, self._b.now_ms, self._ttl
        out = []
        for raw in raws:
            if raw is not None and ttl:
                raw = raw[8:] if unpack_expiry(raw)[0] > now else None
            if raw is None:
                out.append(copy.deepcopy(default) if self._copy_default else default)
            else:
                out.append(loads(raw))
        return out

    def put_many(self, keys: Keys, values: Sequence[Any]) -> None:
        """Set the value of each key; a ``None`` value clears that key's."""
        kgs, primaries = self._primaries(keys)
        touched = bool(primaries)
        values = plain_values(values)
        if len(values) != len(primaries):
            raise StateAccessError(f"put_many on state {self.name!r}: {len(values)} values for {len(primaries)} "
                                   "keys: pass one value per key, in the keys' order")
        expiry = pack_expiry(self._b.now_ms + self._ttl) if self._ttl else b""
        cleared = [i for i, v in enumerate(values) if v is None]
        for i in cleared:
            self._table.delete(kgs[i], primaries[i])
        if cleared:
            keep = [i for i, v in enumerate(values) if v is not None]
            kgs, primaries, values = [kgs[i] for i in keep], [primaries[i] for i in keep], [values[i] for i in keep]
        data = self._encode(values)
        if expiry:
            data = [expiry + d for d in data]
        self._table.put_many(list(zip(kgs, primaries, data, strict=True)))
        self._b.dirty |= touched  # an empty call changes nothing

    def _encode(self, values: Sequence[Any]) -> list[bytes]:
        """The values serialized (msgpack in bulk), or an error naming the first value that is not."""
        try:
            if self._state._ser.name == "msgpack":
                return packb_many(values)
            return [self._state._pack(v) for v in values]
        except Exception:  # noqa: BLE001 - find the value and say what is wrong with it
            for value in values:
                try:
                    self._state._pack(value)
                except Exception as e:  # noqa: BLE001
                    raise encode_error(self._state, value, e) from e
            raise

    def clear_many(self, keys: Keys) -> None:
        """Remove the value of each key."""
        self.put_many(keys, [None] * len(self._primaries(keys)[1]))


class BulkListState(BulkState):
    """List state of many keys at once: ``get_many(keys)``, ``add_many(keys, lists)``,
    ``update_many(keys, lists)``, ``clear_many(keys)``."""

    _state: ListState

    def get_many(self, keys: Keys) -> list[list[Any]]:
        """The elements of each key's list (empty where there are none), in the order of ``keys``."""
        kgs, primaries = self._primaries(keys)
        decode = self._state._decode
        return [decode(raw) if raw else [] for raw in self._table.get_many(kgs, primaries)]

    def add_many(self, keys: Keys, lists: Sequence[Any]) -> None:
        """Append each of ``lists`` to its key's list (an empty one adds nothing)."""
        kgs, primaries = self._primaries(keys)
        encoded = self._encode(lists, "add_many", len(primaries))
        append = self._table.append
        for kg, primary, data in zip(kgs, primaries, encoded, strict=True):
            if data:
                append(kg, primary, data)
        self._b.dirty |= bool(primaries)  # an empty call changes nothing

    def update_many(self, keys: Keys, lists: Sequence[Any]) -> None:
        """Replace each key's list with its one of ``lists`` (an empty one clears it)."""
        kgs, primaries = self._primaries(keys)
        encoded = self._encode(lists, "update_many", len(primaries))
        if len(set(primaries)) < len(primaries):  # a key given twice: in order, the last one wins
            for kg, primary, data in zip(kgs, primaries, encoded, strict=True):
                if data:
                    self._table.put(kg, primary, data)
                else:
                    self._table.delete(kg, primary)
        else:
            for kg, primary, data in zip(kgs, primaries, encoded, strict=True):
                if not data:
                    self._table.delete(kg, primary)
            self._table.put_many([(kg, p, d) for kg, p, d in zip(kgs, primaries, encoded, strict=True) if d])
        self._b.dirty |= bool(primaries)  # an empty call changes nothing

    def clear_many(self, keys: Keys) -> None:
        """Remove each key's list."""
        self.update_many(keys, [()] * len(self._primaries(keys)[1]))

    def _encode(self, lists: Sequence[Any], op: str, n: int) -> list[bytes]:
        lists = plain_values(lists)
        if len(lists) != n:
            raise StateAccessError(f"{op} on state {self.name!r}: {len(lists)} lists for {n} keys")
        element, state = self._state._element, self._state
        out = []
        for values in lists:
            if isinstance(values, (str, bytes, dict)) or not hasattr(values, "__iter__"):
                raise StateAccessError(f"{op} on state {self.name!r}: each key's elements must be a list, got "
                                       f"{short_repr(values)}")
            try:
                out.append(b"".join(element(v) for v in plain_values(values)))
            except Exception as e:  # noqa: BLE001
                raise encode_error(state, values, e) from e
        return out


__all__ = ["BulkListState", "BulkState", "BulkValueState", "KeySet"]
