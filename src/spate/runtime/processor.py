"""The processor API (Flink style): ``open(ctx)`` obtains state, ``process(key, rows, ctx)`` handles one key's
rows of a micro-batch, ``on_timer`` handles a timer, ``end_batch`` runs once per subtask and batch."""

from __future__ import annotations

import datetime as _dt
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from typing import Any, overload

from spate.errors import EventTimeError, ProcessorError, StateDescriptorError
from spate.state.bulk import BulkListState, BulkValueState
from spate.state.bulk_map import BulkMapState
from spate.state.bulk_timers import BulkTimers
from spate.state.descriptors import ListStateDescriptor, MapStateDescriptor, StateDescriptor, ValueStateDescriptor
from spate.state.keyed import KeyedStateBackend
from spate.state.operator import BroadcastState, ListOperatorState, OperatorStateBackend
from spate.state.timers import EVENT_TIME, PROCESSING_TIME

Row = dict[str, Any]


class Context:
    """What a processor sees: its subtask, the time, the current key, state and timers.

    The same object is passed to ``open``, ``process``, ``on_timer`` and ``end_batch``.

    Raises (from the state and timer calls, named on each):
        StateAccessError: keyed state or timers used outside a key (a ``RuntimeError``), bulk calls whose
            values do not match their keys, a timer timestamp that is not an int.
        InvalidKeyError: a key this subtask does not own, or one that cannot be encoded.
        IncompatibleStateError: a state name obtained with another descriptor, or restored as another kind.
        SerializationError: a state value its serializer cannot encode.
    """

    def __init__(self, keyed: KeyedStateBackend, operator: OperatorStateBackend, index: int,
                 parallelism: int, max_parallelism: int) -> None:
        self._keyed = keyed
        self._operator = operator
        self.subtask_index = index
        self.parallelism = parallelism
        self.max_parallelism = max_parallelism
        self.batch_id = -1
        self.processing_time_ms = 0
        self.watermark_ms: int | None = None
        self.timer_domain: str | None = None
        self.timer_namespace: Any = None

    # -- keyed state ----------------------------------------------------------------------------------
    def state(self, descriptor: StateDescriptor) -> Any:
        """The keyed state object of ``descriptor``, scoped to whichever key is being processed.

        Raises:
            IncompatibleStateError: the name was obtained with another descriptor, or is stored as another kind,
                with another serializer or TTL.
            SerializationError: the descriptor's serializer is pickle and the query did not allow pickle.
        """
        return self._keyed.get_state(descriptor)

    @overload
    def bulk_state(self, descriptor: ValueStateDescriptor) -> BulkValueState: ...

    @overload
    def bulk_state(self, descriptor: ListStateDescriptor) -> BulkListState: ...

    @overload
    def bulk_state(self, descriptor: MapStateDescriptor) -> BulkMapState: ...

    def bulk_state(self, descriptor: StateDescriptor) -> BulkValueState | BulkListState | BulkMapState:
        """Value, list or map state of many keys at once, for a ``BatchProcessor``: the same state
        ``state(descriptor)`` gives key by key. Value state: ``get_many`` / ``put_many`` / ``clear_many``; list
        state: ``get_many`` / ``add_many`` / ``update_many`` / ``clear_many``; map state: whole maps
        (``get_many`` / ``put_many`` / ``update_many`` / ``clear_many``) or one entry per key
        (``get_entries`` / ``put_entries`` / ``remove_entries``).

        Raises:
            StateDescriptorError: (a ``TypeError``) a descriptor of another kind (reducing, aggregating).
            IncompatibleStateError: as :meth:`state`.
        """
        if isinstance(descriptor, ValueStateDescriptor):
            return BulkValueState(self._keyed, self._keyed.get_state(descriptor))
        if isinstance(descriptor, ListStateDescriptor):
            return BulkListState(self._keyed, self._keyed.get_state(descriptor))
        if isinstance(descriptor, MapStateDescriptor):
            return BulkMapState(self._keyed, self._keyed.get_state(descriptor))
        raise StateDescriptorError(f"bulk_state supports value, list and map state; {descriptor.name!r} is "
                                   f"{type(descriptor).__name__}: use state(descriptor) key by key")

    def bulk_timers(self) -> BulkTimers:
        """Timers of many keys at once, for a ``BatchProcessor`` (its ``on_timers`` receives them when due)."""
        return BulkTimers(self._keyed, self._keyed.timers)

    @property
    def key(self) -> Any:
        """The key being processed (None in ``open`` and ``end_batch``)."""
        return self._keyed.current_key

    def keys(self, descriptor: StateDescriptor, namespace: Any = None) -> Iterable[Any]:
        """Every key of this subtask with a value in ``descriptor``'s state (a scan: use sparingly)."""
        return self._keyed.keys(descriptor, namespace)

    # -- operator state -------------------------------------------------------------------------------
    def get_list_state(self, name: str, serializer: Any = None) -> ListOperatorState:
        """Operator list state, split among subtasks on rescale (FLIP-8)."""
        return self._operator.get_list_state(name, serializer)

    def get_union_list_state(self, name: str, serializer: Any = None) -> ListOperatorState:
        """Operator list state of which every subtask receives the union on restore."""
        return self._operator.get_union_list_state(name, serializer)

    def get_broadcast_state(self, name: str, serializer: Any = None) -> BroadcastState:
        """A map state each subtask holds one copy of."""
        return self._operator.get_broadcast_state(name, serializer)

    # -- timers ---------------------------------------------------------------------------------------
    def register_event_time_timer(self, timestamp_ms: int, namespace: Any = None) -> None:
        """Call ``on_timer`` for the current key once the watermark reaches ``timestamp_ms``.

        Raises:
            StateAccessError: no key is current (in ``open``, ``start_batch``, ``end_batch``: a ``RuntimeError``),
                or ``timestamp_ms`` is not an int (a ``TypeError``).
        """
        self._keyed.timers.register(EVENT_TIME, timestamp_ms, namespace)

    def delete_event_time_timer(self, timestamp_ms: int, namespace: Any = None) -> None:
        self._keyed.timers.delete(EVENT_TIME, timestamp_ms, namespace)

    def register_processing_time_timer(self, timestamp_ms: int, namespace: Any = None) -> None:
        """Call ``on_timer`` for the current key at the first batch starting at or after ``timestamp_ms``.

        Raises:
            StateAccessError: as :meth:`register_event_time_timer`.
        """
        self._keyed.timers.register(PROCESSING_TIME, timestamp_ms, namespace)

    def delete_processing_time_timer(self, timestamp_ms: int, namespace: Any = None) -> None:
        self._keyed.timers.delete(PROCESSING_TIME, timestamp_ms, namespace)

    def event_time_timers(self, namespace: Any = None) -> list[int]:
        return self._keyed.timers.list(EVENT_TIME, namespace)

    def processing_time_timers(self, namespace: Any = None) -> list[int]:
        return self._keyed.timers.list(PROCESSING_TIME, namespace)


class Processor(ABC):
    """Subclass and override :meth:`process` (and any of the other hooks).

    One instance runs per subtask; it is re-created when the subtask restores its state.

    The order within a batch: ``start_batch``, the initial state's rows (first batch only), ``process`` per key
    of the batch's input, then the processing-time timers due at ``ctx.processing_time_ms`` (the batch's
    start, the same for every key), then the event-time timers due at the watermark, then ``end_batch``. A
    timer the input deleted or moved does not fire: a "user went idle" timer re-armed by each event never fires
    for a user whose events are in the batch. This is Spark's order for transformWithState, and
    ``BatchProcessor``'s.

    Class attributes choose how the runtime drives it (the defaults are Flink's where Flink has one; the
    ``StatefulProcessor`` adapter sets Spark's transformWithState semantics):
    ``processing_timers_first`` fires due processing-time timers before the batch's input instead (``True``:
    a timer due at the batch's start fires even if the batch's input for its key would have moved it);
    ``watermark_floor_ms`` is the watermark before any event time is seen and a floor under it (Spark: 0);
    ``drop_late_rows`` drops input rows whose event time is at or below the previous batch's watermark before
    they are grouped; ``timers_deleted_after_firing`` keeps a firing timer registered while ``on_timer``
    runs (it lists it, and may delete or re-register it) and deletes it after, and fires only the timers due
    when firing began (Spark's order; ``False``: Flink's, the timer is gone when ``on_timer`` runs and timers
    registered during firing fire in the same batch when due); ``idle_batch_on_watermark_move`` runs a batch
    without input whenever the watermark moved (Spark's rule for transformWithState in event time; ``False``: only
    when an event-time timer is due then, see :mod:`spate.runtime.idle`); ``may_have_timers`` says whether the
    processor registers timers, so whether its stream needs batches without input (on Spark: a source of ticks,
    whose Python processes cost about two seconds each to start). Left ``None`` it is inferred: a processor has
    timers when it overrides ``on_timer`` or sets ``idle_batch_on_watermark_move``.
    """

    processing_timers_first: bool = False
    may_have_timers: bool | None = None
    watermark_floor_ms: int | None = None
    drop_late_rows: bool = False
    timers_deleted_after_firing: bool = False
    idle_batch_on_watermark_move: bool = False

    def open(self, ctx: Context) -> None:
        """Obtain state handles here: ``self.count = ctx.state(ValueStateDescriptor("count", default=0))``."""

    @abstractmethod
    def process(self, key: Any, rows: Sequence[Row], ctx: Context) -> Iterable[Row] | None:
        """Handle the rows of one key in this micro-batch (a list-like sequence of dicts: see
        :class:`~spate.runtime.batch.KeyRows`); return or yield output rows."""

    def start_batch(self, ctx: Context) -> None:
        """Called once per subtask and batch, before its timers and keys."""

    def process_initial(self, key: Any, rows: Sequence[Row], ctx: Context) -> Iterable[Row] | None:
        """The key's rows of the query's initial state: in the first batch of a new query only (no checkpoint
        to restore), before the batch's input. A processor given an initial state must override it.

        Raises:
            ProcessorError: (a ``ValueError``) not overridden, but the query was given an initial state.
        """
        raise ProcessorError(f"{type(self).__qualname__} does not override process_initial, but the query was given "
                             "an initial state: write the key's state from its initial rows there, or drop "
                             "initial_state")

    def on_timer(self, key: Any, timestamp_ms: int, ctx: Context) -> Iterable[Row] | None:
        """A timer of ``key`` fired (``ctx.timer_domain`` is "event" or "processing")."""
        return None

    def end_batch(self, ctx: Context) -> Iterable[Row] | None:
        """Called once per subtask after every key and timer of the batch (operator state goes here)."""
        return None

    def close(self) -> None:
        """Release resources; state is already checkpointed."""


def to_epoch_ms(value: Any) -> int:
    """An event-time column value as epoch milliseconds (int ms, float seconds are not guessed).

    Raises:
        EventTimeError: (a ``TypeError``) ``value`` is neither an int nor a datetime.
    """
    if isinstance(value, bool):
        raise EventTimeError(f"event time must be int milliseconds or a datetime, got {value!r}: give the event-time "
                             "column epoch milliseconds (int) or datetimes")
    if isinstance(value, int):
        return value
    if isinstance(value, _dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=_dt.UTC)
        return int(value.timestamp() * 1000)
    raise EventTimeError(f"event time must be int milliseconds or a datetime, got {type(value).__name__}: give the "
                         "event-time column epoch milliseconds (int) or datetimes (float seconds are not guessed)")
