"""Savepoints: a checkpoint copied with every file it references into one directory, with paths relative to
that directory, so it can be moved anywhere and restored by any query (``restore_from=``). A query may also be
restored from a retained checkpoint of another root, named ``<root>/chk-<n>``: its files are named from that
root, which must keep the checkpoint until the new query's first checkpoint completed."""

from __future__ import annotations

import dataclasses
import uuid

from spate.checkpoint.metadata import CheckpointMetadata
from spate.errors import SettingError
from spate.fs import CheckpointStorage, join_uri
from spate.layout import (
    KEY_GROUPS_SUFFIX,
    METADATA_FILE,
    QUERY_FILE,
    SAVEPOINTS_DIR,
    checkpoint_id_of,
    metadata_path,
    subtask_dir,
)
from spate.segments import WholeFileWriter
from spate.snapshot.handles import NativeSnapshotHandle
from spate.snapshot.native import write_as_key_groups


def restore_source(uri: str) -> tuple[CheckpointStorage, str]:
    """(the storage handles are named from, the metadata's path in it) of what ``restore_from`` names: a
    retained checkpoint ``<root>/chk-<n>`` of a root (``<root>/_query`` exists), else a savepoint directory."""
    parent, _, name = uri.rstrip("/").rpartition("/")
    checkpoint_id = checkpoint_id_of(name)
    if checkpoint_id is not None and parent and not parent.endswith(":/"):
        root = CheckpointStorage(parent)
        if root.exists(QUERY_FILE):
            return root, metadata_path(checkpoint_id)
    return CheckpointStorage(uri), METADATA_FILE


def write_savepoint(source: CheckpointStorage, meta: CheckpointMetadata, target: CheckpointStorage) -> None:
    """Copy ``meta``'s files from ``source`` to ``target`` and write ``target/_metadata`` last. Native lmdb
    snapshots are written as key-group files instead: a savepoint keeps spate's canonical format, which any table
    kind on any machine restores."""
    meta = _canonical(source, meta, target)
    for rel in meta.files():
        if not target.exists(rel):  # not a key-group file just written from a native snapshot
            target.write(rel, source.read(rel, f"checkpoint {meta.checkpoint_id}"))
    sp = dataclasses.replace(meta, is_savepoint=True)
    target.create_exclusive(METADATA_FILE, sp.to_bytes())


def take_savepoint(source: CheckpointStorage, meta: CheckpointMetadata, target_uri: str | None = None) -> str:
    """Copy checkpoint ``meta`` of the root ``source`` into a self-contained, relocatable directory (default
    ``<root>/savepoints/savepoint-<n>-<random>``). Returns its URI.

    Raises:
        SettingError: (a ``ValueError``) ``target_uri`` is inside the checkpoint root, outside ``savepoints/``.
    """
    name = f"savepoint-{meta.checkpoint_id}-{uuid.uuid4().hex[:8]}"
    target = target_uri or join_uri(source.uri, f"{SAVEPOINTS_DIR}/{name}")
    target_storage = CheckpointStorage(target)
    root = source.root.rstrip("/") + "/"
    if (type(target_storage.fs) is type(source.fs) and (target_storage.root + "/").startswith(root)
            and not (target_storage.root + "/").startswith(root + SAVEPOINTS_DIR + "/")):
        raise SettingError(f"savepoint target {target} is inside the checkpoint root {source.uri}, where "
                           f"orphan cleanup would delete it; use a directory under {SAVEPOINTS_DIR}/ or outside the "
                           "root")
    write_savepoint(source, meta, target_storage)
    return target


def _canonical(source: CheckpointStorage, meta: CheckpointMetadata, target: CheckpointStorage) -> CheckpointMetadata:
    """``meta`` with each native lmdb snapshot re-written into ``target`` as a key-group file (``.kg``)."""
    if not any(isinstance(h, NativeSnapshotHandle) for st in meta.subtasks for h in st.keyed):
        return meta
    subtasks = [dataclasses.replace(st, keyed=[
        write_as_key_groups(source, h, WholeFileWriter(target, subtask_dir(i, meta.parallelism), KEY_GROUPS_SUFFIX),
                            "taking a savepoint")
        if isinstance(h, NativeSnapshotHandle) else h for h in st.keyed]) for i, st in enumerate(meta.subtasks)]
    return dataclasses.replace(meta, subtasks=subtasks)

