"""Operator (non-keyed) state, FLIP-8: list state redistributed on rescale by splitting (``SPLIT``) or by
giving every subtask the union (``UNION``), and broadcast map state (``BROADCAST``), identical everywhere.

Elements are kept as Python objects while the subtask runs and serialized one by one at snapshot time, so the
coordinator can hand out element ranges without decoding them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from spate.errors import IncompatibleStateError
from spate.serde import (
    Serializer,
    check_pickle_allowed,
    decode_key,
    encode,
    encode_key,
    resolve_serializer,
    serializer_by_name,
)

SPLIT, UNION, BROADCAST = "split", "union", "broadcast"
MODES = (SPLIT, UNION, BROADCAST)


class ListOperatorState:
    """A list of elements of one subtask: ``get()``, ``add(v)``, ``add_all(vs)``, ``update(vs)``, ``clear()``."""

    def __init__(self, name: str, mode: str, serializer: Serializer, elements: list[Any]) -> None:
        self.name, self.mode, self.serializer = name, mode, serializer
        self._elements = elements

    def get(self) -> list[Any]:
        return list(self._elements)

    def add(self, value: Any) -> None:
        self._elements.append(value)

    def add_all(self, values: Iterable[Any]) -> None:
        self._elements.extend(values)

    def update(self, values: Iterable[Any]) -> None:
        self._elements = list(values)

    def clear(self) -> None:
        self._elements = []

    def encoded(self) -> list[bytes]:
        return [encode(self.serializer, v, f"operator state {self.name!r}") for v in self._elements]


class BroadcastState:
    """A map that every subtask holds a copy of (the processor keeps the copies equal)."""

    mode = BROADCAST

    def __init__(self, name: str, serializer: Serializer, entries: dict[Any, Any]) -> None:
        self.name, self.serializer = name, serializer
        self._map = entries

    def get(self, key: Any, default: Any = None) -> Any:
        return self._map.get(key, default)

    def put(self, key: Any, value: Any) -> None:
        self._map[key] = value

    def remove(self, key: Any) -> None:
        self._map.pop(key, None)

    def contains(self, key: Any) -> bool:
        return key in self._map

    def items(self) -> list[tuple[Any, Any]]:
        return list(self._map.items())

    def clear(self) -> None:
        self._map.clear()

    def encoded(self) -> list[bytes]:
        what = f"broadcast state {self.name!r}"
        return [x for k, v in self._map.items() for x in (encode_key(k), encode(self.serializer, v, what))]


class RestoredOperatorState:
    """Encoded elements a subtask received for one state name on restore (decoded on first access)."""

    def __init__(self, mode: str, serializer: str, encoded: list[bytes]) -> None:
        self.mode, self.serializer, self.encoded = mode, serializer, encoded


class OperatorStateBackend:
    """The operator state of one subtask."""

    def __init__(self, restored: dict[str, RestoredOperatorState] | None = None, allow_pickle: bool = False) -> None:
        self._restored = dict(restored or {})
        self._states: dict[str, ListOperatorState | BroadcastState] = {}
        self.allow_pickle = allow_pickle

    def get_list_state(self, name: str, serializer: str | Serializer | None = None) -> ListOperatorState:
        """Split-redistributed list state: on rescale the elements are dealt out, each exactly once."""
        return self._list(name, SPLIT, serializer)

    def get_union_list_state(self, name: str, serializer: str | Serializer | None = None) -> ListOperatorState:
        """Union list state: on restore every subtask receives the elements of all subtasks."""
        return self._list(name, UNION, serializer)

    def get_broadcast_state(self, name: str, serializer: str | Serializer | None = None) -> BroadcastState:
        """Broadcast map state: each subtask restores one copy."""
        state = self._states.get(name)
        if state is None:
            ser = self._serializer(f"broadcast state {name!r}", serializer)
            entries: dict[Any, Any] = {}
            restored = self._take(name, BROADCAST)
            if restored is not None:
                vs = serializer_by_name(restored.serializer, self.allow_pickle, f"broadcast state {name!r}")
                it = iter(restored.encoded)
                entries = {decode_key(k): vs.loads(v) for k, v in zip(it, it, strict=True)}
            state = self._states[name] = BroadcastState(name, ser, entries)
        self._check_mode(state, name, BROADCAST)
        return state  # type: ignore[return-value]

    def _list(self, name: str, mode: str, serializer: str | Serializer | None) -> ListOperatorState:
        state = self._states.get(name)
        if state is None:
            ser = self._serializer(f"operator state {name!r}", serializer)
            elements: list[Any] = []
            restored = self._take(name, mode)
            if restored is not None:
                rs = serializer_by_name(restored.serializer, self.allow_pickle, f"operator state {name!r}")
                elements = [rs.loads(e) for e in restored.encoded]
            state = self._states[name] = ListOperatorState(name, mode, ser, elements)
        self._check_mode(state, name, mode)
        return state  # type: ignore[return-value]

    def _serializer(self, what: str, spec: str | Serializer | None) -> Serializer:
        """The declared serializer; pickle only if this reader opted in (it will read what it writes)."""
        ser = resolve_serializer(spec)
        check_pickle_allowed(ser.name, self.allow_pickle, what)
        return ser

    def _take(self, name: str, mode: str) -> RestoredOperatorState | None:
        restored = self._restored.pop(name, None)
        if restored is not None and restored.mode != mode:
            self._restored[name] = restored
            raise IncompatibleStateError(f"operator state {name!r} was checkpointed as {restored.mode} state "
                                         f"but is requested as {mode} state; use the same kind or a new name")
        return restored

    @staticmethod
    def _check_mode(state: Any, name: str, mode: str) -> None:
        if state.mode != mode:
            raise IncompatibleStateError(f"operator state {name!r} is {state.mode} state, not {mode} state")

    def snapshot_states(self) -> list[tuple[str, str, str, list[bytes]]]:
        """(name, mode, serializer, encoded elements) of every state, including restored ones nobody
        asked for yet (so state survives a processor version that skips it for a while)."""
        out = [(n, s.mode, s.serializer.name, s.encoded()) for n, s in self._states.items()]
        out += [(n, r.mode, r.serializer, r.encoded) for n, r in self._restored.items()]
        return sorted(out)
