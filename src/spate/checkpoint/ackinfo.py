"""What a subtask reports about its batch besides its state handles: typed fields every ack carries
(:class:`~spate.checkpoint.protocol.SubtaskAck`) and the checkpoint metadata keeps per subtask
(:class:`~spate.checkpoint.metadata.SubtaskState`). Free-form figures stay in their ``stats`` dict."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

NEW = "new"  # no base checkpoint: the state starts empty
REUSED = "reused"  # the local state (in memory or on local disk) was at the base checkpoint
CAUGHT_UP = "caught_up"  # a local copy at an earlier checkpoint replayed the change sets since
RESTORED = "restored"  # read from checkpoint storage: materialized snapshots, then every change set since
RESCALED = "rescaled"  # at a new parallelism: built from local copies of the old subtasks' state (online rescale)
UNKNOWN = "unknown"  # metadata written by spate before these fields existed, where the stats do not tell
RECOVERY_KINDS = (NEW, REUSED, CAUGHT_UP, RESTORED, RESCALED)


@dataclass(kw_only=True)
class RecoveryInfo:
    """How a subtask's state got to its plan's base checkpoint: the part of :class:`AckInfo` the subtask's
    recovery produces (:func:`spate.runtime.recovery.recover`).

    Attributes:
        recovery: one of :data:`RECOVERY_KINDS` (:data:`UNKNOWN` only in metadata of version < 3).
        restored_from: the base checkpoint whose files it read (``restored``, ``caught_up``, ``rescaled``), else
            None.
        caught_up_from: with ``caught_up``, the checkpoint its local copy was at; else None.
        restore_bytes: bytes it read from checkpoint storage to get its state to the base (snapshots, change
            sets and operator state; 0 when the state was live in the process). With ``rescaled``, only what no
            local copy held (the ack's ``stats["local_copy_bytes"]`` says what was copied locally).
        restore_ms: how long that took.
    """

    recovery: str = NEW
    restored_from: int | None = None
    caught_up_from: int | None = None
    restore_bytes: int = 0
    restore_ms: float = 0.0

    def __post_init__(self) -> None:
        if self.recovery not in (*RECOVERY_KINDS, UNKNOWN):
            raise ValueError(f"recovery must be one of {RECOVERY_KINDS}, got {self.recovery!r}")

    def recovery_info(self) -> dict[str, Any]:
        """The recovery facts as keyword arguments of :class:`AckInfo` (and of this class)."""
        return {f.name: getattr(self, f.name) for f in fields(RecoveryInfo)}


@dataclass(kw_only=True)
class AckInfo(RecoveryInfo):
    """Typed facts about one subtask's batch: how its state got to the base (the inherited
    :class:`RecoveryInfo` fields, as the subtask's recovery produced them) and what the batch did.

    Attributes:
        rows: input rows the subtask processed.
        staged: its outputs were staged in the checkpoint for the sink (a sink was configured).
        executor: where it ran (filled in by the transport, e.g. the Spark executor id; None in-process).
        next_processing_timer_ms / next_event_timer_ms: the earliest timer of each time domain still registered
            after the batch (a lower bound: it may have been deleted since), None without one. The driver runs a
            batch without input when one is due (:mod:`spate.runtime.idle`).
        state_entries: the state entries the subtask held after the batch (its table's entry count: values, map
            entries, timers), None where that is not cheap to know. A restore of exactly these key groups learns
            its count from it (:meth:`~spate.state.table.StateTable.learn_entry_count`).
    """

    rows: int = 0
    staged: bool = False
    executor: str | None = None
    next_processing_timer_ms: int | None = None
    next_event_timer_ms: int | None = None
    state_entries: int | None = None

    def ack_info(self) -> dict[str, Any]:
        """The typed fields as a dict (their JSON form)."""
        return {name: getattr(self, name) for name in ACK_INFO_FIELDS}


# rows and staged first: the JSON keeps the order it had before the recovery facts were a part of their own
ACK_INFO_FIELDS = ("rows", "staged", *(f.name for f in fields(AckInfo) if f.name not in ("rows", "staged")))


def ack_info_from_stats(stats: dict[str, Any]) -> dict[str, Any]:
    """The typed fields of metadata written before they existed, moved out of its ``stats`` (which is
    changed): ``rows``, ``staged``, ``restored_from`` and ``restore_ms`` were statistics then."""
    restored_from = stats.pop("restored_from", None)
    return {"rows": stats.pop("rows", 0), "staged": bool(stats.pop("staged", False)),
            "recovery": RESTORED if restored_from is not None else UNKNOWN, "restored_from": restored_from,
            "restore_ms": stats.pop("restore_ms", 0.0)}
