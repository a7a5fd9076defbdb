"""When a subtask's state can be trusted to be (or to lead to) the base checkpoint of its plan.

A subtask's lmdb table outlives the process that wrote it (on Spark the Python workers of an executor share its
local disk, and a subtask comes back to an executor after running elsewhere). When a checkpoint's state is
committed the table is tagged with the checkpoint and with its :class:`Lineage`: the identity of every handle
the subtask's ack listed. That ack describes the table exactly (its materialized snapshots, then its change
sets replayed in order), so a copy at checkpoint k reaches the plan's base n by replaying only the plan's
change sets after its own (:func:`catch_up_start`), when

* k <= n, the base is a checkpoint of this root (not a savepoint) and the key-group range is the plan's;
* the copy's materialized handles are the plan's (nothing was materialized since k);
* the copy's change sets are, in order, the first change sets of the plan's list.

A change set is identified by its log, sequence number and key groups. A log belongs to one writer, which is
never continued after a checkpoint it took part in was aborted, so the change sets of an aborted attempt, of a
rejected duplicate ack or of a fenced driver's batch are in no completed checkpoint's list. Anything else — no
lineage (state written by an older spate), a materialization or a re-written file since k — means a full
restore. At a new parallelism the old subtasks' copies are used as :mod:`spate.runtime.rescale` describes.

Here are the tag (:func:`read_tag`, :func:`write_tag`, :func:`mark_dirty`), the rules that trust it
(:func:`live_at_base`, :func:`catch_up_start`), a named log listed (:func:`listed`) and what a rung reports
(:func:`recovery_kind`, :func:`bytes_to_read`, :func:`full_restore`); the rungs of the recovery ladder
(:func:`spate.runtime.recovery.recover`) use them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from spate.checkpoint.ackinfo import CAUGHT_UP, NEW, RESTORED, REUSED, RecoveryInfo
from spate.checkpoint.metadata import read_metadata
from spate.checkpoint.protocol import ChangelogRef, SubtaskPlan
from spate.errors import CheckpointError
from spate.fs import CheckpointStorage
from spate.layout import metadata_path
from spate.snapshot.handles import ChangeSetHandle, KeyedHandle, OperatorStatePiece
from spate.snapshot.lineage import (  # noqa: F401  (re-exported: the table tag's lineage)
    LINEAGE_META,
    TAG_META,
    Lineage,
    change_set_identity,
    changelog_digest,
    keyed_identity,
)
from spate.state.lmdb_table import LmdbTable
from spate.state.overlay import OverlayTable
from spate.state.table import StateTable

DIRTY = b"dirty"  # tag of a table changed since its last checkpoint
EMPTY = -1  # tag of state that reflects "no checkpoint yet"


def catch_up_start(checkpoint_id: int, lineage: Lineage | None, plan: SubtaskPlan) -> int | None:
    """For state at completed checkpoint ``checkpoint_id`` with ``lineage``: the index into
    ``plan.changelog`` from which replaying brings it to the plan's base (``len(plan.changelog)``: it is
    there already), or None if it cannot be trusted to be an ancestor of the base (restore instead)."""
    base = plan.base_checkpoint_id
    if lineage is None or base is None or plan.base_is_savepoint or plan.base_uri != plan.checkpoint_uri:
        return None
    kgs = plan.key_groups
    if checkpoint_id > base or lineage.key_groups != (kgs.start, kgs.stop):
        return None
    if lineage.keyed != tuple(keyed_identity(h) for h in plan.keyed):
        return None
    ref = plan.changelog_ref
    if ref is not None:  # only the whole log can be compared with a named one: anything less, list it first
        whole = len(lineage.changelog) == ref.length and changelog_digest(lineage.changelog) == ref.digest
        return ref.length if whole else None
    known = len(lineage.changelog)
    if known > len(plan.changelog):
        return None
    if tuple(change_set_identity(h) for h in plan.changelog[:known]) != lineage.changelog:
        return None
    return known


def listed(plan: SubtaskPlan, storage: CheckpointStorage) -> SubtaskPlan:
    """``plan`` with its log listed: a named log (:class:`~spate.checkpoint.protocol.ChangelogRef`) read from the
    base checkpoint's metadata in ``storage`` (its root), which must be the log the plan names."""
    ref = plan.changelog_ref
    if ref is None:
        return plan
    assert plan.base_checkpoint_id is not None
    handles = read_metadata(storage, metadata_path(plan.base_checkpoint_id)).subtasks[plan.index].changelog
    if ChangelogRef.of(handles) != ref:
        raise CheckpointError(f"{storage.path(metadata_path(plan.base_checkpoint_id))}: subtask {plan.index}'s log "
                              f"of {len(handles)} change sets is not the one its plan names ({ref.length}); the "
                              "checkpoint was replaced outside spate")
    return dataclasses.replace(plan, changelog=handles, changelog_ref=None)


def recovery_kind(checkpoint_id: int, start: int, plan: SubtaskPlan) -> str:
    """``reused`` when local state is the base's as it is, else ``caught_up``."""
    return REUSED if checkpoint_id == plan.base_checkpoint_id and start == len(plan.changelog) else CAUGHT_UP


def bytes_to_read(handles: Iterable[KeyedHandle | ChangeSetHandle],
                  pieces: Iterable[OperatorStatePiece] = ()) -> int:
    """Bytes a restore fetches from checkpoint storage for ``handles`` (one ranged read of each handle's
    span) and operator state ``pieces``."""
    return sum(h.span()[1] for h in handles if h.state_bytes) + sum(p.length for p in pieces)


def full_restore(plan: SubtaskPlan, restore_ms: float) -> RecoveryInfo:
    """A restore from checkpoint storage of everything the plan names (``new`` without a base)."""
    if plan.base_checkpoint_id is None:
        return RecoveryInfo(recovery=NEW)
    read = bytes_to_read([*plan.keyed, *plan.changelog], plan.operator)
    return RecoveryInfo(recovery=RESTORED, restored_from=plan.base_checkpoint_id, restore_bytes=read,
                        restore_ms=restore_ms)


# -- the table's tag ------------------------------------------------------------------------------------------
def read_tag(table: LmdbTable | OverlayTable) -> tuple[int, Lineage | None] | None:
    """(checkpoint, lineage) a local table's state was committed as (None: unknown or changed since)."""
    raw = table.committed_meta(TAG_META)
    if raw is None or raw == DIRTY:
        return None
    try:
        checkpoint_id = int(raw)
    except ValueError:
        return None
    return checkpoint_id, Lineage.from_bytes(table.committed_meta(LINEAGE_META))


def write_tag(table: StateTable, checkpoint_id: int, lineage: Lineage) -> None:
    """Commit the table as the state of ``checkpoint_id`` with ``lineage``, in one transaction."""
    table.put_meta(TAG_META, str(checkpoint_id).encode())
    table.put_meta(LINEAGE_META, lineage.to_bytes())
    table.commit()


def mark_dirty(table: StateTable) -> None:
    """Commit the table as no checkpoint's state (until the next :func:`write_tag`)."""
    table.put_meta(TAG_META, DIRTY)
    table.commit()


def live_at_base(tag: int | None, lineage: Lineage | None, lmdb: LmdbTable | None, plan: SubtaskPlan) -> bool:
    """Whether state a process holds, tagged ``tag`` with ``lineage``, is exactly the plan's base: tagged with
    it, of its lineage (not an attempt whose ack was not the one accepted), and for an ``lmdb`` table not moved
    on by another process since."""
    if plan.base_is_savepoint:
        return False
    if plan.base_checkpoint_id is None:
        return tag == EMPTY
    if tag != plan.base_checkpoint_id or catch_up_start(tag, lineage, plan) != plan.log_length:
        return False
    return lmdb is None or read_tag(lmdb) == (tag, lineage) and not lmdb.linked_elsewhere()
