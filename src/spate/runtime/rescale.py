"""An online rescale on local disk: a new subtask's lmdb state built from the local copies the old subtasks left
on this machine, reading checkpoint storage only for key groups no usable copy holds.

When the parallelism changes between two batches of a running query, the old subtasks' lmdb tables are still on
the workers' disks, tagged with the base checkpoint and its lineage (:mod:`spate.runtime.recovery`). The plan
names, per new subtask, the old subtasks whose key groups it takes over, largest overlap first, with the
fingerprint of the lineage each copy must carry (:class:`~spate.checkpoint.protocol.RescaleSource`). Then:

1. **Seed.** The first usable source is copied as a file (``data.mdb``, while no process writes it) into the new
   subtask's directory, or moved there if no other new subtask needs any of it (scaling down): its key groups
   the new subtask keeps cost a sequential file copy at most, no decoding. Its other
   key groups stay in the copy, unreachable (every read and iteration is by the subtask's own key groups), and
   are deleted a bounded number of entries per batch afterwards (:meth:`LmdbTable.trim_outside`): lmdb has no
   range delete, so dropping them at once would cost as much as the copy.
2. **Merge.** Key groups of the other sources are read from their local copies, entry by entry, with state ids
   mapped to the seed's registry.
3. **The rest** (a copy that is missing, from another attempt, or damaged): the caller restores those key groups
   from checkpoint storage (:func:`missing_parts`).

Old copies are only read, never changed (they are another parallelism's directories), so every new subtask of
the rescale can use them, in any order and in any process on the machine, and a failed rescale batch can be
retried from them; they are deleted once a checkpoint at the new parallelism completed.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field

import msgpack

from spate.checkpoint.protocol import RescaleSource, SubtaskPlan
from spate.errors import SpateError
from spate.runtime.localstate import local_state_dir
from spate.snapshot.handles import ChangeSetHandle, KeyGroupsHandle
from spate.snapshot.keyed import restore_key_groups
from spate.snapshot.lineage import LINEAGE_META, TAG_META, lineage_digest
from spate.state.keyed import KeyedStateBackend
from spate.state.lmdb_table import LmdbTable, ReadOnlyTable, copy_table, held_for_reading, move_table

log = logging.getLogger(__name__)
TRIM_PER_BATCH = 25_000  # entries of key groups a subtask no longer owns deleted after each later batch


@dataclass
class LocalRescale:
    """Builds subtask ``plan.index``'s table at the new parallelism from the local copies under ``local_dir``.

    ``trusted``: table directories this worker wrote or verified (their digest is not checked again)."""

    plan: SubtaskPlan
    local_dir: str
    trusted: set[str]
    copied_bytes: int = 0  # copied from local copies (the seed's file, merged entries)
    moved_bytes: int = 0  # taken over without a copy (a seed no other new subtask needs, moved)
    missing: list[range] = field(default_factory=list)  # key groups to restore from checkpoint storage
    _seed: RescaleSource | None = None

    def seed(self, target: str) -> LmdbTable | None:
        """A copy of the first usable source in ``target``, with the new subtask's key groups the source did not
        own emptied; None if no source is usable (then everything comes from checkpoint storage)."""
        for source in self.plan.rescale_sources:
            table = self._copy(source, target)
            if table is not None:
                self._seed = source
                self._drop_stale(table, source)
                return table
        return None

    def merge_into(self, backend: KeyedStateBackend) -> None:
        """Add the other sources' key groups from their local copies to ``backend`` (over the seeded table);
        those that cannot be read locally end up in :attr:`missing`."""
        for source in self.plan.rescale_sources:
            if source is self._seed:
                continue
            wanted = _overlap(source.key_groups, self.plan.key_groups)
            if not self._merge(source, wanted, backend):
                self.missing.append(wanted)

    # -- one source -------------------------------------------------------------------------------------
    def _path(self, source: RescaleSource) -> str:
        assert self.plan.base_parallelism is not None
        return local_state_dir(self.local_dir, self.plan.query_id, source.index, self.plan.base_parallelism)

    def _copy(self, source: RescaleSource, target: str) -> LmdbTable | None:
        path = self._path(source)
        shutil.rmtree(target, ignore_errors=True)
        try:  # the only new subtask that needs this copy takes it as it is
            taken = move_table(path, target) if source.consumers == 1 else copy_table(path, target)
        except (FileNotFoundError, SpateError) as e:
            self._unusable(source, f"not copied ({e})")
            return None
        table = LmdbTable(target)
        problem = self._problem(source, table.committed_meta(TAG_META), table.committed_meta(LINEAGE_META),
                                path, table.verify)
        if problem is not None:
            self._unusable(source, problem)
            table.destroy()
            return None
        if source.consumers == 1:
            self.moved_bytes += taken
        else:
            self.copied_bytes += taken
        return table

    def _merge(self, source: RescaleSource, wanted: range, backend: KeyedStateBackend) -> bool:
        path = self._path(source)
        try:
            with held_for_reading(path):
                reader = ReadOnlyTable(path)
                try:
                    problem = self._problem(source, reader.meta(TAG_META), reader.meta(LINEAGE_META), path,
                                            reader.verify)
                    if problem is not None:
                        self._unusable(source, problem)
                        return False
                    states = tuple(msgpack.unpackb(reader.meta("states") or msgpack.packb([])))
                    restore_key_groups(backend, states, self._counted(_groups(reader, wanted)))
                finally:
                    reader.close()
        except (FileNotFoundError, SpateError) as e:
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

    def _drop_stale(self, table: LmdbTable, source: RescaleSource) -> None:
        """Entries the seed holds of the new subtask's key groups that its source did not own are left from an
        earlier parallelism: the key groups are filled from elsewhere, so they must start empty."""
        mine = self.plan.key_groups
        table.drop_key_groups(mine.start, min(mine.stop, source.start))
        table.drop_key_groups(max(mine.start, source.stop), mine.stop)
        table.commit()

    def _unusable(self, source: RescaleSource, why: str) -> None:
        log.info("subtask %d: the local copy of old subtask %d is not used: %s; its key groups are read from "
                 "checkpoint storage", self.plan.index, source.index, why)


def missing_parts(plan: SubtaskPlan, missing: list[range]) -> tuple[list[KeyGroupsHandle], list[ChangeSetHandle]]:
    """The parts of the plan's handles holding the ``missing`` key groups (what checkpoint storage must give)."""
    keyed = [part for r in missing for h in plan.keyed if (part := h.intersect(r)) is not None]
    changelog = [part for r in missing for h in plan.changelog if (part := h.intersect(r)) is not None]
    return keyed, changelog


def _overlap(a: range, b: range) -> range:
    return range(max(a.start, b.start), min(a.stop, b.stop))


def _groups(reader: ReadOnlyTable, key_groups: range) -> Iterator[tuple[int, list[bytes]]]:
    for kg in key_groups:
        flat = reader.key_group_flat(kg)
        if flat:
            yield kg, flat
