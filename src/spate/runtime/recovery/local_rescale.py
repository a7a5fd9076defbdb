"""The ladder's rung for an online rescale: at a new parallelism, the subtask's state built from the old
subtasks' local copies on this machine (moved, hard-linked as read-only bases of an overlay, or merged entry by
entry: :class:`~spate.runtime.rescale.LocalRescale`), reading checkpoint storage only for the key groups no
usable copy holds (``rescaled``).
"""

from __future__ import annotations

import time

from spate.changelog.restore import restore_keyed_state
from spate.checkpoint.ackinfo import RESCALED, RecoveryInfo
from spate.checkpoint.protocol import SubtaskPlan
from spate.runtime.recovery.recovered import RecoveredState, StateOwner, Target, ms_since, nonzero
from spate.runtime.recovery.trust import bytes_to_read
from spate.runtime.rescale import LocalRescale, missing_parts


def rescale(plan: SubtaskPlan, owner: StateOwner) -> RecoveredState | None:
    """At a new parallelism: the state built from the old subtasks' local copies on this machine, reading
    checkpoint storage only for key groups no usable copy holds. None: no copy was usable."""
    if not plan.rescale_sources or plan.base_checkpoint_id is None or plan.base_uri is None:
        return None
    started = time.perf_counter()
    services = owner.services
    assert owner.config.local_dir is not None
    local = LocalRescale(plan, owner.config.local_dir, services.trusted_local, services.readers)
    built = local.build(owner.lmdb_dir(plan))
    if built is None:
        return None
    base_uri = plan.base_uri
    read: list = []  # what was read from checkpoint storage: the handles of the key groups no copy held

    def fill(target: Target) -> None:
        backend = owner.keyed_backend(plan, target.table)
        local.merge_into(backend)
        keyed, changelog = missing_parts(plan, local.missing)
        read.extend((keyed, changelog))
        restore_keyed_state(backend, services.storage_of(base_uri), keyed, changelog, owner.context(plan))

    target, operator = owner.filled(plan, built, fill)
    keyed, changelog = read
    info = RecoveryInfo(recovery=RESCALED, restored_from=plan.base_checkpoint_id,
                        restore_bytes=bytes_to_read([*keyed, *changelog], plan.operator),
                        restore_ms=ms_since(started))
    stats = nonzero(replayed_change_sets=len(changelog), local_copy_bytes=local.copied_bytes,
                    local_moved_bytes=local.moved_bytes)
    return owner.recovered(plan, target, operator, info, stats=stats)
