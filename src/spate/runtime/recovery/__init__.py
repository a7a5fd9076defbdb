"""The recovery ladder: bringing a subtask's live state to its plan's base checkpoint by the cheapest rung that
is safe. :func:`recover` is its one entry point and tries the rungs in order:

1. **reused**: the live state in this process is at the base (:meth:`LiveState.at_base
   <spate.runtime.recovery.live.LiveState.at_base>`): it goes on as it is;
2. **caught up**: with the lmdb table, the subtask's own local copy tagged with a checkpoint of the base's
   lineage, caught up by replaying the change sets since (``caught_up``, or ``reused`` when the copy is at the
   base already: :mod:`spate.runtime.recovery.local_copy`);
3. **rescaled**: at a new parallelism with the lmdb table, the old subtasks' local copies on this machine,
   reading checkpoint storage only for key groups no usable copy holds (:mod:`spate.runtime.recovery.local_rescale`
   over :mod:`spate.runtime.rescale`);
4. **restored** from a native snapshot: with the lmdb table, a native snapshot of the subtask's key groups (the
   changelog's materialization), hard-linked or downloaded, taken as the table's read-only base, its change sets
   replayed into the table (:mod:`spate.runtime.recovery.download`);
5. **restored**: everything the plan names read from checkpoint storage (``new`` without a base:
   :mod:`spate.runtime.recovery.storage`).

The rules that say when a copy is trusted are :mod:`spate.runtime.recovery.trust`; what a rung builds with and
gives, :mod:`spate.runtime.recovery.recovered`; the live state and the operations that change it,
:mod:`spate.runtime.recovery.live`. The result's :class:`~spate.checkpoint.ackinfo.RecoveryInfo` (how the state got
to the base) is the part of the ack's ``AckInfo`` the subtask carries as is.
"""

from __future__ import annotations

from spate.checkpoint.protocol import SubtaskPlan
from spate.runtime.recovery import download, local_copy, local_rescale, storage
from spate.runtime.recovery.live import LiveState
from spate.runtime.recovery.recovered import RecoveredState, StateOwner
from spate.runtime.recovery.trust import listed


def recover(plan: SubtaskPlan, current: LiveState) -> LiveState:
    """The live state at the plan's base: ``current`` itself if it is there (reused), else a new live state
    installed from the first rung that gives one (``current`` is dropped first; on a failure it stays empty)."""
    current.take_back()
    if current.at_base(plan):
        current.reuse(plan)
        return current
    current.drop(plan)  # an lmdb copy stays on disk for the next rung to find
    owner = current.owner
    if plan.changelog_ref is not None:  # the rungs need the handles of the log the plan names
        plan = listed(plan, owner.services.storage_of(plan.base_uri))  # type: ignore[arg-type]
    state = _climb(plan, owner)
    if plan.base_state_entries is not None:
        state.keyed.table.learn_entry_count(plan.base_state_entries)
    live = LiveState(owner)
    live.install(plan, state)
    return live


def _climb(plan: SubtaskPlan, owner: StateOwner) -> RecoveredState:
    """The state at the plan's base from the cheapest rung below reuse that gives it."""
    if owner.config.table == "lmdb":
        state = local_copy.catch_up(plan, owner) or local_rescale.rescale(plan, owner) or download.restore(plan, owner)
        if state is not None:
            return state
    return storage.restore(plan, owner)


__all__ = ["LiveState", "StateOwner", "recover"]
