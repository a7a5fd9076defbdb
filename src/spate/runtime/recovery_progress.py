"""Progress of the batches that recover state, which can take long: a restart restoring from checkpoint storage,
an online rescale building new subtasks' state.

Before such a batch runs its subtasks, one line says what is about to happen (a restart or a rescale, from which
checkpoint, at which parallelism); once its checkpoint completed, one line says how each subtask got its state
and what that cost. Lines go to standard error on a terminal (quiet when it is piped, unless asked) and always
to the log at INFO. Batches that run on their live state print nothing.
"""

from __future__ import annotations

import logging
import sys
from collections import Counter

from spate.checkpoint.ackinfo import CAUGHT_UP, RESCALED, RESTORED
from spate.checkpoint.metadata import CheckpointMetadata
from spate.checkpoint.protocol import SubtaskPlan
from spate.report import human_bytes

log = logging.getLogger(__name__)
RECOVERING = frozenset({RESTORED, RESCALED, CAUGHT_UP})


class RecoveryProgress:
    """Says when a query's batches recover state (one instance per query driver).

    Args:
        enabled: write the lines to standard error; None: only when standard error is a terminal.
    """

    def __init__(self, enabled: bool | None = None) -> None:
        self._enabled = enabled
        self._first = True  # the driver's first batch: a restart recovers whatever the base holds

    def before(self, batch_id: int, plans: list[SubtaskPlan]) -> None:
        """Before batch ``batch_id`` runs its subtasks on ``plans``: announce it if it recovers state."""
        first, self._first = self._first, False
        base = plans[0].base_checkpoint_id if plans else None
        if base is None:
            return
        old = plans[0].base_parallelism
        if old is not None and old != len(plans):
            self._say(f"batch {batch_id}: rescaling {old} → {len(plans)} subtasks from checkpoint {base}, "
                      "from local copies where they are intact, else checkpoint storage ...")
        elif first:
            self._say(f"batch {batch_id}: recovering the state of checkpoint {base} on {len(plans)} subtasks, "
                      "from local copies where they are intact, else checkpoint storage ...")

    def after(self, meta: CheckpointMetadata) -> None:
        """Once batch ``meta.checkpoint_id`` completed: how its subtasks got their state, if any recovered it."""
        kinds = Counter(st.recovery for st in meta.subtasks)
        if not RECOVERING & kinds.keys():
            return
        read = sum(st.restore_bytes for st in meta.subtasks)
        slowest = max(st.restore_ms for st in meta.subtasks)
        how = ", ".join(f"{n} {kind}" for kind, n in sorted(kinds.items()))
        self._say(f"batch {meta.checkpoint_id}: state recovered ({how}): {human_bytes(read)} read from checkpoint "
                  f"storage, the slowest subtask took {slowest / 1000:.1f} s")

    def _say(self, line: str) -> None:
        log.info("%s", line)
        if self._enabled or (self._enabled is None and sys.stderr.isatty()):
            print(f"spate: {line}", file=sys.stderr, flush=True)


__all__ = ["RecoveryProgress"]
