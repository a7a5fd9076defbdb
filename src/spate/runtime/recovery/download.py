"""The ladder's rung for native snapshots: with the lmdb table, when the plan's keyed state is native snapshots
(:mod:`spate.snapshot.native`: a materialization, or its parts, or a full snapshot) within the subtask's key groups,
it is restored by taking their files, not entry by entry.

- With the changelog, each file becomes a read-only *base* of the subtask's table
  (:class:`~spate.state.overlay.OverlayTable`, as an online rescale takes over an old subtask's copy), owning the
  key groups its handle stands for, and the plan's change sets are replayed into the table's own, empty part
  (``restored``): a restore costs getting the files and replaying the log, and the table folds the bases into itself
  a bounded number of entries per batch. Getting a file: in a checkpoint root on this machine's file system, a
  hard link to the checkpoint's own file (a whole file, not a segment of a merged one) when the two are on one file
  system, its CRC-32 checked by reading it; else a download, checked as it is written. The files are placed one
  after the other in a thread of their own while the log replays: the replay writes only the table's own part, and
  what it reads of a base (for a delete, or a record that cannot be folded) waits for its file. The table is
  tagged with the plan's base only once every file is in place and checked. A base is only ever read (lmdb opens it
  read-only), so the checkpoint's file is never changed; unlinking a base when it is folded leaves the checkpoint's
  name alone.
- Without it, the file is copied, checked as it is written, to be the table's own data file (when it holds
  exactly the subtask's key groups): the subtask's thread writes every full snapshot of the table, and would merge
  an overlay's key groups with the base's in Python.

Only for a base that is a checkpoint of this root; a savepoint, snapshots in frames or the heap table read the
snapshot key group by key group (:mod:`spate.runtime.recovery.storage`), as does a restore without the changelog of
anything but one native snapshot of exactly the subtask's key groups.
"""

from __future__ import annotations

import functools
import itertools
import os
import shutil
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import msgpack

from spate.checkpoint.protocol import SubtaskPlan
from spate.errors import IncompatibleStateError, SpateError
from spate.fs import CheckpointStorage, whole_range
from spate.local_file_io import read_kept
from spate.runtime.recovery.local_copy import replay_change_sets
from spate.runtime.recovery.recovered import RecoveredState, StateOwner, ms_since, nonzero, restored_handles
from spate.runtime.recovery.trust import full_restore
from spate.snapshot.handles import NativeSnapshotHandle
from spate.snapshot.native import download_native, local_file
from spate.snapshot.verify import VerifiedSpans, verify_native_once
from spate.state.lmdb_table import LmdbTable, ReadOnlyTable
from spate.state.overlay import Base, OverlayTable, SharedReaders
from spate.state.registries import compatible, registry, union

BASE_NAME = "base-native.mdb"  # the native snapshot's file in the table directory (overlay bases are base-*.mdb)
UNCHECKED_SUFFIX = ".unchecked"  # the file's name until its CRC-32 is checked


def base_name(index: int) -> str:
    """The file of the plan's ``index``-th native snapshot in the table directory."""
    return BASE_NAME if index == 0 else f"base-native-{index}.mdb"


def restore(plan: SubtaskPlan, owner: StateOwner) -> RecoveredState | None:
    """The plan's base from its native snapshots and its log, or None if the plan's keyed state is not native
    snapshots in this root (without the changelog: one, holding exactly the subtask's key groups)."""
    handles = _native_bases(plan)
    copied = owner.config.changelog is None
    if not handles or copied and (len(handles) > 1 or not handles[0].whole):  # a copy would hold others' key groups
        return None
    assert plan.base_uri is not None
    started = time.perf_counter()
    storage = owner.services.storage_of(plan.base_uri)
    path = owner.lmdb_dir(plan)
    shutil.rmtree(path, ignore_errors=True)  # untrusted by the rungs before, or none
    os.makedirs(path)
    if copied:
        target, operator = owner.filled(plan, _copied(storage, handles[0], path, owner.context(plan)),
                                        lambda t: replay_change_sets(plan, owner, t.table, plan.changelog))
        linked = 0
    else:
        placings = [_Placing(storage, h, os.path.join(path, base_name(i)), owner.services.readers,
                             owner.context(plan), owner.services.verified_spans(plan.base_uri))
                    for i, h in enumerate(handles)]
        with ThreadPoolExecutor(1, thread_name_prefix="spate-base") as pool:
            table, bases = _over_bases(handles, path, owner.services.readers,
                                       [functools.partial(pool.submit, p.reader) for p in placings])
            target, operator = owner.filled(plan, table, lambda t: replay_change_sets(
                plan, owner, t.table, plan.changelog, settle=functools.partial(_settled, table, bases, handles, plan)))
        linked = sum(h.size for h, p in zip(handles, placings, strict=True) if p.linked)
    info = full_restore(plan, ms_since(started))
    return owner.recovered(plan, target, operator, info, stats=nonzero(
        replayed_change_sets=len(plan.changelog), local_moved_bytes=linked), handles=restored_handles(plan))


def _copied(storage: CheckpointStorage, handle: NativeSnapshotHandle, path: str, context: str) -> LmdbTable:
    """Without the changelog: the snapshot's file copied (checked as it is written) into ``path`` as the table's own
    data file. Not a base: the subtask's thread writes the table's full snapshots, and an overlay's key groups
    written since the restore would be merged with the base's in Python at every checkpoint."""
    try:
        download_native(storage, handle, os.path.join(path, "data.mdb"), context)
        return LmdbTable(path)
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        raise


def _over_bases(handles: list[NativeSnapshotHandle], path: str, readers: SharedReaders,
                places: list[Callable[[], Future[ReadOnlyTable]]]) -> tuple[OverlayTable, list[Base]]:
    """With the changelog: an empty table in ``path`` over the snapshots' files as its read-only bases (its
    materializations are read by a process of their own, where an overlay's merges cost no batch), the files being
    placed (each ``places`` starts one) while the log replays into the table's own part. The replay writes the delta
    and reads a base only for what it deletes (or for records that cannot be folded): those wait for its file."""
    table = None
    try:
        table = OverlayTable(LmdbTable(path), [], readers)
        # the handles' registries (the table's when each snapshot began), known before the files are checked; states
        # a file's adds (registered while it was read) are added once it is (_settled)
        states: list[dict] = []
        bases = []
        for i, (handle, place) in enumerate(zip(handles, places, strict=True)):
            states = registry(union(states, list(handle.states)))
            bases.append(Base(base_name(i), handle.start, handle.end + 1, place()))
            table.add_base(bases[-1], msgpack.packb(states) if states else b"")
        table.commit()
    except BaseException:
        if table is not None:
            table.destroy()  # after the files are placed: then lets their readers go
        shutil.rmtree(path, ignore_errors=True)
        raise
    return table, bases


def _settled(table: OverlayTable, bases: list[Base], handles: list[NativeSnapshotHandle], plan: SubtaskPlan) -> None:
    """Before the restored table is tagged: its bases placed and checked (raises what placing one raised); the states
    the files' registries hold beyond the handles' (registered while a materialization read the table) known to the
    table; and the entries a base serves counted when that is cheap to know: all of the file's, when it holds
    exactly the table's key groups and no log was replayed into them (else learned from the checkpoint:
    ``learn_entry_count``).

    Raises:
        IncompatibleStateError: a file numbers a state unlike the log replayed over it, or unlike another file (an
            inconsistent checkpoint; the table is discarded, the checkpoint left as it is).
    """
    for base, handle in zip(bases, handles, strict=True):
        reader = base.table
        mine, theirs = registry(table.get_meta("states")), registry(reader.meta("states"))
        if not compatible(mine, theirs):
            raise IncompatibleStateError(f"{handle.path}: the native snapshot numbers its states unlike the log "
                                         f"replayed over it ({theirs} against {mine}); the checkpoint is inconsistent")
        known = {m["name"] for m in mine}
        if any(m["name"] not in known for m in theirs):
            table.put_meta("states", union(mine, theirs))
        if handle.whole and not plan.changelog:
            base.served = reader.entry_count()


class _Placing:
    """Placing the snapshot's file at ``dest`` as the base, in a thread of its own: hard-linked from a checkpoint root
    on this file system and its CRC-32 checked, else downloaded (checked as it is written); opened for reading.

    The table lists the base (``dest``) before the file is checked, so the file is placed under a name of its own and
    renamed to ``dest`` once checked: a process that dies before leaves nothing under the listed name, and a restart
    opening the table's directory never opens an unchecked file (it finds the base missing and deletes the
    directory)."""

    def __init__(self, storage: CheckpointStorage, handle: NativeSnapshotHandle, dest: str, readers: SharedReaders,
                 context: str, checked: VerifiedSpans) -> None:
        self._storage, self._handle, self._dest, self._readers = storage, handle, dest, readers
        self._context, self._checked = context, checked
        self.linked = False  # whether the file was linked (known once placed)

    def reader(self) -> ReadOnlyTable:
        self.linked = self._checked_file(link=True)
        try:
            return self._readers.open(self._dest, file=True)
        except SpateError:  # this process reads the linked file already, as another restore's source: a copy
            os.unlink(self._dest)
            self.linked = self._checked_file(link=False)
            return self._readers.open(self._dest, file=True)

    def _checked_file(self, link: bool) -> bool:
        unchecked = self._dest + UNCHECKED_SUFFIX
        linked = _place(self._storage, self._handle, unchecked, self._context, self._checked, link=link)
        os.rename(unchecked, self._dest)
        return linked


def _native_bases(plan: SubtaskPlan) -> list[NativeSnapshotHandle]:
    """The plan's keyed handles, if they are native snapshots of this root within the subtask's key groups, each
    standing for key groups of its own (else none)."""
    if plan.base_checkpoint_id is None or plan.base_is_savepoint or plan.base_uri != plan.checkpoint_uri:
        return []
    handles = [h for h in plan.keyed if isinstance(h, NativeSnapshotHandle)]
    if not handles or len(handles) != len(plan.keyed):
        return []
    ranges = sorted((h.start, h.end) for h in handles)
    kgs = plan.key_groups
    disjoint = all(end < start for (_s, end), (start, _e) in itertools.pairwise(ranges))
    return handles if disjoint and kgs.start <= ranges[0][0] and ranges[-1][1] < kgs.stop else []


def _place(storage: CheckpointStorage, handle: NativeSnapshotHandle, dest: str, context: str,
           checked: VerifiedSpans, link: bool = True) -> bool:
    """Put the snapshot's file at ``dest``: hard-linked if it can be and ``link`` (True), its CRC-32 checked unless
    this worker checked the same file already (``checked``); else downloaded, checked as it is written."""
    source = local_file(storage, handle) if link else None
    if source is not None:
        try:
            os.link(source, dest, follow_symlinks=False)
        except OSError:  # another file system, or no hard links there: download it
            pass
        else:
            try:
                verify_native_once(_LinkedBase(storage, dest), handle, checked, context)
            except BaseException:
                os.unlink(dest)
                raise
            return True
    download_native(storage, handle, dest, context)
    return False


class _LinkedBase:
    """Ranged reads of a native snapshot through the hard link just made in the table's directory: the checkpoint's
    own file, read where the table reads it, so that its pages stay in the page cache for the batches after the
    restore (a checkpoint file read through the storage leaves it: :mod:`spate.local_file_io`). Errors name the
    checkpoint's file."""

    def __init__(self, storage: CheckpointStorage, linked: str) -> None:
        self._storage, self._linked = storage, linked

    def path(self, rel: str) -> str:
        return self._storage.path(rel)

    def read_range(self, rel: str, offset: int, length: int, context: str = "") -> bytes:
        return whole_range(self.path(rel), context, offset, length, read_kept(self._linked, offset, length))
