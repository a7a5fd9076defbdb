"""The ladder's rung for a native snapshot: with the lmdb table, when the plan's keyed state is one native snapshot
(:mod:`spate.snapshot.native`, a materialization) of exactly the subtask's key groups, its file is downloaded to
become the subtask's table, its CRC-32 checked, and the plan's change sets are replayed into it (``restored``).
No entry of the materialized state is decoded or put again: a restore costs the download and the log.

Only for a base that is a checkpoint of this root; a savepoint, another range (a rescale) or the heap table read
the snapshot key group by key group (:mod:`spate.runtime.recovery.storage`).
"""

from __future__ import annotations

import os
import shutil
import time

from spate.checkpoint.protocol import SubtaskPlan
from spate.runtime.recovery.local_copy import replay_change_sets
from spate.runtime.recovery.recovered import RecoveredState, StateOwner, ms_since, nonzero
from spate.runtime.recovery.trust import full_restore
from spate.snapshot.handles import NativeSnapshotHandle
from spate.snapshot.native import download_native
from spate.state.lmdb_table import LmdbTable

DATA_FILE = "data.mdb"  # lmdb's data file in a table directory


def restore(plan: SubtaskPlan, owner: StateOwner) -> RecoveredState | None:
    """The plan's base from its native snapshot and its log, or None if the plan's keyed state is not one native
    snapshot of the subtask's key groups in this root."""
    handle = _native_base(plan)
    if handle is None:
        return None
    assert plan.base_uri is not None
    started = time.perf_counter()
    path = owner.lmdb_dir(plan)
    shutil.rmtree(path, ignore_errors=True)  # untrusted by the rungs before, or none
    os.makedirs(path)
    try:
        download_native(owner.services.storage_of(plan.base_uri), handle, os.path.join(path, DATA_FILE),
                        owner.context(plan))
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        raise
    target = owner.target(plan, LmdbTable(path))
    try:
        replay_change_sets(plan, owner, target.table, plan.changelog)
        operator = owner.operator_state(plan)
    except BaseException:
        target.discard(destroy=True)
        raise
    if target.clog is not None:
        target.clog.restored(plan.keyed, plan.changelog)
    return owner.recovered(plan, target, operator, full_restore(plan, ms_since(started)),
                           stats=nonzero(replayed_change_sets=len(plan.changelog)))


def _native_base(plan: SubtaskPlan) -> NativeSnapshotHandle | None:
    if plan.base_checkpoint_id is None or plan.base_is_savepoint or plan.base_uri != plan.checkpoint_uri:
        return None
    if len(plan.keyed) != 1 or not isinstance(handle := plan.keyed[0], NativeSnapshotHandle):
        return None
    kgs = plan.key_groups
    return handle if handle.whole and (handle.start, handle.end + 1) == (kgs.start, kgs.stop) else None
