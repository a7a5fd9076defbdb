"""An online rescale on local disk: a new subtask's lmdb state built from the local copies the old subtasks left
on this machine, without copying them, reading checkpoint storage only for key groups no usable copy holds (the
recovery ladder's ``rescaled`` rung, :mod:`spate.runtime.recovery.local_rescale`).

When the parallelism changes between two batches of a running query, the old subtasks' lmdb tables are still on
the workers' disks, tagged with the base checkpoint and its lineage (:mod:`spate.runtime.recovery.trust`). The
plan names, per new subtask, the old subtasks whose key groups it takes over, largest overlap first, with the
fingerprint of the lineage each copy must carry and how many new subtasks take over some of its key groups
(:class:`~spate.checkpoint.protocol.RescaleSource`). Per source, in that order:

1. **Moved.** A copy that only this new subtask needs (scaling down) becomes its table: a rename.
2. **Linked.** Otherwise the copy's data file is hard-linked into the new subtask's directory as a *base* of
   an :class:`~spate.state.overlay.OverlayTable`, read for the key groups of the source that the new subtask
   owns; the subtask writes its own table over it, and folds the bases into it a bounded number of entries per
   later batch. A second source is linked too when it numbers its states as the table does.
3. **Merged.** A copy that numbers its states otherwise, or still reads from bases of an earlier rescale, is
   read entry by entry, state ids mapped by name.
4. **The rest** (a copy that is missing, from another attempt, or damaged): the caller restores those key
   groups from checkpoint storage (:func:`missing_parts`).

Taking over a copy costs O(1) in its size when moved or linked. Old copies are only read, never changed (they
are another parallelism's directories; a table directory is deleted and made anew, never rewritten in place,
before it is used at another checkpoint), so every new subtask of the rescale can use them, in any process on
the machine, and a failed rescaling batch can be retried from them (except a copy it moved: that one's key
groups are then read from checkpoint storage). They are deleted once a checkpoint at the new parallelism
completed; a base lives on as long as a table reads from it.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field

import lmdb

from spate.checkpoint.protocol import RescaleSource, SubtaskPlan
from spate.errors import SpateError
from spate.runtime.localstate import local_state_dir
from spate.snapshot.handles import ChangeSetHandle, KeyedHandle
from spate.snapshot.keyed import restore_key_groups
from spate.snapshot.lineage import LINEAGE_META, TAG_META, lineage_digest
from spate.state.keyed import KeyedStateBackend
from spate.state.lmdb_table import LmdbTable, ReadOnlyTable, held_for_reading, move_table
from spate.state.overlay import (
    BASES_META,
    Base,
    OverlayTable,
    OverlayView,
    SharedReaders,
    listed_bases,
    open_local_table,
)
from spate.state.registries import compatible, registry, union

log = logging.getLogger(__name__)
FOLD_PER_BATCH = 2_500  # entries of a rescaled table's bases folded into it after each later batch


@dataclass
class LocalRescale:
    """Builds subtask ``plan.index``'s table at the new parallelism from the local copies under ``local_dir``.

    ``trusted``: table directories this worker wrote or verified (their digest is not checked again)."""

    plan: SubtaskPlan
    local_dir: str
    trusted: set[str]
    readers: SharedReaders
    copied_bytes: int = 0  # copied entry by entry from local copies
    moved_bytes: int = 0  # taken over without a copy: moved, or hard-linked as a base
    missing: list[range] = field(default_factory=list)  # key groups to restore from checkpoint storage
    _used: list[RescaleSource] = field(default_factory=list)  # sources the table was built on

    def build(self, target: str) -> LmdbTable | OverlayTable | None:
        """The new subtask's table in ``target``: the first usable source moved there (if no other new subtask
        needs it) or hard-linked as a base, then every other source with the same state ids hard-linked as a
        base; None if no source is usable (then everything comes from checkpoint storage)."""
        table = None
        for source in self.plan.rescale_sources:
            table = self._move(source, target) if source.consumers == 1 else self._link(source, target, None)
            if table is not None:
                self._used.append(source)
                break
        if table is None:
            return None
        try:
            for source in self.plan.rescale_sources:
                if source not in self._used:
                    linked = self._link(source, target, table)
                    if linked is not None:
                        table = linked
                        self._used.append(source)
            table.commit()
        except BaseException:
            table.destroy()
            raise
        return table

    def merge_into(self, backend: KeyedStateBackend) -> None:
        """Add the key groups of the sources :meth:`build` could not link (other state ids) from their local
        copies, entry by entry, to ``backend`` (over the built table); those no usable copy holds end up in
        :attr:`missing`."""
        for source in self.plan.rescale_sources:
            if source in self._used:
                continue
            wanted = _overlap(source.key_groups, self.plan.key_groups)
            if not self._merge(source, wanted, backend):
                self.missing.append(wanted)

    # -- one source -------------------------------------------------------------------------------------
    def _path(self, source: RescaleSource) -> str:
        assert self.plan.base_parallelism is not None
        return local_state_dir(self.local_dir, self.plan.query_id, source.index, self.plan.base_parallelism)

    def _move(self, source: RescaleSource, target: str) -> LmdbTable | OverlayTable | None:
        """The source's table, moved to ``target``: no other new subtask needs any of it, so it holds only key
        groups of the new subtask (a table only ever holds its own: bases are read within their range)."""
        path = self._path(source)
        try:
            taken = move_table(path, target)
            table = open_local_table(target, self.readers)
        except (FileNotFoundError, SpateError, lmdb.Error) as e:
            self._unusable(source, f"not moved ({e})")
            return None
        problem = self._problem(source, table.committed_meta(TAG_META), table.committed_meta(LINEAGE_META),
                                path, table.verify)
        if problem is not None:
            self._unusable(source, problem)
            table.destroy()
            return None
        self.moved_bytes += taken
        return table

    def _link(self, source: RescaleSource, target: str,
              table: LmdbTable | OverlayTable | None) -> LmdbTable | OverlayTable | None:
        """``table`` (None: a new, empty one in ``target``) with the source's table hard-linked into ``target``
        as the base of the key groups it owns of the new subtask's; None if the source is not usable, or (with
        ``table``) numbers its states differently."""
        path, name = self._path(source), f"base-{source.index}-{self.plan.base_parallelism}.mdb"
        try:
            with held_for_reading(path):
                reader = self.readers.open(path)
                try:
                    problem = self._problem(source, reader.meta(TAG_META), reader.meta(LINEAGE_META), path,
                                            reader.verify) or _layered(reader)
                    states = registry(reader.meta("states"))
                finally:
                    self.readers.release(reader)
                if problem is not None:
                    self._unusable(source, problem)
                    return None
                if table is not None and not compatible(registry(table.get_meta("states")), states):
                    return None  # merged entry by entry instead
                if table is None:
                    shutil.rmtree(target, ignore_errors=True)
                    os.makedirs(target)
                os.link(os.path.join(path, "data.mdb"), os.path.join(target, name))
        except (FileNotFoundError, SpateError, OSError, lmdb.Error) as e:
            self._unusable(source, f"not linked ({e})")
            return None
        try:
            base = self.readers.open(os.path.join(target, name), file=True)
        except (SpateError, lmdb.Error) as e:
            os.unlink(os.path.join(target, name))
            self._unusable(source, f"not linked ({e})")
            return None
        if table is None:
            table = LmdbTable(target)
        overlay = table if isinstance(table, OverlayTable) else OverlayTable(table, [], self.readers)
        wanted = _overlap(source.key_groups, self.plan.key_groups)
        # the entries it serves are known when it is all of the old table (else they would have to be counted)
        served = base.entry_count() if wanted == source.key_groups else None
        overlay.add_base(Base(name, wanted.start, wanted.stop, base, served=served),
                         union(registry(overlay.get_meta("states")), states))
        self.moved_bytes += base.data_bytes()
        return overlay

    def _merge(self, source: RescaleSource, wanted: range, backend: KeyedStateBackend) -> bool:
        path = self._path(source)
        try:
            with held_for_reading(path):
                reader = self.readers.open(path)
                bases: list[Base] = []
                try:
                    bases = [Base(name, start, stop, self.readers.open(os.path.join(path, name), file=True))
                             for name, start, stop, *_ in listed_bases(reader.meta(BASES_META))]
                    problem = self._problem(source, reader.meta(TAG_META), reader.meta(LINEAGE_META), path,
                                            lambda: reader.verify() or _first(b.table.verify() for b in bases))
                    if problem is not None:
                        self._unusable(source, problem)
                        return False
                    states = tuple(registry(reader.meta("states")))
                    view = OverlayView(reader, bases)  # a copy still reading from an earlier rescale's bases
                    restore_key_groups(backend, states, self._counted(_groups(view, wanted)))
                finally:
                    for b in bases:
                        self.readers.release(b.table)
                    self.readers.release(reader)
        except (FileNotFoundError, SpateError, lmdb.Error) as e:  # before anything of it reached the backend
            self._unusable(source, f"not read ({e})")
            return False
        return True

    def _counted(self, groups: Iterator[tuple[int, list[bytes]]]) -> Iterator[tuple[int, list[bytes]]]:
        for kg, flat in groups:
            self.copied_bytes += sum(map(len, flat))
            yield kg, flat

    def _problem(self, source: RescaleSource, tag: bytes | None, lineage: bytes | None, path: str,
                 verify: object) -> str | None:
        """Why a copy cannot stand for the source's state at the base checkpoint (None: it can)."""
        if tag is None or tag != str(self.plan.base_checkpoint_id).encode():
            return f"it is not the state of checkpoint {self.plan.base_checkpoint_id}"
        if lineage is None or lineage_digest(lineage) != source.lineage:
            return "it is not the state the checkpoint's ack described (another attempt's)"
        if path not in self.trusted:
            problem = verify()  # type: ignore[operator]
            if problem is not None:
                return f"failed its integrity check: {problem}"
            self.trusted.add(path)
        return None

    def _unusable(self, source: RescaleSource, why: str) -> None:
        log.info("subtask %d: the local copy of old subtask %d is not used: %s; its key groups are read from "
                 "checkpoint storage", self.plan.index, source.index, why)


def missing_parts(plan: SubtaskPlan, missing: list[range]) -> tuple[list[KeyedHandle], list[ChangeSetHandle]]:
    """The parts of the plan's handles holding the ``missing`` key groups (what checkpoint storage must give)."""
    keyed = [k for r in missing for h in plan.keyed if (k := h.intersect(r)) is not None]
    changelog = [c for r in missing for h in plan.changelog if (c := h.intersect(r)) is not None]
    return keyed, changelog


def _layered(reader: ReadOnlyTable) -> str | None:
    """A copy that still reads from bases of its own (an earlier rescale not folded yet) cannot be a base."""
    return "it still reads from an earlier rescale's copies" if reader.meta(BASES_META) else None


def _first(problems: Iterator[str | None]) -> str | None:
    return next((p for p in problems if p is not None), None)


def _overlap(a: range, b: range) -> range:
    return range(max(a.start, b.start), min(a.stop, b.stop))


def _groups(reader: OverlayView, key_groups: range) -> Iterator[tuple[int, list[bytes]]]:
    for kg in key_groups:
        flat = reader.key_group_flat(kg)
        if flat:
            yield kg, flat
