"""The checkpoint files one subtask's snapshots write: whole files, or with file merging (FLIP-306) segments of
its worker's merged files, which are reported to the coordinator with the ack."""

from __future__ import annotations

from collections.abc import Iterable

from spate.checkpoint.protocol import SubtaskPlan
from spate.filemerging.manager import FileMergingManager
from spate.fs import CheckpointStorage
from spate.layout import (
    KEY_GROUPS_SUFFIX,
    NATIVE_SNAPSHOT_SUFFIX,
    OPERATOR_STATE_SUFFIX,
    STAGED_OUTPUTS_SUFFIX,
    STAGED_PARQUET_SUFFIX,
    checkpoint_dir,
    in_subtask_dir,
    staged_dir,
    subtask_dir,
)
from spate.runtime.services import WorkerServices
from spate.segments import FileRef, SegmentWriter, WholeFileWriter
from spate.snapshot.handles import ChangeSetHandle, KeyedHandle
from spate.snapshot.relocate import H, relocate
from spate.state.overlay import SharedReaders


class RecordingWriter:
    """A segment writer that notes what it wrote in ``written``."""

    def __init__(self, out: SegmentWriter, written: list[FileRef]) -> None:
        self.out, self.written = out, written

    def write(self, data: bytes) -> FileRef:
        return self.write_parts((data,))

    def write_parts(self, parts: Iterable[bytes]) -> FileRef:
        ref = self.out.write_parts(parts)
        self.written.append(ref)
        return ref

    def link_in(self, local_path: str) -> FileRef | None:
        ref = self.out.link_in(local_path)
        if ref is not None:
            self.written.append(ref)
        return ref

    def discard(self, ref: FileRef) -> None:
        self.out.discard(ref)


class Relocator:
    """With file merging: gives a handle's re-written copy if it should leave where it is, else the handle
    itself. Re-written, within ``budget`` bytes per snapshot: segments in another subtask's directory (state
    restored after a rescale) and segments of the files the plan names as not reusable (wasting too much space,
    or in the private directory of a worker of an earlier run). So no checkpoint copies a large share of the
    state on its path (after a rescale, the first checkpoint would otherwise copy every subtask's share): the
    rest keeps its place, referenced where it is (the coordinator's registry keeps a file while any checkpoint
    names a segment of it), until a later checkpoint's budget has room for it or the state written since (a
    materialization, a full snapshot) leaves it unreferenced. A handle is copied whole or not at one
    checkpoint, so one larger than the budget waits for the latter."""

    def __init__(self, storage: CheckpointStorage, out: SegmentWriter, changes_out: SegmentWriter,
                 non_reusable: list[str], own_dir: str, budget: int, *, readers: SharedReaders | None = None) -> None:
        self.storage, self.out, self.changes_out = storage, out, changes_out
        self.readers = readers  # the process's open lmdb files (a native snapshot may be a table's base)
        self.bad, self.mine = frozenset(non_reusable), own_dir + "/"
        self.budget = budget
        self.rewritten_bytes = 0

    def _other_subtask(self, h: KeyedHandle | ChangeSetHandle) -> bool:
        return in_subtask_dir(h.path) and not h.path.startswith(self.mine)

    def keeps(self, h: KeyedHandle | ChangeSetHandle) -> bool:
        """Whether a new checkpoint may name ``h`` or its copy: not in a file the plan names as not reusable
        (a handle in another subtask's directory may stay there)."""
        return h.path not in self.bad

    def __call__(self, h: H) -> H:
        moves = h.path in self.bad or self._other_subtask(h)
        if not moves or self.rewritten_bytes + h.span()[1] > self.budget:
            return h
        self.rewritten_bytes += h.span()[1]
        # change sets go where change files go (they die together at the next materialization)
        return relocate(self.storage, h, self.changes_out if isinstance(h, ChangeSetHandle) else self.out,
                        self.readers)


class SnapshotFiles:
    """The files subtask ``index`` of ``parallelism`` writes its snapshots to, through its worker's
    ``services``. With file merging it keeps the segments an attempt wrote until an ack names them: those no ack
    named (the attempt failed, or a copy was not needed) are given up, so they no longer keep their files in
    use."""

    def __init__(self, index: int, parallelism: int, services: WorkerServices) -> None:
        self.index, self.parallelism = index, parallelism
        self.services = services
        self.own_dir = subtask_dir(index, parallelism)
        self._unsynced: list[FileRef] = []  # segments this attempt wrote that no ack named yet

    @property
    def merging(self) -> FileMergingManager | None:
        return self.services.merging

    @property
    def worker(self) -> str | None:
        """The worker's id with file merging (the ack's ``worker``), else None."""
        return self.merging.worker_id if self.merging is not None else None

    def begin(self, plan: SubtaskPlan) -> None:
        """The plan's checkpoint starts: with file merging, its manager learns the base and the open files."""
        manager = self.merging
        if manager is None:
            return
        self.give_up_unsynced()
        same_root = plan.base_uri == plan.checkpoint_uri and not plan.base_is_savepoint
        manager.begin(plan.checkpoint_id, plan.base_checkpoint_id if same_root else None, plan.open_files,
                      plan.epoch, scope=self.own_dir)

    def writers(self, plan: SubtaskPlan) -> tuple[SegmentWriter, SegmentWriter, SegmentWriter]:
        """Writers of (keyed snapshots, operator state, staged outputs): segments of merged files, or whole
        files in the subtask's directory, the checkpoint's directory and the staged-outputs directory."""
        cp, manager = plan.checkpoint_id, self.merging
        if manager is not None:
            private = RecordingWriter(manager.private_writer(cp), self._unsynced)
            return RecordingWriter(manager.shared_writer(self.index, self.parallelism, cp), self._unsynced), \
                private, private
        storage = self.services.storage
        return (WholeFileWriter(storage, self.own_dir, KEY_GROUPS_SUFFIX, cp),
                WholeFileWriter(storage, checkpoint_dir(cp), OPERATOR_STATE_SUFFIX, cp),
                WholeFileWriter(storage, staged_dir(cp), STAGED_OUTPUTS_SUFFIX, cp))

    def native_writer(self, plan: SubtaskPlan) -> SegmentWriter:
        """Writer of a full snapshot's native lmdb file: a physical file of its own (with file merging too, so that
        a local root takes the built file itself), in the subtask's directory."""
        cp, manager = plan.checkpoint_id, self.merging
        if manager is not None:
            return RecordingWriter(manager.shared_writer(self.index, self.parallelism, cp, alone=True), self._unsynced)
        return WholeFileWriter(self.services.storage, self.own_dir, NATIVE_SNAPSHOT_SUFFIX, cp)

    def staged_parquet_writer(self, plan: SubtaskPlan) -> WholeFileWriter:
        """Writer of staged outputs as Parquet files of their own (with or without file merging: Spark reads
        them as files), in the batch's staged-outputs directory."""
        return WholeFileWriter(self.services.storage, staged_dir(plan.checkpoint_id), STAGED_PARQUET_SUFFIX,
                               plan.checkpoint_id)

    def relocator(self, plan: SubtaskPlan, out: SegmentWriter) -> Relocator | None:
        """With file merging, what re-writes the handles the new checkpoint must not reference (to ``out``)."""
        if self.merging is None:
            return None
        changes = RecordingWriter(self.merging.changelog_writer(plan.checkpoint_id), self._unsynced)
        return Relocator(self.services.storage, out, changes, plan.non_reusable, self.own_dir,
                         self.merging.config.rewrite_budget, readers=self.services.readers)

    def report(self, plan: SubtaskPlan, named: list[FileRef], written: list[FileRef],
               own: list[FileRef] | None = None) -> dict[str, list]:
        """Once the snapshot is durable: the physical files for the ack (path → [size, still open]). ``named``:
        every segment the ack references; ``written``: the whole files this snapshot wrote without file
        merging; ``own``: those it wrote as files of their own in either case (staged Parquet outputs)."""
        own_files = {ref.path: [ref.length, False] for ref in own or ()}
        manager = self.merging
        if manager is None:
            return {**{ref.path: [ref.length, False] for ref in written}, **own_files}
        manager.sync(named, plan.checkpoint_id)
        self.give_up_unsynced(keep=named)
        return {**manager.report(plan.checkpoint_id), **own_files}

    def give_up_unsynced(self, keep: list[FileRef] | None = None) -> None:
        """Segments written that no ack named (but ``keep``) no longer keep their files in use."""
        if self.merging is not None:
            named = set(keep or ())
            self.merging.settle([ref for ref in self._unsynced if ref not in named])
        self._unsynced.clear()
