"""The ladder's rung for the subtask's own local copy: with the lmdb table, a copy on this machine's disk tagged
with a checkpoint of the base's lineage (:func:`~spate.runtime.recovery.trust.catch_up_start`) is taken over and
caught up by replaying the plan's change sets since (``caught_up``; ``reused`` when it is at the base already,
e.g. another process of the executor moved it there). Keyed state is not downloaded; a copy that cannot be
trusted is deleted.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable

import lmdb

from spate.changelog.restore import restore_keyed_state
from spate.checkpoint.ackinfo import CAUGHT_UP, RecoveryInfo
from spate.checkpoint.protocol import SubtaskPlan
from spate.errors import SpateError
from spate.runtime.recovery.recovered import RecoveredState, StateOwner, ms_since, nonzero
from spate.runtime.recovery.trust import (
    Lineage,
    bytes_to_read,
    catch_up_start,
    mark_dirty,
    read_tag,
    recovery_kind,
    write_tag,
)
from spate.snapshot.handles import ChangeSetHandle, KeyedHandle
from spate.state.lmdb_table import LmdbTable
from spate.state.overlay import OverlayTable, open_local_table
from spate.state.table import StateTable

log = logging.getLogger(__name__)


def catch_up(plan: SubtaskPlan, owner: StateOwner) -> RecoveredState | None:
    """Take over the subtask's lmdb directory if its tag shows the state of a completed checkpoint that leads to
    the plan's base, replaying the change sets since: keyed state is not downloaded. Otherwise delete it
    (None)."""
    started = time.perf_counter()
    found = _usable_local_copy(plan, owner)
    if found is None:
        return None
    local, copy_at, start = found
    assert plan.base_checkpoint_id is not None
    target = owner.target(plan, local)
    replay = plan.changelog[start:]
    try:
        if replay:
            replay_change_sets(plan, owner, target.table, replay)
        operator = owner.operator_state(plan)
    except BaseException:
        target.discard(destroy=False)  # not left locked by this process: a retry opens it afresh
        raise
    if target.clog is not None:
        target.clog.restored(plan.keyed, plan.changelog)
    kind = recovery_kind(copy_at, start, plan)
    caught_up = kind == CAUGHT_UP
    info = RecoveryInfo(recovery=kind, restored_from=plan.base_checkpoint_id if caught_up else None,
                        caught_up_from=copy_at if caught_up else None,
                        restore_bytes=bytes_to_read(replay, plan.operator), restore_ms=ms_since(started))
    carried: list[KeyedHandle | ChangeSetHandle] = (
        [*plan.keyed, *plan.changelog[:start]] if target.clog is not None else [])
    return owner.recovered(plan, target, operator, info, stats=nonzero(replayed_change_sets=len(replay)),
                           carried=carried)


def _usable_local_copy(plan: SubtaskPlan, owner: StateOwner) -> tuple[LmdbTable | OverlayTable, int, int] | None:
    """(table, the checkpoint it is at, the index of the plan's first change set it lacks) of the subtask's
    local copy, if it can be caught up to the base; an unusable copy is deleted."""
    path = owner.lmdb_dir(plan)
    try:
        table = open_local_table(path, owner.services.readers)
    except FileNotFoundError:  # a base it reads from is gone
        shutil.rmtree(path, ignore_errors=True)
        return None
    except (SpateError, lmdb.Error) as e:  # e.g. a base it reads from cannot be opened in this process
        log.info("subtask %d: local state not reused: %s", owner.index, e)
        return None
    inner = table.inner if isinstance(table, OverlayTable) else table
    if inner.linked_elsewhere():  # a stale attempt at the old parallelism: a rescaled subtask reads this file
        table.destroy()
        return None
    tag = read_tag(table)
    start = catch_up_start(*tag, plan) if tag is not None else None
    if tag is None or start is None or not _intact(table, owner):
        table.destroy()
        return None
    return table, tag[0], start


def _intact(table: LmdbTable | OverlayTable, owner: StateOwner) -> bool:
    """Whether the local table still holds exactly what it held at its last commit. Checked once per process:
    the check reads the whole table, and on Spark a subtask's table moves between the Python workers of an
    executor every few batches (each keeps the digest up to date as it writes)."""
    trusted = owner.services.trusted_local
    if table.path in trusted:
        return True
    problem = table.verify()
    if problem is not None:
        log.warning("subtask %d: local state %s failed its integrity check: %s; discarding it and restoring "
                    "from checkpoint storage", owner.index, table.path, problem)
        return False
    trusted.add(table.path)
    return True


def replay_change_sets(plan: SubtaskPlan, owner: StateOwner, table: StateTable, change_sets: list[ChangeSetHandle],
                       settle: Callable[[], None] | None = None) -> None:
    """Replay ``change_sets`` (the base's change sets a local copy lacks) into its ``table``, then tag it with the
    base, once ``settle`` (what else must hold first: a base checked as the log replayed) returns. Untagged
    meanwhile: a copy left half caught up, or over a base not checked, is never trusted."""
    assert plan.base_checkpoint_id is not None and plan.base_uri is not None
    mark_dirty(table)
    restore_keyed_state(owner.keyed_backend(plan, table), owner.services.storage_of(plan.base_uri), [],
                        change_sets, owner.context(plan))
    if settle is not None:
        settle()
    write_tag(table, plan.base_checkpoint_id, Lineage.of(plan.key_groups, plan.keyed, plan.changelog))
