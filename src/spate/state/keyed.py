"""Keyed state: the backend of one subtask, which scopes every state to the current key (and namespace) and keeps
the registry of its states (their ids, kinds, TTLs and serializers, stored in the table).

The current key lives in :mod:`spate.state.key_scope`, the state objects in :mod:`spate.state.keyed_states`, the
stored format in :mod:`spate.state.stored` and the timers in :mod:`spate.state.timers`; their names are also
importable from here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import msgpack

from spate.errors import IncompatibleStateError
from spate.serde import Serializer, check_pickle_allowed, decode_key, encode_key, resolve_serializer, serializer_by_name
from spate.state import descriptors as d
from spate.state.key_scope import KeyScope
from spate.state.keyed_states import (
    STATE_CLASSES,
    AggregatingState,
    KeyedState,
    ListState,
    MapState,
    ReducingState,
    ValueState,
)
from spate.state.layout import VOID_NAMESPACE_PART, split_primary
from spate.state.stored import StateMeta, decode_list, decode_stored, live_list, unpack_expiry
from spate.state.table import StateTable
from spate.state.timers import RESERVED_SIDS, TimerService

__all__ = [
    "VOID_NAMESPACE_PART",
    "AggregatingState",
    "KeyedStateBackend",
    "ListState",
    "MapState",
    "ReducingState",
    "StateMeta",
    "ValueState",
    "decode_list",
    "decode_stored",
]


class KeyedStateBackend(KeyScope):
    """Keyed state of one subtask: the key groups it owns, the current key and the states in its table."""

    def __init__(self, table: StateTable, max_parallelism: int, key_groups: range, *,
                 allow_pickle: bool = False, key_types: Any = None) -> None:
        super().__init__(table, max_parallelism, key_groups, key_types)
        self.allow_pickle = allow_pickle
        raw = table.get_meta("states")
        self._metas: dict[str, StateMeta] = {}
        for m in msgpack.unpackb(raw) if raw else []:
            meta = StateMeta.from_dict(m)
            self._metas[meta.name] = meta
        self._states: dict[str, KeyedState] = {}
        self.timers = TimerService(self)

    # -- states ---------------------------------------------------------------------------------------
    def get_state(self, descriptor: d.StateDescriptor) -> Any:
        """The state object for ``descriptor`` (the same object on every call)."""
        state = self._states.get(descriptor.name)
        if state is not None:
            if state.descriptor != descriptor:
                raise IncompatibleStateError(f"state {descriptor.name!r} was already obtained with another "
                                             "descriptor; use one descriptor per state name")
            return state
        serializer = resolve_serializer(descriptor.serializer)
        meta = self._register(descriptor, serializer)
        check_pickle_allowed(serializer.name, self.allow_pickle, f"state {descriptor.name!r}")
        state = STATE_CLASSES[descriptor.kind](self, meta, descriptor, serializer)
        self._states[descriptor.name] = state
        return state

    def _register(self, descriptor: d.StateDescriptor, serializer: Serializer) -> StateMeta:
        meta = self._metas.get(descriptor.name)
        if meta is not None:
            if meta.kind != descriptor.kind:
                raise IncompatibleStateError(
                    f"state {descriptor.name!r} is stored as {meta.kind} state but the processor asks for "
                    f"{descriptor.kind} state; use a new state name or the same kind")
            if meta.serializer != serializer.name:
                raise IncompatibleStateError(
                    f"state {descriptor.name!r} was written with serializer {meta.serializer!r} but the "
                    f"processor asks for {serializer.name!r}; keep the serializer or use a new state name")
            if bool(meta.ttl_ms) != bool(descriptor.ttl_ms):
                raise IncompatibleStateError(
                    f"state {descriptor.name!r} was written {'with' if meta.ttl_ms else 'without'} a TTL; turning "
                    "TTL on or off for existing state is not supported (stored values differ); use a new state "
                    "name")
            if meta.ttl_ms != descriptor.ttl_ms:
                meta = StateMeta(meta.name, meta.sid, meta.kind, descriptor.ttl_ms, meta.serializer)
                self._metas[meta.name] = meta
                self._save_registry()
            return meta
        meta = StateMeta(descriptor.name, self._next_sid(), descriptor.kind, descriptor.ttl_ms, serializer.name)
        self._metas[meta.name] = meta
        self._save_registry()
        return meta

    def adopt(self, meta: StateMeta) -> int:
        """Register a state found in a snapshot; return its id in this table (snapshots may number differently)."""
        mine = self._metas.get(meta.name)
        if mine is None:
            mine = StateMeta(meta.name, self._next_sid(), meta.kind, meta.ttl_ms, meta.serializer)
            self._metas[meta.name] = mine
            self._save_registry()
        elif mine.kind != meta.kind:
            raise IncompatibleStateError(f"state {meta.name!r} is {meta.kind} state in one snapshot and "
                                         f"{mine.kind} state in another; the checkpoint is inconsistent")
        return mine.sid

    def _next_sid(self) -> int:
        sid = max((m.sid for m in self._metas.values()), default=-1) + 1
        if sid >= min(RESERVED_SIDS):
            raise IncompatibleStateError(f"too many keyed states in one processor (limit {min(RESERVED_SIDS)})")
        return sid

    def _save_registry(self) -> None:
        self.table.put_meta("states", msgpack.packb([m.to_dict() for m in self._metas.values()]))

    @property
    def state_metas(self) -> list[StateMeta]:
        return sorted(self._metas.values(), key=lambda m: m.sid)

    def has_ttl_state(self) -> bool:
        return any(m.ttl_ms for m in self._metas.values())

    def expiry_filter(self, sid: int) -> Callable[[bytes], bytes | None] | None:
        """For a TTL'd state: a function dropping what expired from a stored value (None = all expired)."""
        meta = next((m for m in self._metas.values() if m.sid == sid), None)
        if meta is None or not meta.ttl_ms:
            return None
        now = self.now_ms
        if meta.kind == d.LIST:
            return lambda raw: live_list(raw, now)
        return lambda raw: raw if unpack_expiry(raw)[0] > now else None

    def keys(self, descriptor: d.StateDescriptor, namespace: Any = None) -> Iterator[Any]:
        """Every key that has a value in the given state (and namespace) in this subtask."""
        state = self.get_state(descriptor)
        ns_bytes = encode_key(namespace) if namespace is not None else b""
        live = self.expiry_filter(self._metas[descriptor.name].sid)
        seen: set[bytes] = set()
        for kg in self.key_groups:
            for primary, _uk, value in self.table.state_entries(kg, state._sid):
                _sid, key_bytes, ns = split_primary(primary)
                if live is not None and live(value) is None:
                    continue
                if ns == ns_bytes and key_bytes not in seen:
                    seen.add(key_bytes)
                    yield decode_key(key_bytes)

    def serializer_of(self, meta: StateMeta) -> Serializer:
        return serializer_by_name(meta.serializer, self.allow_pickle, f"state {meta.name!r}")
