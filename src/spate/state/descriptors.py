"""State descriptors: what a processor asks for in ``open(ctx)``.

A descriptor names a state, its kind, its serializer and an optional time-to-live. TTL is in processing
time, measured from the last write (every update resets it); an expired value is invisible to reads and is
dropped from the next snapshot.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from spate.errors import StateDescriptorError
from spate.serde import Serializer

T = TypeVar("T")

VALUE, LIST, MAP, REDUCING, AGGREGATING = "value", "list", "map", "reducing", "aggregating"
KINDS = (VALUE, LIST, MAP, REDUCING, AGGREGATING)


class AggregateFunction(Protocol):
    """Incremental aggregation: ``create_accumulator``, ``add``, ``get_result`` and ``merge``."""

    def create_accumulator(self) -> Any: ...

    def add(self, value: Any, accumulator: Any) -> Any: ...

    def get_result(self, accumulator: Any) -> Any: ...

    def merge(self, a: Any, b: Any) -> Any: ...


@dataclass(frozen=True)
class StateDescriptor:
    """Common part of every keyed-state descriptor.

    Raises:
        StateDescriptorError: (a ``ValueError``) ``name`` is not a non-empty string, or ``ttl_ms`` is not a
            positive int. Using a name again with another kind, serializer or TTL, or restoring a state as
            another kind, raises :class:`~spate.errors.IncompatibleStateError` when the state is obtained.
    """

    name: str
    ttl_ms: int | None = field(default=None, kw_only=True)
    serializer: str | Serializer | None = field(default=None, kw_only=True)

    kind = ""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise StateDescriptorError(f"state name must be a non-empty string, got {self.name!r}: name the state, "
                                       "e.g. ValueStateDescriptor('count')")
        if self.ttl_ms is not None and (not isinstance(self.ttl_ms, int) or self.ttl_ms <= 0):
            raise StateDescriptorError(f"state {self.name!r}: ttl_ms must be a positive int (milliseconds), got "
                                       f"{self.ttl_ms!r}: pass e.g. ttl_ms=60_000, or None for no TTL")


@dataclass(frozen=True)
class ValueStateDescriptor(StateDescriptor, Generic[T]):
    """One value per key (and namespace). ``default`` is returned when there is none."""

    default: Any = None
    kind = VALUE


@dataclass(frozen=True)
class ListStateDescriptor(StateDescriptor, Generic[T]):
    """A list per key; ``add`` appends without reading the list. With TTL each element expires on its own."""

    kind = LIST


@dataclass(frozen=True)
class MapStateDescriptor(StateDescriptor):
    """A map per key; map keys must be plain hashable data (encoded canonically, never pickled)."""

    kind = MAP


@dataclass(frozen=True)
class ReducingStateDescriptor(StateDescriptor, Generic[T]):
    """Keeps ``reduce_fn(acc, value)`` of everything added.

    Raises:
        StateDescriptorError: (a ``ValueError``) ``reduce_fn`` is not callable, or as :class:`StateDescriptor`.
    """

    reduce_fn: Callable[[Any, Any], Any] | None = None
    kind = REDUCING

    def __post_init__(self) -> None:
        super().__post_init__()
        if not callable(self.reduce_fn):
            raise StateDescriptorError(f"reducing state {self.name!r} needs reduce_fn=callable(acc, value)")


@dataclass(frozen=True)
class AggregatingStateDescriptor(StateDescriptor):
    """Keeps an accumulator of an :class:`AggregateFunction`; ``get()`` returns its result.

    Raises:
        StateDescriptorError: (a ``ValueError``) ``aggregate_fn`` lacks ``create_accumulator``, ``add`` or
            ``get_result``, or as :class:`StateDescriptor`.
    """

    aggregate_fn: Any = None
    kind = AGGREGATING

    def __post_init__(self) -> None:
        super().__post_init__()
        fn = self.aggregate_fn
        if fn is None or not all(hasattr(fn, m) for m in ("create_accumulator", "add", "get_result")):
            raise StateDescriptorError(f"aggregating state {self.name!r} needs aggregate_fn with "
                                       "create_accumulator(), add(value, acc) and get_result(acc)")
