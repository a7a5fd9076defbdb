"""Bulk access to map state: the maps of many keys, or one entry of each of many keys, with one call (for a
``BatchProcessor``). The entries are the ones the per-key :class:`~spate.state.keyed_states.MapState` reads and
writes: both views of one state agree.

Two shapes: whole maps (``get_many``, ``put_many``, ``update_many``, ``clear_many``: one mapping per key) and
single entries (``get_entries``, ``put_entries``, ``remove_entries``: key ``i`` with user key ``i``, e.g. a
batch's rows column by column, where a key appears as often as it has rows).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from spate.errors import StateAccessError, short_repr
from spate.serde import decode_key, encode_key, encode_keys
from spate.state.bulk import BulkState
from spate.state.bulk_keys import Keys, plain_values
from spate.state.keyed_states import MapState


class BulkMapState(BulkState):
    """Map state of many keys at once."""

    _state: MapState

    # -- whole maps ----------------------------------------------------------------------------------------
    def get_many(self, keys: Keys) -> list[dict[Any, Any]]:
        """Each key's map (empty where there is none), in the order of ``keys``."""
        kgs, primaries = self._primaries(keys)
        items, loads = self._table.map_items, self._state._loads
        out = []
        for kg, primary in zip(kgs, primaries, strict=True):
            entries = {}
            for uk, raw in items(kg, primary):
                found, value = loads(raw)
                if found:
                    entries[decode_key(uk)] = value
            out.append(entries)
        return out

    def put_many(self, keys: Keys, mappings: Sequence[Mapping[Any, Any]]) -> None:
        """Put every entry of each of ``mappings`` into its key's map (``put_all`` per key)."""
        kgs, primaries = self._primaries(keys)
        mappings = self._mappings(mappings, "put_many", len(primaries))
        put, dumps = self._table.map_put, self._state._dumps
        for kg, primary, mapping in zip(kgs, primaries, mappings, strict=True):
            for user_key, value in mapping.items():
                put(kg, primary, encode_key(user_key), dumps(value))
        self._b.dirty |= bool(primaries)  # an empty call changes nothing

    def update_many(self, keys: Keys, mappings: Sequence[Mapping[Any, Any]]) -> None:
        """Replace each key's map with its one of ``mappings`` (an empty one clears it); a key given twice ends
        with its last mapping."""
        kgs, primaries = self._primaries(keys)
        mappings = self._mappings(mappings, "update_many", len(primaries))
        encoded = [[(encode_key(k), self._state._dumps(v)) for k, v in m.items()] for m in mappings]
        put, delete = self._table.map_put, self._table.delete
        for kg, primary, entries in zip(kgs, primaries, encoded, strict=True):
            delete(kg, primary)
            for user_key, data in entries:
                put(kg, primary, user_key, data)
        self._b.dirty |= bool(primaries)  # an empty call changes nothing

    def clear_many(self, keys: Keys) -> None:
        """Remove each key's map."""
        kgs, primaries = self._primaries(keys)
        delete = self._table.delete
        for kg, primary in zip(kgs, primaries, strict=True):
            delete(kg, primary)
        self._b.dirty |= bool(primaries)  # an empty call changes nothing

    # -- single entries ------------------------------------------------------------------------------------
    def get_entries(self, keys: Keys, user_keys: Sequence[Any], default: Any = None) -> list[Any]:
        """The value at user key ``user_keys[i]`` in the map of ``keys[i]`` (``default`` where there is none)."""
        kgs, primaries = self._primaries(keys)
        user_keys = self._user_keys(user_keys, "get_entries", len(primaries))
        get, loads = self._table.map_get, self._state._loads
        out = []
        for kg, primary, uk in zip(kgs, primaries, user_keys, strict=True):
            found, value = loads(get(kg, primary, uk))
            out.append(value if found else default)
        return out

    def put_entries(self, keys: Keys, user_keys: Sequence[Any], values: Sequence[Any]) -> None:
        """Set the value at user key ``user_keys[i]`` in the map of ``keys[i]`` to ``values[i]`` (in order: a
        pair given twice ends with its last value)."""
        kgs, primaries = self._primaries(keys)
        user_keys = self._user_keys(user_keys, "put_entries", len(primaries))
        values = plain_values(values)
        if len(values) != len(primaries):
            raise StateAccessError(f"put_entries on state {self.name!r}: {len(values)} values for {len(primaries)} "
                                   "keys: pass one value per key, in the keys' order")
        put, dumps = self._table.map_put, self._state._dumps
        for kg, primary, uk, value in zip(kgs, primaries, user_keys, values, strict=True):
            put(kg, primary, uk, dumps(value))
        self._b.dirty |= bool(primaries)  # an empty call changes nothing

    def remove_entries(self, keys: Keys, user_keys: Sequence[Any]) -> None:
        """Remove user key ``user_keys[i]`` from the map of ``keys[i]`` (no error where there is none)."""
        kgs, primaries = self._primaries(keys)
        user_keys = self._user_keys(user_keys, "remove_entries", len(primaries))
        delete = self._table.map_delete
        for kg, primary, uk in zip(kgs, primaries, user_keys, strict=True):
            delete(kg, primary, uk)
        self._b.dirty |= bool(primaries)  # an empty call changes nothing

    # -- arguments -----------------------------------------------------------------------------------------
    def _user_keys(self, user_keys: Sequence[Any], op: str, n: int) -> list[bytes]:
        plain = plain_values(user_keys)
        if len(plain) != n:
            raise StateAccessError(f"{op} on state {self.name!r}: {len(plain)} user keys for {n} keys")
        return encode_keys(plain)

    def _mappings(self, mappings: Sequence[Mapping[Any, Any]], op: str, n: int) -> Sequence[Mapping[Any, Any]]:
        mappings = plain_values(mappings)
        if len(mappings) != n:
            raise StateAccessError(f"{op} on state {self.name!r}: {len(mappings)} mappings for {n} keys: pass one "
                                   "dict per key, in the keys' order")
        for m in mappings:
            if not isinstance(m, Mapping):
                raise StateAccessError(f"{op} on state {self.name!r}: each key's entries must be a mapping (a dict), "
                                       f"got {short_repr(m)}: pass a dict per key")
        return mappings


__all__ = ["BulkMapState"]
