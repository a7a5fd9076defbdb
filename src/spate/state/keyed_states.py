"""The keyed state objects a processor works with, one class per kind: value, list, map, reducing and
aggregating state. Each is scoped to the current key of its :class:`~spate.state.key_scope.KeyScope` and to a
namespace of its own (windows use it), and stores its values as :mod:`spate.state.stored` describes.
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import Any

from spate.errors import IncompatibleStateError, SerializationError, StateAccessError
from spate.serde import Serializer, decode_key, encode_key
from spate.state import descriptors as d
from spate.state.key_scope import KeyScope
from spate.state.layout import U16, VOID_NAMESPACE_PART, length_prefixed
from spate.state.stored import StateMeta, decode_list, pack_expiry, pack_length, unpack_expiry

IMMUTABLE_TYPES = (type(None), bool, int, float, str, bytes, tuple)  # a default of these is not copied


class KeyedState:
    """Base of the state objects: scoping to the current key and namespace, TTL framing, encoding."""

    def __init__(self, backend: KeyScope, meta: StateMeta, descriptor: d.StateDescriptor,
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
            raise no_key_error(self)
        return self._sid + self._b._key_part + self._ns_part

    def _primary_for(self, namespace: Any) -> bytes:
        if self._b._kg < 0:
            raise no_key_error(self)
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
            raise encode_error(self, value, e) from e
        if self._ttl:
            return pack_expiry(self._b.now_ms + self._ttl) + data
        return data

    def _loads(self, raw: bytes | None) -> tuple[bool, Any]:
        if raw is None:
            return False, None
        if self._ttl:
            if unpack_expiry(raw)[0] <= self._b.now_ms:
                return False, None
            raw = raw[8:]
        return True, self._ser.loads(raw)


def no_key_error(state: KeyedState) -> StateAccessError:
    return StateAccessError(f"keyed state {state.name!r} used outside a key: keyed state is only available in "
                            "process() and on_timer(); use operator state in open() and end_batch()")


def encode_error(state: KeyedState, value: Any, e: Exception) -> SerializationError:
    hint = "make the value serializable"
    if state._ser.name == "msgpack":
        hint = ("store plain data (None, bool, int, float, str, bytes, list, dict, tuple, date, datetime, Decimal) "
                "or opt in to pickle with serializer='pickle' on the descriptor and allow_pickle=True")
    return SerializationError(f"state {state.name!r}: cannot serialize value of type "
                              f"{type(value).__qualname__} with {state._ser.name} ({e}); {hint}")


class ValueState(KeyedState):
    """One value per key: ``value()``, ``update(v)``, ``clear()``."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        default = self.descriptor.default  # type: ignore[attr-defined]
        self._default = default
        self._copy_default = not isinstance(default, IMMUTABLE_TYPES)

    def value(self) -> Any:
        """The current key's value, or the descriptor's default."""
        b = self._b
        if b._kg < 0:
            raise no_key_error(self)
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
            raise no_key_error(self)
        try:
            data = self._pack(value)
        except Exception as e:  # noqa: BLE001
            raise encode_error(self, value, e) from e
        if self._ttl:
            data = pack_expiry(b.now_ms + self._ttl) + data
        self._table.put(b._kg, self._sid + b._key_part + self._ns_part, data)
        b.dirty = True


class ListState(KeyedState):
    """A list per key: ``get()``, ``add(v)``, ``add_all(vs)``, ``update(vs)``, ``clear()``."""

    def _element(self, value: Any) -> bytes:
        data = self._dumps(value)
        if self._ttl:
            return data[:8] + pack_length(len(data) - 8) + data[8:]
        return pack_length(len(data)) + data

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


class MapState(KeyedState):
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


class _AccumulatorState(KeyedState, ABC):
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


STATE_CLASSES: dict[str, type[KeyedState]] = {
    d.VALUE: ValueState, d.LIST: ListState, d.MAP: MapState,
    d.REDUCING: ReducingState, d.AGGREGATING: AggregatingState,
}
