"""Savepoints: a checkpoint copied with every file it references into one directory, with paths relative to
that directory, so it can be moved anywhere and restored by any query (``restore_from=``)."""

from __future__ import annotations

import dataclasses

from spate.checkpoint.metadata import CheckpointMetadata
from spate.fs import CheckpointStorage
from spate.layout import METADATA_FILE


def write_savepoint(source: CheckpointStorage, meta: CheckpointMetadata, target: CheckpointStorage) -> None:
    """Copy ``meta``'s files from ``source`` to ``target`` and write ``target/_metadata`` last."""
    for rel in meta.files():
        target.write(rel, source.read(rel, f"checkpoint {meta.checkpoint_id}"))
    sp = dataclasses.replace(meta, is_savepoint=True)
    target.create_exclusive(METADATA_FILE, sp.to_bytes())
