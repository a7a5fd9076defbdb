"""The ladder's last rung: everything the plan names read from checkpoint storage into a new table, keyed state
by key-group intersection and operator state by the FLIP-8 pieces the coordinator assigned (``restored``, or
``new`` without a base: an empty table). Always safe; the only rung of the heap table.
"""

from __future__ import annotations

import time

from spate.changelog.restore import restore_keyed_state
from spate.checkpoint.protocol import SubtaskPlan
from spate.runtime.recovery.recovered import RecoveredState, StateOwner, Target, ms_since, nonzero, restored_handles
from spate.runtime.recovery.trust import full_restore


def restore(plan: SubtaskPlan, owner: StateOwner) -> RecoveredState:
    """Everything the plan names, read from checkpoint storage, into a new table (empty without a base)."""
    target = owner.new_target(plan)
    started = time.perf_counter()
    try:
        operator = owner.operator_state(plan)
        if plan.base_checkpoint_id is not None:
            _restore_keyed_state(plan, owner, target)
    except BaseException:
        target.discard(destroy=True)
        raise
    return owner.recovered(plan, target, operator, full_restore(plan, ms_since(started)),
                           stats=nonzero(replayed_change_sets=len(plan.changelog)), handles=restored_handles(plan))


def _restore_keyed_state(plan: SubtaskPlan, owner: StateOwner, target: Target) -> None:
    assert plan.base_uri is not None
    backend = owner.keyed_backend(plan, target.table)
    restore_keyed_state(backend, owner.services.storage_of(plan.base_uri), plan.keyed, plan.changelog,
                        owner.context(plan))
    if target.clog is None:
        return
    if plan.base_uri == plan.checkpoint_uri:
        target.clog.restored(plan.keyed, plan.changelog)
    else:  # a savepoint elsewhere: this root must hold its own copy before the first checkpoint
        target.clog.materialize_now(backend)
