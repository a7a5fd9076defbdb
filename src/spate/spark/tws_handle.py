"""The ``StatefulProcessorHandle`` a ``pyspark`` ``StatefulProcessor`` gets on spate: its value, list and map
states are spate keyed states holding values in the form :mod:`spate.spark.state_schema` defines, its timers
spate timers. Every call is a local read or write, where Spark's is a round trip to the JVM.

As on Spark, a handle lives for one batch of one subtask (Spark: one task): ``init`` runs with a new handle
every batch, and ``deleteIfExists`` removes a state until the next batch's ``init`` asks for it again.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

from pyspark.errors import PySparkRuntimeError, PySparkValueError

from spate.errors import SparkErrorClass, SpateError
from spate.runtime.processor import Context
from spate.spark.state_schema import (
    SCHEMAS_STATE,
    KeyCodec,
    StateCodec,
    StateDeclaration,
    StateSchemaRecord,
    check_nullable,
    evolve,
    parse_schema,
)
from spate.spark.state_values import refused
from spate.state.descriptors import ListStateDescriptor, MapStateDescriptor, StateDescriptor, ValueStateDescriptor

_DESCRIPTORS = {"value": ValueStateDescriptor, "list": ListStateDescriptor, "map": MapStateDescriptor}


class MissingStateError(SpateError, PySparkRuntimeError):
    """A state was used after ``deleteIfExists`` removed it: Spark's error (a ``PySparkRuntimeError``, its
    message), so code that catches it on Spark catches it here."""

    def __init__(self, message: str) -> None:
        PySparkRuntimeError.__init__(self, message=message)


# each timer call: how Spark's Python client prefixes a refusal, and the operation Spark's error names
_TIMER_CALLS = {"registerTimer": ("Error register timer", "register_timer"),
                "deleteTimer": ("Error deleting timer", "delete_timer"),
                "listTimers": ("Error listing timers", "list_timers")}


class TimeModeError(SparkErrorClass, SpateError, PySparkRuntimeError):
    """A timer call in timeMode None: the ``PySparkRuntimeError`` Spark's client raises when its state server
    refuses it (for ``listTimers`` Spark's worker loses its connection instead; the batch fails either way).
    ``getCondition()``: ``STATEFUL_PROCESSOR_CANNOT_PERFORM_OPERATION_WITH_INVALID_TIME_MODE``."""

    def __init__(self, call: str) -> None:
        prefix, operation = _TIMER_CALLS[call]
        PySparkRuntimeError.__init__(
            self, message=f"{prefix}: [STATEFUL_PROCESSOR_CANNOT_PERFORM_OPERATION_WITH_INVALID_TIME_MODE] Failed "
                          f"to perform stateful processor operation={operation} with invalid timeMode=NoTime "
                          "SQLSTATE: 42802 (timers need timeMode 'ProcessingTime' or 'EventTime')")


class TtlError(SparkErrorClass, SpateError, PySparkValueError):
    """A state declared with a TTL Spark refuses, with Spark's error class (``getCondition()``) and message, then
    spate's fix: a TTL in timeMode None (``STATEFUL_PROCESSOR_INCORRECT_TIME_MODE_TO_ASSIGN_TTL``) or one that is
    not positive (``STATEFUL_PROCESSOR_TTL_DURATION_MUST_BE_POSITIVE``). A ``ValueError``."""

    def __init__(self, message: str) -> None:
        PySparkValueError.__init__(self, message=message)


def check_ttl(declared: StateDeclaration, time_mode: str) -> None:
    """Refuse, as Spark does, a TTL of a declared state that cannot work in ``time_mode``."""
    name, kind, ttl_ms = declared.name, declared.kind, declared.ttl_ms
    if ttl_ms is None:
        return
    if time_mode == "None":
        raise TtlError(f"[STATEFUL_PROCESSOR_INCORRECT_TIME_MODE_TO_ASSIGN_TTL] Cannot use TTL for state={name} in "
                       f"timeMode=NoTime, use TimeMode.ProcessingTime() instead. (spate: state {name!r} has a TTL, "
                       "which needs timeMode 'ProcessingTime' (or 'EventTime'), as on Spark; TTL follows "
                       "processing time: pass time_mode=\"ProcessingTime\" to transform_with_state, or declare "
                       "the state without ttlDurationMs)")
    if isinstance(ttl_ms, bool) or not isinstance(ttl_ms, int) or ttl_ms <= 0:
        operation = f"get{kind.capitalize()}State"  # the handle's call
        raise TtlError(f"[STATEFUL_PROCESSOR_TTL_DURATION_MUST_BE_POSITIVE] TTL duration must be greater than zero "
                       f"for State store operation={operation} on state={name}. (spate: ttlDurationMs is "
                       f"{ttl_ms!r}; give a positive number of milliseconds, or None for no TTL)")


class StateSchemas:
    """The schema records of one subtask's states: restored from the checkpoint (broadcast operator state
    :data:`~spate.spark.state_schema.SCHEMAS_STATE`), checked and extended as ``init`` declares states."""

    def __init__(self, ctx: Context) -> None:
        self._stored = ctx.get_broadcast_state(SCHEMAS_STATE)
        self._checked: dict[str, StateDeclaration] = {}

    def declare(self, declared: StateDeclaration) -> StateSchemaRecord:
        """The record of a state as declared now (an evolution of the recorded one is checked once)."""
        name = declared.name
        recorded = self._stored.get(name)
        record = StateSchemaRecord.from_dict(recorded) if recorded is not None else None
        if self._checked.get(name) != declared or record is None:
            record = evolve(declared, record)
            self._stored.put(name, record.to_dict())
            self._checked[name] = declared
        return record

    def forget(self, name: str) -> None:
        self._stored.remove(name)
        self._checked.pop(name, None)


class _StateVar:
    """What every state variable shares: the spate state behind it and the check that it was not deleted."""

    def __init__(self, handle: StatefulProcessorHandle, name: str, state: Any, codec: StateCodec) -> None:
        self._handle, self._name, self._s, self._codec = handle, name, state, codec

    kind = ""

    def _live(self, doing: str) -> Any:
        """The spate state, unless it was deleted; ``doing`` completes Spark's message ("Error <doing>: ...")."""
        if self._name in self._handle.deleted:
            raise MissingStateError(
                f"Error {doing}: {self.kind} state {self._name} is not initialized. (deleteIfExists"
                f"({self._name!r}) removed it in this batch; the next batch's init declares it again)")
        return self._s


class ValueState(_StateVar):
    kind = "Value"

    def exists(self) -> bool:
        return bool(self._live("checking value state exists").exists())

    def get(self) -> tuple | None:
        stored = self._live("getting value state").value()
        return None if stored is None else self._codec.value(stored)

    def update(self, newValue: tuple) -> None:  # noqa: N803 - Spark's API
        self._live("updating value state").update(self._codec.stored(newValue))

    def clear(self) -> None:
        self._live("clearing value state").clear()


class ListState(_StateVar):
    kind = "List"

    def exists(self) -> bool:
        return bool(self._live("checking list state exists").get())

    def get(self) -> Iterator[tuple]:
        return iter([self._codec.value(v) for v in self._live("getting list state").get()])

    def put(self, newState: list[tuple]) -> None:  # noqa: N803
        self._live("putting list state").update(self._non_empty([self._codec.stored(v) for v in newState]))

    def appendValue(self, newState: tuple) -> None:  # noqa: N802,N803
        self._live("appending value to list state").add(self._codec.stored(newState))

    def appendList(self, newState: list[tuple]) -> None:  # noqa: N802,N803
        self._live("appending list to list state").add_all(self._non_empty([self._codec.stored(v) for v in newState]))

    def _non_empty(self, values: list[Any]) -> list[Any]:
        if not values:
            raise refused("ILLEGAL_STATE_STORE_VALUE.EMPTY_LIST_VALUE", "Illegal value provided to the State Store "
                          f"Cannot write empty list values to State Store for StateName {self._name}")
        return values

    def clear(self) -> None:
        self._live("clearing list state").clear()


class MapState(_StateVar):
    kind = "Map"

    def __init__(self, handle: StatefulProcessorHandle, name: str, state: Any, codec: StateCodec,
                 key_codec: KeyCodec) -> None:
        super().__init__(handle, name, state, codec)
        self._keys = key_codec

    def _key(self, key: tuple) -> tuple:
        return self._keys.stored(key, self._name)

    def exists(self) -> bool:
        return not self._live("checking map state exists").is_empty()

    def getValue(self, key: tuple) -> Any:  # noqa: N802
        stored = self._live("getting value from map state").get(self._key(key))
        return None if stored is None else self._codec.row(stored)

    def containsKey(self, key: tuple) -> bool:  # noqa: N802
        return bool(self._live("checking map state contains key").contains(self._key(key)))

    def updateValue(self, key: tuple, value: tuple) -> None:  # noqa: N802
        self._live("updating value in map state").put(self._key(key), self._codec.stored(value))

    def iterator(self) -> Iterator[tuple[tuple, tuple]]:
        return iter([(self._keys.value(k), self._codec.value(v)) for k, v in self._live("iterating map state").items()])

    def keys(self) -> Iterator[tuple]:
        return iter([self._keys.value(k) for k in self._live("getting keys of map state").keys()])  # noqa: SIM118 - spate's MapState

    def values(self) -> Iterator[tuple]:
        return iter([self._codec.value(v) for v in self._live("getting values of map state").values()])

    def removeKey(self, key: tuple) -> None:  # noqa: N802
        self._live("removing key from map state").remove(self._key(key))

    def clear(self) -> None:
        self._live("clearing map state").clear()


class StatefulProcessorHandle:
    """``pyspark``'s ``StatefulProcessorHandle`` for one batch of one subtask, backed by spate keyed state."""

    def __init__(self, ctx: Context, time_mode: str, schemas: StateSchemas) -> None:
        self._ctx, self._time_mode, self._schemas = ctx, time_mode, schemas
        self.deleted: set[str] = set()

    def _state(self, declared: StateDeclaration) -> tuple[Any, Any]:
        check_ttl(declared, self._time_mode)
        record = self._schemas.declare(declared)
        self.deleted.discard(declared.name)
        return self._ctx.state(_DESCRIPTORS[declared.kind](declared.name, ttl_ms=declared.ttl_ms)), record

    def getValueState(self, stateName: str, schema: Any, ttlDurationMs: int | None = None) -> ValueState:  # noqa: N802,N803
        state, record = self._state(StateDeclaration(stateName, "value", schema, None, ttlDurationMs))
        return ValueState(self, stateName, state, record.codec(stateName))

    def getListState(self, stateName: str, schema: Any, ttlDurationMs: int | None = None) -> ListState:  # noqa: N802,N803
        state, record = self._state(StateDeclaration(stateName, "list", schema, None, ttlDurationMs))
        return ListState(self, stateName, state, record.codec(stateName))

    def getMapState(self, stateName: str, userKeySchema: Any, valueSchema: Any,  # noqa: N802,N803
                    ttlDurationMs: int | None = None) -> MapState:  # noqa: N803
        state, record = self._state(StateDeclaration(stateName, "map", valueSchema, userKeySchema, ttlDurationMs))
        key_codec = record.key_codec()
        assert key_codec is not None
        return MapState(self, stateName, state, record.codec(stateName), key_codec)

    def registerTimer(self, expiryTimestampMs: int) -> None:  # noqa: N802,N803
        if self._time_mode == "EventTime":
            self._ctx.register_event_time_timer(int(expiryTimestampMs))
        elif self._time_mode == "ProcessingTime":
            self._ctx.register_processing_time_timer(int(expiryTimestampMs))
        else:
            raise TimeModeError("registerTimer")

    def deleteTimer(self, expiryTimestampMs: int) -> None:  # noqa: N802,N803
        if self._time_mode == "EventTime":
            self._ctx.delete_event_time_timer(int(expiryTimestampMs))
        elif self._time_mode == "ProcessingTime":
            self._ctx.delete_processing_time_timer(int(expiryTimestampMs))
        else:
            raise TimeModeError("deleteTimer")

    def listTimers(self) -> Iterator[int]:  # noqa: N802
        """The key's timers in the order Spark lists them: its state store's, where a timestamp is a long
        stored little-endian (so 0, 10**12, 1, -5), not by time."""
        if self._time_mode == "EventTime":
            timers = self._ctx.event_time_timers()
        elif self._time_mode == "ProcessingTime":
            timers = self._ctx.processing_time_timers()
        else:
            raise TimeModeError("listTimers")
        return iter(sorted(timers, key=_spark_timer_order))

    def deleteIfExists(self, stateName: str) -> None:  # noqa: N802,N803
        """Remove state ``stateName`` for every key of this subtask, also one this run's processor no longer
        declares; using it raises until a later batch's ``init`` declares it again."""
        meta = next((m for m in self._ctx._keyed.state_metas if m.name == stateName), None)  # noqa: SLF001
        if meta is not None and meta.kind in _DESCRIPTORS:
            self._clear_every_key(_DESCRIPTORS[meta.kind](stateName, ttl_ms=meta.ttl_ms))
        self._schemas.forget(stateName)
        self.deleted.add(stateName)

    def _clear_every_key(self, descriptor: StateDescriptor) -> None:
        state, keyed = self._ctx.state(descriptor), self._ctx._keyed  # noqa: SLF001
        had_key, current = keyed.current_key_group >= 0, keyed.current_key
        for key in list(self._ctx.keys(descriptor)):
            keyed.set_current_key(key)
            state.clear()
        if had_key:
            keyed.set_current_key(current)
        else:
            keyed.clear_current_key()


def _spark_timer_order(timestamp_ms: int) -> bytes:
    """Where Spark's RocksDB state store lists a timer: by the bytes of its timestamp in an UnsafeRow."""
    return timestamp_ms.to_bytes(8, "little", signed=True)


class DeclaringHandle:
    """The handle ``init`` gets on the driver before the query starts (Spark's pre-init): it records and checks
    the states the processor declares, so a schema Spark would refuse fails at once, not in the first batch."""

    def __init__(self, time_mode: str = "None") -> None:
        self.declared: dict[str, tuple[str, Any, Any]] = {}
        self.time_mode = time_mode

    def _declare(self, declared: StateDeclaration) -> None:
        check_ttl(declared, self.time_mode)
        check_nullable(declared.name, parse_schema(declared.schema))
        if declared.key_schema is not None:
            parse_schema(declared.key_schema)
        self.declared[declared.name] = (declared.kind, declared.schema, declared.key_schema)

    def getValueState(self, stateName: str, schema: Any, ttlDurationMs: int | None = None) -> None:  # noqa: N802,N803
        self._declare(StateDeclaration(stateName, "value", schema, None, ttlDurationMs))

    def getListState(self, stateName: str, schema: Any, ttlDurationMs: int | None = None) -> None:  # noqa: N802,N803
        self._declare(StateDeclaration(stateName, "list", schema, None, ttlDurationMs))

    def getMapState(self, stateName: str, userKeySchema: Any, valueSchema: Any,  # noqa: N802,N803
                    ttlDurationMs: int | None = None) -> None:  # noqa: N803
        self._declare(StateDeclaration(stateName, "map", valueSchema, userKeySchema, ttlDurationMs))

    def deleteIfExists(self, stateName: str) -> None:  # noqa: N802,N803
        self.declared.pop(stateName, None)

    def registerTimer(self, expiryTimestampMs: int) -> None:  # noqa: N802,N803
        """No key on the driver: nothing to register (Spark's driver handle ignores it too)."""

    def deleteTimer(self, expiryTimestampMs: int) -> None:  # noqa: N802,N803
        """As :meth:`registerTimer`."""

    def listTimers(self) -> Iterator[int]:  # noqa: N802
        return iter(())


def declared_states(processor: Any, time_mode: str = "None") -> dict[str, tuple[str, Any, Any]]:
    """Run a copy of ``processor``'s ``init`` (and ``close``) with a :class:`DeclaringHandle`: the states it
    declares (name → kind, value schema, map key schema), each schema parsed and checked, and each TTL checked
    against ``time_mode`` (:class:`TtlError`)."""
    handle = DeclaringHandle(time_mode)
    probe = copy.deepcopy(processor)
    probe.init(handle)
    probe.close()
    return handle.declared


__all__ = ["StatefulProcessorHandle", "DeclaringHandle", "declared_states",
           "StateSchemas", "MissingStateError", "TimeModeError", "TtlError", "check_ttl", "ValueState", "ListState",
           "MapState"]
