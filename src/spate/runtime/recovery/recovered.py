"""What every rung of the recovery ladder builds with, and what it gives.

A rung works for the subtask that owns the state (:class:`StateOwner`: its place in the query, its config, its
worker's services). It fills a :class:`Target` (a table and, with the changelog on, the changelog over it) and
returns a :class:`RecoveredState`: the backends holding the state at the plan's base, what the subtask tags it
with, and how it got there (the :class:`~spate.checkpoint.ackinfo.RecoveryInfo` its ack carries), which the
subtask's :class:`~spate.runtime.recovery.live.LiveState` installs. Operator state, being small, is always read
from checkpoint storage (:meth:`StateOwner.operator_state`).
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from spate.changelog.state import ChangelogKeyedState
from spate.checkpoint.ackinfo import CAUGHT_UP, REUSED, RecoveryInfo
from spate.checkpoint.protocol import SubtaskPlan
from spate.runtime.batch import ProcessorFactory
from spate.runtime.localstate import local_state_dir
from spate.runtime.recovery.trust import EMPTY, Lineage
from spate.runtime.services import WorkerServices
from spate.runtime.subtask_config import SubtaskConfig
from spate.snapshot.handles import ChangeSetHandle, KeyedHandle
from spate.snapshot.operator import read_operator_piece
from spate.snapshot.verify import verify_handles
from spate.state.heap import HeapTable
from spate.state.keyed import KeyedStateBackend
from spate.state.lmdb_table import LmdbTable
from spate.state.operator import OperatorStateBackend, RestoredOperatorState
from spate.state.table import StateTable
from spate.state.timed import TimedTable

log = logging.getLogger(__name__)
LOCAL_COPY = (REUSED, CAUGHT_UP)  # kinds of recovery whose state is a local copy worth keeping on a failure


@dataclass
class Target:
    """The table a rung fills and, with the changelog on, the changelog that logs its every change (``table``
    is then the changelog's)."""

    table: StateTable
    clog: ChangelogKeyedState | None

    def discard(self, destroy: bool) -> None:
        """Close both after a failure (``destroy``: delete the table's data too)."""
        if self.clog is not None:
            self.clog.close()
        if destroy:
            self.table.destroy()
        else:
            self.table.close()


@dataclass
class RecoveredState:
    """A subtask's state at its plan's base, for its live state to install.

    Attributes:
        keyed: the keyed backend over the state table (wrapped by the changelog when it is on).
        operator: the operator-state backend with the subtask's restored pieces.
        clog: the changelog side of the keyed state (None: changelog off).
        tag: the checkpoint the state reflects (:data:`~spate.runtime.recovery.trust.EMPTY`: none yet).
        lineage: exactly which state of that checkpoint it is.
        handles: (checkpoint, keyed handles) that describe the state as it is, if a snapshot may reuse them.
        info: how it got there (carried by the ack).
        stats: figures for the ack's stats (``replayed_change_sets``, ``local_copy_bytes``,
            ``local_moved_bytes``), only those that are not 0.
        carried: the base's handles the state carries on without having read them: their files are checked
            (:meth:`check_carried`) once the processor opened on the state.
    """

    keyed: KeyedStateBackend
    operator: OperatorStateBackend
    clog: ChangelogKeyedState | None
    tag: int
    lineage: Lineage
    info: RecoveryInfo
    handles: tuple[int, list] | None = None
    stats: dict[str, int] = field(default_factory=dict)
    carried: list[KeyedHandle | ChangeSetHandle] = field(default_factory=list)

    def discard(self) -> None:
        """Close the state after a failure to install it: a local copy stays on disk, anything else goes."""
        Target(self.keyed.table, self.clog).discard(destroy=self.info.recovery not in LOCAL_COPY)

    def check_carried(self, plan: SubtaskPlan, owner: StateOwner) -> None:
        """Check the files of the handles the state carries on without having read them (once per process),
        and if one is damaged materialize the intact state now, so that no new checkpoint references the
        damaged file."""
        if not self.carried:
            return
        assert self.clog is not None and plan.base_uri is not None
        services = owner.services
        problems = verify_handles(services.storage_of(plan.base_uri), self.carried,
                                  services.verified_spans(plan.base_uri), owner.context(plan))
        if problems:
            log.warning("subtask %d: checkpoint files its local state references are damaged (%s); materializing "
                        "the local state anew instead of referencing them", owner.index, "; ".join(problems))
            self.clog.materialize_now(self.keyed, referenced_by=plan.checkpoint_id)


@dataclass(frozen=True)
class StateOwner:
    """Subtask ``index`` of ``parallelism``, whose state is recovered: its ``config``, its worker's
    ``services`` and the ``factory`` of the processor its live state opens; and the parts every rung builds
    that state with."""

    index: int
    parallelism: int
    config: SubtaskConfig
    services: WorkerServices
    factory: ProcessorFactory

    def context(self, plan: SubtaskPlan) -> str:
        """What errors and warnings about reading the base say the subtask was doing."""
        return f"restoring subtask {self.index} from checkpoint {plan.base_checkpoint_id}"

    def lmdb_dir(self, plan: SubtaskPlan) -> str:
        """The subtask's local lmdb directory."""
        assert self.config.local_dir
        return local_state_dir(self.config.local_dir, plan.query_id, self.index, self.parallelism)

    def keyed_backend(self, plan: SubtaskPlan, table: StateTable) -> KeyedStateBackend:
        cfg = self.config
        return KeyedStateBackend(table, plan.max_parallelism, plan.key_groups, allow_pickle=cfg.allow_pickle,
                                 key_types=cfg.key_types)

    def new_target(self, plan: SubtaskPlan) -> Target:
        """A new, empty table of the configured kind (an lmdb directory left there is deleted first)."""
        if self.config.table == "heap":
            return self.target(plan, HeapTable())
        path = self.lmdb_dir(plan)
        shutil.rmtree(path, ignore_errors=True)
        return self.target(plan, LmdbTable(path))

    def target(self, plan: SubtaskPlan, table: StateTable) -> Target:
        """``table`` (timed when profiling) and, with the changelog on, the changelog that logs its every change:
        then the table to use is the changelog's."""
        if self.config.profile:
            table = TimedTable(table)
        cfg = self.config.changelog
        if cfg is None:
            return Target(table, None)
        services = self.services
        clog = ChangelogKeyedState(table, services.storage, cfg, self.index, self.parallelism,
                                   services=services.changelog_services)
        return Target(clog.table, clog)

    def filled(self, plan: SubtaskPlan, table: StateTable,
               fill: Callable[[Target], None]) -> tuple[Target, dict[str, RestoredOperatorState]]:
        """``table`` as a :meth:`target` filled by ``fill``, and the operator state read; on a failure the target is
        discarded, its table destroyed. With the changelog on, its log goes on from the plan's handles."""
        target = self.target(plan, table)
        try:
            fill(target)
            operator = self.operator_state(plan)
        except BaseException:
            target.discard(destroy=True)
            raise
        if target.clog is not None:
            target.clog.restored(plan.keyed, plan.changelog)
        return target, operator

    def operator_state(self, plan: SubtaskPlan) -> dict[str, RestoredOperatorState]:
        """The pieces of operator state the coordinator assigned this subtask, read from the base."""
        restored: dict[str, RestoredOperatorState] = {}
        if plan.base_checkpoint_id is None:
            return restored
        assert plan.base_uri is not None
        storage = self.services.storage_of(plan.base_uri)
        for piece in plan.operator:
            elems = read_operator_piece(storage, piece, self.context(plan))
            state = restored.setdefault(piece.name, RestoredOperatorState(piece.mode, piece.serializer, []))
            state.encoded.extend(elems)
        return restored

    def recovered(self, plan: SubtaskPlan, target: Target, operator: dict[str, RestoredOperatorState],
                  info: RecoveryInfo, *, stats: dict[str, int] | None = None,
                  carried: list[KeyedHandle | ChangeSetHandle] | None = None,
                  handles: tuple[int, list] | None = None) -> RecoveredState:
        """A rung's result: fresh backends over the target's table (keyed state first, so the processor's open()
        is checked against the restored state registry) and ``operator``, tagged with the base."""
        tag = EMPTY if plan.base_checkpoint_id is None else plan.base_checkpoint_id
        return RecoveredState(
            self.keyed_backend(plan, target.table),
            OperatorStateBackend(operator, allow_pickle=self.config.allow_pickle), target.clog, tag,
            Lineage.of(plan.key_groups, plan.keyed, plan.changelog), info, handles, stats or {}, carried or [])


def nonzero(**figures: int) -> dict[str, int]:
    """The figures that are not 0 (a rung's stats)."""
    return {name: value for name, value in figures.items() if value}


def ms_since(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 3)


def restored_handles(plan: SubtaskPlan) -> tuple[int, list] | None:
    """After a restore of the plan's base: its keyed handles, which a snapshot may name again while the state is
    unchanged, if they describe the state (no changelog part to them; a checkpoint of this root, not a savepoint)."""
    reusable = (plan.base_checkpoint_id is not None and not plan.base_is_savepoint and not plan.changelog
                and plan.base_uri == plan.checkpoint_uri)  # handles of another root are never this root's
    return (plan.base_checkpoint_id, list(plan.keyed)) if reusable else None  # type: ignore[return-value]
