"""Keyed state: the backend that scopes every state to the current key (and namespace), and the state
objects (value, list, map, reducing, aggregating) a processor works with.

Values are stored serialized. With a TTL, each stored value (each list element, each map entry) starts with
its expiry time (u64 ms, processing time); expired data is invisible and is dropped when snapshotted.
"""

from __future__ import annotations

import copy
import struct
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

import msgpack

from spate.errors import IncompatibleStateError, InvalidKeyError, SerializationError, short_repr
from spate.keygroups import compile_key_hasher, normalize_key
from spate.serde import (
    Serializer,
    check_pickle_allowed,
    decode_key,
    encode_key,
    resolve_serializer,
    serializer_by_name,
)
from spate.state import descriptors as d
from spate.state.layout import U16, length_prefixed, split_primary
from spate.state.table import StateTable
from spate.state.timers import RESERVED_SIDS, TimerService

_EXP = struct.Struct(">Q")
_LEN = struct.Struct(">I")
_U16_PACK = U16.pack
VOID_NAMESPACE_PART = length_prefixed(b"")
_IMMUTABLE = (type(None), bool, int, float, str, bytes, tuple)


@dataclass(frozen=True)
class StateMeta:
    """What a snapshot records about one keyed state (its id is local to the table that wrote it)."""

    name: str
    sid: int
    kind: str
    ttl_ms: int | None
    serializer: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_dict(data: dict[str, Any]) -> StateMeta:
        return StateMeta(data["name"], data["sid"], data["kind"], data.get("ttl_ms"), data["serializer"])


class KeyedStateBackend:
    """Keyed state of one subtask: the key groups it owns, the current key and the states in its table."""

    def __init__(self, table: StateTable, max_parallelism: int, key_groups: range, *,
                 allow_pickle: bool = False, key_types: Any = None) -> None:
        self.table = table
        self.max_parallelism = max_parallelism
        self.key_groups = key_groups
        self.allow_pickle = allow_pickle
        self.now_ms = 0
        self.dirty = False
        self.current_key: Any = None
        self._kg = -1
        self._key_part = b""
        self._hash = compile_key_hasher(key_types)
        raw = table.get_meta("states")
        self._metas: dict[str, StateMeta] = {}
        for m in msgpack.unpackb(raw) if raw else []:
            meta = StateMeta.from_dict(m)
            self._metas[meta.name] = meta
        self._states: dict[str, _State] = {}
        self.timers = TimerService(self)

    # -- current key ----------------------------------------------------------------------------------
    def set_current_key(self, key: Any, key_group: int | None = None) -> None:
        """Scope every state to ``key``. ``key_group`` may be passed when already computed (e.g. by Spark).
        Float columns are normalized as Spark groups them (``-0.0`` → ``0.0``, one NaN)."""
        key = normalize_key(key)
        kg = self._hash(key) % self.max_parallelism if key_group is None else key_group
        if kg not in self.key_groups:
            raise ValueError(f"key {short_repr(key)} is in key group {kg}, which this subtask does not own "
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
        state = _STATE_CLASSES[descriptor.kind](self, meta, descriptor, serializer)
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
            return lambda raw: _live_list(raw, now)
        return lambda raw: raw if _EXP.unpack_from(raw)[0] > now else None

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


def _live_list(raw: bytes, now: int) -> bytes | None:
    """The unexpired elements of a TTL'd list value: ``raw`` itself if none expired, None if all did."""
    out = []
    pos, n, dropped = 0, len(raw), False
    while pos < n:
        exp = _EXP.unpack_from(raw, pos)[0]
        ln = _LEN.unpack_from(raw, pos + 8)[0]
        end = pos + 12 + ln
        if exp > now:
            out.append(raw[pos:end])
        else:
            dropped = True
        pos = end
    if not dropped:
        return raw
    return b"".join(out) if out else None


def decode_list(raw: bytes, ttl: bool, now_ms: int, loads: Callable[[bytes], Any]) -> list[Any]:
    """Elements of a stored list value that have not expired at ``now_ms``."""
    out = []
    pos, n = 0, len(raw)
    while pos < n:
        if ttl:
            exp = _EXP.unpack_from(raw, pos)[0]
            pos += 8
        ln = _LEN.unpack_from(raw, pos)[0]
        pos += 4
        if not ttl or exp > now_ms:
            out.append(loads(raw[pos:pos + ln]))
        pos += ln
    return out


def decode_stored(meta: StateMeta, raw: bytes, loads: Callable[[bytes], Any], now_ms: int) -> tuple[bool, Any]:
    """Decode one stored entry of state ``meta`` outside a running backend: (live, value)."""
    if meta.kind == d.LIST:
        items = decode_list(raw, bool(meta.ttl_ms), now_ms, loads)
        return bool(items), items
    if meta.ttl_ms:
        if _EXP.unpack_from(raw)[0] <= now_ms:
            return False, None
        raw = raw[8:]
    return True, loads(raw)


# ------------------------------------------------------------------------------------------------------
class _State:
    """Base of the state objects: scoping to the current key and namespace, TTL framing, encoding."""

    def __init__(self, backend: KeyedStateBackend, meta: StateMeta, descriptor: d.StateDescriptor,
                 serializer: Serializer) -> None:
        self._b = backend
        self._table = backend.table
        self.descriptor = descriptor
        self._sid = U16.pack(meta.sid)
        self._ttl = descriptor.ttl_ms or 0
        self._ser = serializer
        self._pack = serializer.dumps
        self._unpack = serializer.loads
        self._ns_part = VOID_NAMESPACE_PART
        self.namespace: Any = None

    @property
    def name(self) -> str:
        return self.descriptor.name

    def set_namespace(self, namespace: Any) -> None:
        """Scope further calls to ``namespace`` (windows use it); ``None`` is the default namespace."""
        self.namespace = namespace
        self._ns_part = VOID_NAMESPACE_PART if namespace is None else length_prefixed(encode_key(namespace))

    def _primary(self) -> bytes:
        if self._b._kg < 0:
            raise _no_key(self)
        return self._sid + self._b._key_part + self._ns_part

    def _primary_for(self, namespace: Any) -> bytes:
        if self._b._kg < 0:
            raise _no_key(self)
        ns = VOID_NAMESPACE_PART if namespace is None else length_prefixed(encode_key(namespace))
        return self._sid + self._b._key_part + ns

    def clear(self) -> None:
        """Remove the state of the current key (and namespace)."""
        b = self._b
        self._table.delete(b._kg, self._primary())
        b.dirty = True

    def _dumps(self, value: Any) -> bytes:
        try:
            data = self._ser.dumps(value)
        except Exception as e:  # noqa: BLE001
            raise _encode_error(self, value, e) from e
        if self._ttl:
            return _EXP.pack(self._b.now_ms + self._ttl) + data
        return data

    def _loads(self, raw: bytes | None) -> tuple[bool, Any]:
        if raw is None:
            return False, None
        if self._ttl:
            if _EXP.unpack_from(raw)[0] <= self._b.now_ms:
                return False, None
            raw = raw[8:]
        return True, self._ser.loads(raw)


def _no_key(state: _State) -> RuntimeError:
    return RuntimeError(f"keyed state {state.name!r} used outside a key: keyed state is only available in "
                        "process() and on_timer(); use operator state in open() and end_batch()")


def _encode_error(state: _State, value: Any, e: Exception) -> SerializationError:
    hint = "make the value serializable"
    if state._ser.name == "msgpack":
        hint = ("store plain data (None, bool, int, float, str, bytes, list, dict, tuple, date, datetime, Decimal) "
                "or opt in to pickle with serializer='pickle' on the descriptor and allow_pickle=True")
    return SerializationError(f"state {state.name!r}: cannot serialize value of type "
                              f"{type(value).__qualname__} with {state._ser.name} ({e}); {hint}")


class ValueState(_State):
    """One value per key: ``value()``, ``update(v)``, ``clear()``."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        default = self.descriptor.default  # type: ignore[attr-defined]
        self._default = default
        self._copy_default = not isinstance(default, _IMMUTABLE)

    def value(self) -> Any:
        """The current key's value, or the descriptor's default."""
        b = self._b
        if b._kg < 0:
            raise _no_key(self)
        raw = self._table.get(b._kg, self._sid + b._key_part + self._ns_part)
        if raw is not None and not self._ttl:
            return self._unpack(raw)
        found, v = self._loads(raw)
        if found:
            return v
        return copy.deepcopy(self._default) if self._copy_default else self._default

    def exists(self) -> bool:
        b = self._b
        return self._loads(self._table.get(b._kg, self._primary()))[0]

    def update(self, value: Any) -> None:
        """Set the value; ``None`` clears it."""
        if value is None:
            self.clear()
            return
        b = self._b
        if b._kg < 0:
            raise _no_key(self)
        try:
            data = self._pack(value)
        except Exception as e:  # noqa: BLE001
            raise _encode_error(self, value, e) from e
        if self._ttl:
            data = _EXP.pack(b.now_ms + self._ttl) + data
        self._table.put(b._kg, self._sid + b._key_part + self._ns_part, data)
        b.dirty = True


class ListState(_State):
    """A list per key: ``get()``, ``add(v)``, ``add_all(vs)``, ``update(vs)``, ``clear()``."""

    def _element(self, value: Any) -> bytes:
        data = self._dumps(value)
        if self._ttl:
            return data[:8] + _LEN.pack(len(data) - 8) + data[8:]
        return _LEN.pack(len(data)) + data

    def _decode(self, raw: bytes) -> list[Any]:
        return decode_list(raw, bool(self._ttl), self._b.now_ms, self._ser.loads)

    def get(self) -> list[Any]:
        """The current key's elements (empty list if none)."""
        b = self._b
        raw = self._table.get(b._kg, self._primary())
        return self._decode(raw) if raw else []

    def exists(self) -> bool:
        """Whether the current key (and namespace) has elements."""
        return bool(self.get())

    def add(self, value: Any) -> None:
        self.add_all((value,))

    def add_all(self, values: Iterable[Any]) -> None:
        data = b"".join(self._element(v) for v in values)
        if not data:
            return
        b = self._b
        self._table.append(b._kg, self._primary(), data)
        b.dirty = True

    def update(self, values: Iterable[Any]) -> None:
        """Replace the list (an empty list clears it)."""
        data = b"".join(self._element(v) for v in values)
        if not data:
            self.clear()
            return
        b = self._b
        self._table.put(b._kg, self._primary(), data)
        b.dirty = True

    def merge_namespaces(self, target: Any, sources: Iterable[Any]) -> None:
        """Append the lists of ``sources`` to ``target``'s and clear the sources."""
        b = self._b
        parts = []
        for ns in sources:
            p = self._primary_for(ns)
            raw = self._table.get(b._kg, p)
            if raw:
                parts.append(raw)
                self._table.delete(b._kg, p)
        if parts:
            tp = self._primary_for(target)
            self._table.put(b._kg, tp, (self._table.get(b._kg, tp) or b"") + b"".join(parts))
            b.dirty = True


class MapState(_State):
    """A map per key. Map keys are plain hashable data."""

    def get(self, user_key: Any, default: Any = None) -> Any:
        b = self._b
        found, v = self._loads(self._table.map_get(b._kg, self._primary(), encode_key(user_key)))
        return v if found else default

    def contains(self, user_key: Any) -> bool:
        b = self._b
        return self._loads(self._table.map_get(b._kg, self._primary(), encode_key(user_key)))[0]

    def put(self, user_key: Any, value: Any) -> None:
        b = self._b
        self._table.map_put(b._kg, self._primary(), encode_key(user_key), self._dumps(value))
        b.dirty = True

    def put_all(self, mapping: dict[Any, Any]) -> None:
        for k, v in mapping.items():
            self.put(k, v)

    def remove(self, user_key: Any) -> None:
        b = self._b
        self._table.map_delete(b._kg, self._primary(), encode_key(user_key))
        b.dirty = True

    def items(self) -> list[tuple[Any, Any]]:
        b = self._b
        out = []
        for uk, raw in self._table.map_items(b._kg, self._primary()):
            found, v = self._loads(raw)
            if found:
                out.append((decode_key(uk), v))
        return out

    def keys(self) -> list[Any]:
        return [k for k, _ in self.items()]

    def values(self) -> list[Any]:
        return [v for _, v in self.items()]

    def is_empty(self) -> bool:
        return not self.items()


class _AccumulatorState(_State, ABC):
    """Shared by reducing and aggregating state: one accumulator per key, logged as a whole."""

    def _acc(self, primary: bytes) -> tuple[bool, Any]:
        return self._loads(self._table.get(self._b._kg, primary))

    def exists(self) -> bool:
        """Whether the current key (and namespace) has an accumulator (something was added)."""
        return self._acc(self._primary())[0]

    def _store(self, primary: bytes, acc: Any) -> None:
        self._table.put(self._b._kg, primary, self._dumps(acc))
        self._b.dirty = True

    @abstractmethod
    def _combine(self, acc: Any, value: Any) -> Any: ...

    @abstractmethod
    def _merge(self, a: Any, b: Any) -> Any: ...

    def add(self, value: Any) -> None:
        primary = self._primary()
        found, acc = self._acc(primary)
        self._store(primary, self._combine(acc if found else self._initial(), value))

    def _initial(self) -> Any:
        return _NO_ACC

    def merge_namespaces(self, target: Any, sources: Iterable[Any]) -> None:
        """Merge the accumulators of ``sources`` into ``target``'s and clear the sources."""
        b = self._b
        merged, have = None, False
        for ns in [*sources, target]:
            p = self._primary_for(ns)
            found, acc = self._acc(p)
            if found:
                merged, have = (self._merge(merged, acc) if have else acc), True
                self._table.delete(b._kg, p)
        if have:
            self._store(self._primary_for(target), merged)


_NO_ACC = object()


class ReducingState(_AccumulatorState):
    """``add(v)`` folds ``v`` into the value with ``reduce_fn``; ``get()`` returns it (None if empty)."""

    def get(self) -> Any:
        return self._acc(self._primary())[1]

    def _combine(self, acc: Any, value: Any) -> Any:
        return value if acc is _NO_ACC else self.descriptor.reduce_fn(acc, value)  # type: ignore[attr-defined]

    def _merge(self, a: Any, b: Any) -> Any:
        return self.descriptor.reduce_fn(a, b)  # type: ignore[attr-defined]


class AggregatingState(_AccumulatorState):
    """``add(v)`` feeds the aggregate function; ``get()`` returns its result (None if nothing was added)."""

    def get(self) -> Any:
        found, acc = self._acc(self._primary())
        return self.descriptor.aggregate_fn.get_result(acc) if found else None  # type: ignore[attr-defined]

    def _initial(self) -> Any:
        return self.descriptor.aggregate_fn.create_accumulator()  # type: ignore[attr-defined]

    def _combine(self, acc: Any, value: Any) -> Any:
        return self.descriptor.aggregate_fn.add(value, acc)  # type: ignore[attr-defined]

    def _merge(self, a: Any, b: Any) -> Any:
        fn = self.descriptor.aggregate_fn  # type: ignore[attr-defined]
        if not hasattr(fn, "merge"):
            raise IncompatibleStateError(f"state {self.name!r}: merging namespaces needs aggregate_fn.merge")
        return fn.merge(a, b)


_STATE_CLASSES: dict[str, type[_State]] = {
    d.VALUE: ValueState, d.LIST: ListState, d.MAP: MapState,
    d.REDUCING: ReducingState, d.AGGREGATING: AggregatingState,
}
