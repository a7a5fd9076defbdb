"""A subtask's live state: one object, and the operations that change it.

The live state is the keyed backend over the subtask's table, the operator-state backend, the changelog side
of the keyed state (changelog on), the processor open on them, and what is known about the state: the
checkpoint it reflects (its tag) and exactly which state of that checkpoint it is (its
:class:`~spate.runtime.recovery.trust.Lineage`), the keyed handles a snapshot may name again, and how the
state got to the current plan's base (:class:`~spate.checkpoint.ackinfo.RecoveryInfo` and the figures for the
ack's stats).

Its life: installed from a rung of the recovery ladder (:meth:`LiveState.install`) or reused as it is
(:meth:`LiveState.reuse`), marked dirty at the start of a batch (:meth:`LiveState.begin`), tagged with the
batch's checkpoint once the snapshot is durable (:meth:`LiveState.tag_as`), dropped when it is not at a plan's
base (:meth:`LiveState.drop`), closed with the subtask (:meth:`LiveState.close`). Between batches an lmdb table
may be released to another process of the worker (:meth:`LiveState.release`) and taken back
(:meth:`LiveState.take_back`).
"""

from __future__ import annotations

from spate.changelog.state import ChangelogKeyedState
from spate.checkpoint.ackinfo import RESCALED, REUSED, RecoveryInfo
from spate.checkpoint.protocol import SubtaskPlan
from spate.runtime.batch import AnyProcessor
from spate.runtime.processor import Context
from spate.runtime.recovery.recovered import RecoveredState, StateOwner
from spate.runtime.recovery.trust import Lineage, live_at_base, mark_dirty, write_tag
from spate.runtime.snapshot_files import Relocator
from spate.runtime.tables import table_under
from spate.state.keyed import KeyedStateBackend
from spate.state.lmdb_table import LmdbTable
from spate.state.operator import OperatorStateBackend
from spate.state.overlay import OverlayTable
from spate.state.table import StateTable


class LiveState:
    """The live state of ``owner`` (see the module). Empty (no backends) until a recovery installs state."""

    def __init__(self, owner: StateOwner) -> None:
        self.owner = owner
        self.keyed: KeyedStateBackend | None = None
        self.operator: OperatorStateBackend | None = None
        self.clog: ChangelogKeyedState | None = None
        self.processor: AnyProcessor | None = None
        self.ctx: Context | None = None
        self.tag: int | None = None  # checkpoint the live state reflects; None = unknown/dirty
        self.lineage: Lineage | None = None  # exactly which state that is (see spate.runtime.recovery.trust)
        self.handles: tuple[int, list] | None = None  # (checkpoint, keyed handles) equal to the live state
        self.info = RecoveryInfo()  # how the state of the current batch got to its plan's base
        self.stats: dict[str, int] = {}  # and the figures of that for the ack's stats

    @property
    def table(self) -> StateTable | None:
        return self.keyed.table if self.keyed is not None else None

    @property
    def lmdb(self) -> LmdbTable | None:
        return table_under(self.table, LmdbTable)

    # -- the reused rung, and the state another rung recovered ---------------------------------------------
    def take_back(self) -> None:
        """Hold the lmdb table (if any) against other processes again, before it is checked."""
        lmdb = self.lmdb
        if lmdb is not None:
            lmdb.lock()

    def release(self) -> None:
        """Between batches: let another process (another Spark Python worker) take the lmdb table."""
        lmdb = self.lmdb
        if lmdb is not None:
            lmdb.unlock()

    def at_base(self, plan: SubtaskPlan) -> bool:
        """Whether the live state is exactly the plan's base (:func:`~spate.runtime.recovery.trust.live_at_base`)."""
        return self.keyed is not None and live_at_base(self.tag, self.lineage, self.lmdb, plan)

    def reuse(self, plan: SubtaskPlan) -> None:
        """Go on from the plan's base as it is (``reused``): the changelog learns the base completed."""
        self.info, self.stats = RecoveryInfo(recovery=REUSED), {}
        if self.clog is not None and plan.base_checkpoint_id is not None:
            self.clog.checkpoint_completed(plan.base_checkpoint_id)

    def drop(self, plan: SubtaskPlan) -> None:
        """Give the state up, not being at the plan's base: an lmdb copy stays on disk for the ladder to find
        (e.g. another process moved it on: it catches up), anything else is destroyed."""
        destroy = self.lmdb is None
        if self.clog is not None and plan.base_checkpoint_id is not None:
            # checkpoints this subtask took after the base were aborted: let close() delete their changes
            self.clog.abandon_after(plan.base_checkpoint_id)
        if self.keyed is not None:
            self.close(destroy=destroy)

    def install(self, plan: SubtaskPlan, state: RecoveredState) -> None:
        """Take over the recovered state and open a new processor on it. On a failure both are closed (a local
        copy stays on disk, anything else goes) and this live state is empty again."""
        keyed = self.keyed = state.keyed
        self.operator, self.clog = state.operator, state.clog
        self.tag, self.lineage, self.handles = state.tag, state.lineage, state.handles
        self.info, self.stats = state.info, state.stats
        owner = self.owner
        self.ctx = Context(keyed, self.operator, owner.index, owner.parallelism, plan.max_parallelism)
        try:
            self.processor = owner.factory()
            self.processor.open(self.ctx)
            keyed.dirty = False  # the recovered handles (if any) still describe the state
            # after open(): a materialization it triggers includes the states open() registers. Inside the try:
            # state whose carried files were not checked must never count as being at the base
            state.check_carried(plan, owner)
        except BaseException:
            self._close_after_failed_install(state)
            raise

    def _close_after_failed_install(self, state: RecoveredState) -> None:
        if self.processor is not None:
            self.processor.close()
        state.discard()
        self._forget()

    # -- the batch -----------------------------------------------------------------------------------------
    def begin(self, plan: SubtaskPlan) -> None:
        """The plan's batch starts changing the state: from here on it equals no checkpoint until the next
        snapshot tags it (committed as dirty, so no other process trusts it meanwhile)."""
        assert self.keyed is not None
        mark_dirty(self.keyed.table)  # first: the changelog's begin may offer a materialization the table as is
        if self.clog is not None:
            self.clog.begin(plan.checkpoint_id)
        self.tag = None

    def may_reuse_handles(self, plan: SubtaskPlan, fix: Relocator | None) -> bool:
        """Whether the keyed handles of the base still describe the state, so the snapshot may name them again
        (those in another subtask's directory, after a rescale, copied by ``fix``: a byte copy, not the state
        written again). Only what the coordinator recorded for this subtask in the base checkpoint: an attempt
        whose ack was rejected must not reuse its (deleted) files."""
        keyed, handles = self.keyed, self.handles
        assert keyed is not None
        return (self.clog is None and handles is not None and handles[0] == plan.base_checkpoint_id
                and handles[1] == plan.keyed and not keyed.dirty and not keyed.has_ttl_state()
                and (fix is None or all(map(fix.keeps, plan.keyed))))

    def tag_as(self, plan: SubtaskPlan, keyed_handles: list, changelog: list) -> None:
        """The live state is the plan's checkpoint now, exactly as the ack describes it."""
        keyed = self.keyed
        assert keyed is not None
        self.lineage = Lineage.of(plan.key_groups, keyed_handles, changelog)
        write_tag(keyed.table, plan.checkpoint_id, self.lineage)
        keyed.dirty = False
        self.tag = plan.checkpoint_id
        self.handles = (plan.checkpoint_id, keyed_handles)

    def after_snapshot(self) -> dict[str, int]:
        """With an lmdb table: trust it in this process (it wrote it), and fold some of a rescaled table's bases
        into it, but not in the rescaling batch (it has enough to do). Returns the stats of that."""
        lmdb = self.lmdb
        if lmdb is None:
            return {}
        self.owner.services.trusted_local.add(lmdb.path)
        overlay = table_under(self.table, OverlayTable)
        if overlay is None or self.info.recovery == RESCALED:
            return {}
        folded = overlay.fold(self.owner.config.fold_per_batch)
        return {"folded_entries": folded} if folded else {}

    def close(self, destroy: bool = False) -> None:
        """Close the processor and the table (``destroy`` also deletes local state); the live state is empty."""
        if self.processor is not None:
            self.processor.close()
        if self.clog is not None:
            self.clog.close()
            self.clog = None
        if self.keyed is not None:
            if destroy:
                self.keyed.table.destroy()
            else:
                self.keyed.table.close()
        self._forget()

    def _forget(self) -> None:
        self.keyed = self.operator = self.processor = self.ctx = self.clog = None
        self.tag, self.handles, self.lineage = None, None, None
