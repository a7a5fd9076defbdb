"""The recovery ladder: bringing a subtask's state to its plan's base checkpoint when the state it holds is not
there.

:class:`StateRecovery` tries, in order, the cheapest way that is trusted (:mod:`spate.runtime.recovery` says
when a copy is):

1. with the lmdb table, the subtask's own local copy of a checkpoint of the base's lineage, caught up by
   replaying the change sets since (``reused`` or ``caught_up``);
2. at a new parallelism, the old subtasks' local copies on this machine, reading checkpoint storage only for key
   groups no usable copy holds (``rescaled``, :mod:`spate.runtime.rescale`);
3. checkpoint storage: keyed state by key-group intersection, operator state by the FLIP-8 pieces the
   coordinator assigned (``restored``, or ``new`` without a base).

Operator state, being small, is always read from checkpoint storage. The result is one
:class:`RecoveredState`: the backends holding the state, what the subtask tags it with, and how it got there
(the :class:`~spate.checkpoint.ackinfo.RecoveryInfo` its ack carries).
"""

from __future__ import annotations

import functools
import logging
import shutil
import time
from dataclasses import dataclass, field

import lmdb

from spate.changelog.restore import restore_keyed_state
from spate.changelog.state import ChangelogKeyedState
from spate.checkpoint.ackinfo import CAUGHT_UP, RESCALED, REUSED, RecoveryInfo
from spate.checkpoint.protocol import SubtaskPlan
from spate.errors import SpateError
from spate.runtime.localstate import local_state_dir
from spate.runtime.recovery import (
    EMPTY,
    Lineage,
    bytes_to_read,
    catch_up_start,
    full_restore,
    mark_dirty,
    read_tag,
    recovery_kind,
    write_tag,
)
from spate.runtime.rescale import LocalRescale, missing_parts
from spate.runtime.services import WorkerServices
from spate.runtime.subtask_config import SubtaskConfig
from spate.snapshot.handles import ChangeSetHandle, KeyGroupsHandle
from spate.snapshot.operator import read_operator_piece
from spate.snapshot.verify import verify_handles
from spate.state.heap import HeapTable
from spate.state.keyed import KeyedStateBackend
from spate.state.lmdb_table import LmdbTable
from spate.state.operator import OperatorStateBackend, RestoredOperatorState
from spate.state.overlay import OverlayTable, open_local_table
from spate.state.table import StateTable
from spate.state.timed import TimedTable

log = logging.getLogger(__name__)
LOCAL_COPY = (REUSED, CAUGHT_UP)  # kinds of recovery whose state is a local copy worth keeping on a failure


@dataclass
class RecoveredState:
    """A subtask's state at its plan's base, for the subtask to install.

    Attributes:
        keyed: the keyed backend over the state table (wrapped by the changelog when it is on).
        operator: the operator-state backend with the subtask's restored pieces.
        clog: the changelog side of the keyed state (None: changelog off).
        tag: the checkpoint the state reflects (:data:`~spate.runtime.recovery.EMPTY`: none yet).
        lineage: exactly which state of that checkpoint it is.
        handles: (checkpoint, keyed handles) that describe the state as it is, if a snapshot may reuse them.
        info: how it got there (carried by the ack).
        stats: figures for the ack's stats (``replayed_change_sets``, ``local_copy_bytes``,
            ``local_moved_bytes``), only those that are not 0.
        carried: the base's handles the state carries on without having read them: their files are checked
            (:meth:`StateRecovery.check_carried`) once the processor opened on the state.
    """

    keyed: KeyedStateBackend
    operator: OperatorStateBackend
    clog: ChangelogKeyedState | None
    tag: int
    lineage: Lineage
    info: RecoveryInfo
    handles: tuple[int, list] | None = None
    stats: dict[str, int] = field(default_factory=dict)
    carried: list[KeyGroupsHandle | ChangeSetHandle] = field(default_factory=list)

    def discard(self) -> None:
        """Close the state after a failure to install it: a local copy stays on disk, anything else goes."""
        _discard(self.keyed.table, self.clog, destroy=self.info.recovery not in LOCAL_COPY)


def _discard(table: StateTable, clog: ChangelogKeyedState | None, destroy: bool) -> None:
    if clog is not None:
        clog.close()
    if destroy:
        table.destroy()
    else:
        table.close()


def _nonzero(**figures: int) -> dict[str, int]:
    return {name: value for name, value in figures.items() if value}


class StateRecovery:
    """Brings the state of subtask ``index`` of ``parallelism`` to a plan's base (see the module), with the
    subtask's ``config`` and its worker's ``services``."""

    def __init__(self, index: int, parallelism: int, config: SubtaskConfig, services: WorkerServices) -> None:
        self.index, self.parallelism = index, parallelism
        self.config = config
        self.services = services

    def recover(self, plan: SubtaskPlan) -> RecoveredState:
        """The state at the plan's base, by the cheapest trusted way."""
        if self.config.table == "lmdb":
            state = self.from_local_copy(plan) or self.from_old_subtasks_copies(plan)
            if state is not None:
                return state
        return self.restore(plan)

    # -- 1. the subtask's own local copy ------------------------------------------------------------------
    def from_local_copy(self, plan: SubtaskPlan) -> RecoveredState | None:
        """Take over this subtask's lmdb directory if its tag shows the state of a completed checkpoint that
        leads to the plan's base, replaying the change sets since: keyed state is not downloaded. Otherwise
        delete it (None)."""
        started = time.perf_counter()
        found = self._usable_local_copy(plan)
        if found is None:
            return None
        local, copy_at, start = found
        assert plan.base_checkpoint_id is not None
        table, clog = self._with_changelog(plan, local)
        replay = plan.changelog[start:]
        try:
            if replay:
                self._catch_up(plan, table, replay)
            operator = self._read_operator_state(plan)
        except BaseException:
            _discard(table, clog, destroy=False)  # not left locked by this process: a retry opens it afresh
            raise
        if clog is not None:
            clog.restored(plan.keyed, plan.changelog)
        kind = recovery_kind(copy_at, start, plan)
        caught_up = kind == CAUGHT_UP
        info = RecoveryInfo(recovery=kind, restored_from=plan.base_checkpoint_id if caught_up else None,
                            caught_up_from=copy_at if caught_up else None,
                            restore_bytes=bytes_to_read(replay, plan.operator), restore_ms=_ms_since(started))
        carried: list[KeyGroupsHandle | ChangeSetHandle] = (
            [*plan.keyed, *plan.changelog[:start]] if clog is not None else [])
        return self._recovered(plan, table, clog, operator, info, _nonzero(replayed_change_sets=len(replay)),
                               carried)

    def _usable_local_copy(self, plan: SubtaskPlan) -> tuple[LmdbTable | OverlayTable, int, int] | None:
        """(table, the checkpoint it is at, the index of the plan's first change set it lacks) of this
        subtask's local copy, if it can be caught up to the base; an unusable copy is deleted."""
        path = self._lmdb_dir(plan)
        try:
            table = open_local_table(path, self.services.readers)
        except FileNotFoundError:  # a base it reads from is gone
            shutil.rmtree(path, ignore_errors=True)
            return None
        except (SpateError, lmdb.Error) as e:  # e.g. a base it reads from cannot be opened in this process
            log.info("subtask %d: local state not reused: %s", self.index, e)
            return None
        inner = table.inner if isinstance(table, OverlayTable) else table
        if inner.linked_elsewhere():  # a stale attempt at the old parallelism: a rescaled subtask reads this file
            table.destroy()
            return None
        tag = read_tag(table)
        start = catch_up_start(*tag, plan) if tag is not None else None
        if tag is None or start is None or not self._intact(table):
            table.destroy()
            return None
        return table, tag[0], start

    def _intact(self, table: LmdbTable | OverlayTable) -> bool:
        """Whether the local table still holds exactly what it held at its last commit. Checked once per
        process: the check reads the whole table, and on Spark a subtask's table moves between the Python
        workers of an executor every few batches (each keeps the digest up to date as it writes)."""
        if table.path in self.services.trusted_local:
            return True
        problem = table.verify()
        if problem is not None:
            log.warning("subtask %d: local state %s failed its integrity check: %s; discarding it and restoring "
                        "from checkpoint storage", self.index, table.path, problem)
            return False
        self.services.trusted_local.add(table.path)
        return True

    def _catch_up(self, plan: SubtaskPlan, table: StateTable, change_sets: list[ChangeSetHandle]) -> None:
        """Replay ``change_sets`` (the base's change sets the local copy lacks) into it. Untagged meanwhile: a
        copy left half caught up is never trusted."""
        assert plan.base_checkpoint_id is not None and plan.base_uri is not None
        mark_dirty(table)
        restore_keyed_state(self._keyed_backend(plan, table), self.services.storage_of(plan.base_uri), [],
                            change_sets, self._context(plan))
        write_tag(table, plan.base_checkpoint_id, Lineage.of(plan.key_groups, plan.keyed, plan.changelog))

    def check_carried(self, plan: SubtaskPlan, state: RecoveredState) -> None:
        """Check the files of the handles the state carries on without having read them (once per process),
        and if one is damaged materialize the intact state now, so that no new checkpoint references the
        damaged file."""
        if not state.carried:
            return
        assert state.clog is not None and plan.base_uri is not None
        problems = verify_handles(self.services.storage_of(plan.base_uri), state.carried,
                                  self.services.verified_spans(plan.base_uri), self._context(plan))
        if problems:
            log.warning("subtask %d: checkpoint files its local state references are damaged (%s); materializing "
                        "the local state anew instead of referencing them", self.index, "; ".join(problems))
            state.clog.materialize_now(state.keyed, referenced_by=plan.checkpoint_id)

    # -- 2. the old subtasks' local copies (online rescale) -----------------------------------------------
    def from_old_subtasks_copies(self, plan: SubtaskPlan) -> RecoveredState | None:
        """At a new parallelism: build the state from the old subtasks' local copies on this machine, reading
        checkpoint storage only for key groups no usable copy holds. None: no copy was usable."""
        if not plan.rescale_sources or plan.base_checkpoint_id is None or plan.base_uri is None:
            return None
        started = time.perf_counter()
        assert self.config.local_dir is not None
        rescale = LocalRescale(plan, self.config.local_dir, self.services.trusted_local, self.services.readers)
        built = rescale.build(self._lmdb_dir(plan))
        if built is None:
            return None
        table, clog = self._with_changelog(plan, built)
        try:
            backend = self._keyed_backend(plan, table)
            rescale.merge_into(backend)
            keyed, changelog = missing_parts(plan, rescale.missing)
            restore_keyed_state(backend, self.services.storage_of(plan.base_uri), keyed, changelog,
                                self._context(plan))
            operator = self._read_operator_state(plan)
        except BaseException:
            _discard(table, clog, destroy=True)
            raise
        if clog is not None:
            clog.restored(plan.keyed, plan.changelog)
        info = RecoveryInfo(recovery=RESCALED, restored_from=plan.base_checkpoint_id,
                            restore_bytes=bytes_to_read([*keyed, *changelog], plan.operator),
                            restore_ms=_ms_since(started))
        stats = _nonzero(replayed_change_sets=len(changelog), local_copy_bytes=rescale.copied_bytes,
                         local_moved_bytes=rescale.moved_bytes)
        return self._recovered(plan, table, clog, operator, info, stats)

    # -- 3. checkpoint storage ----------------------------------------------------------------------------
    def restore(self, plan: SubtaskPlan) -> RecoveredState:
        """Everything the plan names, read from checkpoint storage, into a new table (empty without a base)."""
        table, clog = self._new_table(plan)
        started = time.perf_counter()
        try:
            operator = self._read_operator_state(plan)
            if plan.base_checkpoint_id is not None:
                self._restore_keyed_state(plan, table, clog)
        except BaseException:
            _discard(table, clog, destroy=True)
            raise
        # the restored handles describe the state only if there is no changelog part to them
        reusable = (plan.base_checkpoint_id is not None and not plan.base_is_savepoint and not plan.changelog
                    and plan.base_uri == plan.checkpoint_uri)  # handles of another root are never this root's
        handles = (plan.base_checkpoint_id, list(plan.keyed)) if reusable else None
        return self._recovered(plan, table, clog, operator, full_restore(plan, _ms_since(started)),
                               _nonzero(replayed_change_sets=len(plan.changelog)),
                               handles=handles)  # type: ignore[arg-type]

    def _restore_keyed_state(self, plan: SubtaskPlan, table: StateTable, clog: ChangelogKeyedState | None) -> None:
        assert plan.base_uri is not None
        backend = self._keyed_backend(plan, table)
        restore_keyed_state(backend, self.services.storage_of(plan.base_uri), plan.keyed, plan.changelog,
                            self._context(plan))
        if clog is None:
            return
        if plan.base_uri == plan.checkpoint_uri:
            clog.restored(plan.keyed, plan.changelog)
        else:  # a savepoint elsewhere: this root must hold its own copy before the first checkpoint
            clog.materialize_now(backend)

    # -- the parts ----------------------------------------------------------------------------------------
    def _recovered(self, plan: SubtaskPlan, table: StateTable, clog: ChangelogKeyedState | None,
                   operator: dict[str, RestoredOperatorState], info: RecoveryInfo, stats: dict[str, int] | None = None,
                   carried: list[KeyGroupsHandle | ChangeSetHandle] | None = None,
                   handles: tuple[int, list] | None = None) -> RecoveredState:
        """The result: fresh backends over ``table`` (keyed state first, so the processor's open() is checked
        against the restored state registry) and ``operator``, tagged with the base."""
        tag = EMPTY if plan.base_checkpoint_id is None else plan.base_checkpoint_id
        return RecoveredState(
            self._keyed_backend(plan, table), OperatorStateBackend(operator, allow_pickle=self.config.allow_pickle),
            clog, tag, Lineage.of(plan.key_groups, plan.keyed, plan.changelog), info, handles, stats or {},
            carried or [])

    def _read_operator_state(self, plan: SubtaskPlan) -> dict[str, RestoredOperatorState]:
        restored: dict[str, RestoredOperatorState] = {}
        if plan.base_checkpoint_id is None:
            return restored
        assert plan.base_uri is not None
        storage = self.services.storage_of(plan.base_uri)
        for piece in plan.operator:
            elems = read_operator_piece(storage, piece, self._context(plan))
            state = restored.setdefault(piece.name, RestoredOperatorState(piece.mode, piece.serializer, []))
            state.encoded.extend(elems)
        return restored

    def _keyed_backend(self, plan: SubtaskPlan, table: StateTable) -> KeyedStateBackend:
        cfg = self.config
        return KeyedStateBackend(table, plan.max_parallelism, plan.key_groups, allow_pickle=cfg.allow_pickle,
                                 key_types=cfg.key_types)

    def _context(self, plan: SubtaskPlan) -> str:
        return f"restoring subtask {self.index} from checkpoint {plan.base_checkpoint_id}"

    def _lmdb_dir(self, plan: SubtaskPlan) -> str:
        assert self.config.local_dir
        return local_state_dir(self.config.local_dir, plan.query_id, self.index, self.parallelism)

    def _new_table(self, plan: SubtaskPlan) -> tuple[StateTable, ChangelogKeyedState | None]:
        if self.config.table == "heap":
            return self._with_changelog(plan, HeapTable())
        path = self._lmdb_dir(plan)
        shutil.rmtree(path, ignore_errors=True)
        return self._with_changelog(plan, LmdbTable(path))

    def _with_changelog(self, plan: SubtaskPlan, table: StateTable) -> tuple[StateTable, ChangelogKeyedState | None]:
        """``table`` (timed when profiling) and, with the changelog on, the changelog that logs its every change:
        then the table to use is the changelog's."""
        if self.config.profile:
            table = TimedTable(table)
        cfg = self.config.changelog
        if cfg is None:
            return table, None
        manager, materialized = self.services.merging, None
        if manager is not None:
            materialized = functools.partial(manager.shared_writer, self.index, self.parallelism, alone=True)
        clog = ChangelogKeyedState(table, self.services.storage, cfg, self.index, self.parallelism,
                                   self.services.scheduler, materialized, self.services.materializers)
        return clog.table, clog


def _ms_since(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 3)
