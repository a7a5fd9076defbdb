"""Garbage under a checkpoint root that the file registry does not know of: orphan files, removed when a
driver takes the root over, and directories no worker writes to any more, removed once they are empty.

Only what spate's layout names is ever removed, and only what provably belongs to no retained checkpoint and
to no newer driver; the deleting itself is the :class:`~spate.checkpoint.janitor.Janitor`'s.
"""

from __future__ import annotations

import logging

from spate.checkpoint.epochs import EpochLog
from spate.checkpoint.janitor import Janitor
from spate.checkpoint.metadata import CheckpointMetadata
from spate.fs import CheckpointStorage
from spate.layout import (
    CHANGELOG_DIR,
    DELIVERED_FILE,
    EPOCHS_DIR,
    METADATA_FILE,
    QUERY_FILE,
    SAVEPOINTS_DIR,
    delivered_path,
    in_shared_or_worker_dir,
    is_engine_owned,
    is_spate_file,
    metadata_path,
    subtask_dir,
    worker_dir,
)

log = logging.getLogger(__name__)


def live_dirs(parallelism: int, live_workers: set[str]) -> set[str]:
    """Directories a running worker may write to: this parallelism's subtask directories, the change-file
    directory without merging, and the private directories of the workers of the latest checkpoint."""
    live = {subtask_dir(i, parallelism) for i in range(parallelism)} | {CHANGELOG_DIR}
    return live | {worker_dir(w) for w in live_workers}


class RootCleanup:
    """Finds the orphan files and dead directories of one checkpoint root and has the janitor remove them."""

    def __init__(self, storage: CheckpointStorage, janitor: Janitor) -> None:
        self.storage = storage
        self.janitor = janitor

    def remove_orphans(self, completed: list[CheckpointMetadata], epochs: EpochLog,
                       epoch: int) -> list[tuple[str, int]]:
        """Delete the files under the root that are provably orphans: named as spate names its files, written
        before the take-over of ``epoch`` (a newer driver's files are never touched), and referenced by no
        checkpoint of ``completed`` (leftovers of failed attempts and crashes, half-written physical files,
        subsumed and fenced checkpoints). Savepoints, the query and epoch files, engine directories and files
        spate did not write are kept; links are not followed. Returns the referenced state files that remain,
        with their sizes."""
        markers = {QUERY_FILE, DELIVERED_FILE} | {metadata_path(m.checkpoint_id) for m in completed}
        markers |= {delivered_path(m.checkpoint_id) for m in completed}
        referenced = {path for meta in completed for path in meta.files()}
        claimed_ns = epochs.claim_time_ns(epoch)
        orphans, kept = [], []
        for f in self.storage.stat_files():
            rel = f.path
            if rel in markers or rel.startswith((SAVEPOINTS_DIR + "/", EPOCHS_DIR + "/")) or is_engine_owned(rel):
                continue
            if rel in referenced:
                kept.append((rel, f.size))
            elif is_spate_file(rel) and self._written_before(f.mtime_ns, claimed_ns):
                orphans.append(rel)
        orphans.sort(key=lambda rel: (not rel.endswith("/" + METADATA_FILE), rel))  # a checkpoint dies first
        epochs.check(epoch)
        self.janitor.delete_now(orphans)
        self.storage.remove_empty_dirs()
        if orphans:
            log.info("removed %d orphan files under %s", len(orphans), self.storage.uri)
        return kept

    def _written_before(self, mtime_ns: int, claimed_ns: int) -> bool:
        """Whether a file was written before the take-over. Where the storage cannot tell (object stores keep
        whole seconds), a file of the take-over's second is kept (removed by a later start) rather than risk a
        newer driver's."""
        return self.storage.written_before(mtime_ns, claimed_ns)

    def remove_dead_dirs(self, candidates: list[str], in_use: set[str], live: set[str]) -> None:
        """Remove, in the background, the directories of ``candidates`` no worker writes to any more (not in
        ``live``) and holding no file in use (an earlier parallelism's subtask directories, finished workers'
        directories) once the deletions queued before left them empty. Never their files: a newer driver may
        be writing into a directory of the same name (a subtask directory of its parallelism). Object stores
        have no directories."""
        if not self.storage.has_directories:
            return
        for d in dict.fromkeys(candidates):
            managed = in_shared_or_worker_dir(d)
            if managed and d not in live and d not in in_use and not any(u.startswith(d + "/") for u in in_use):
                self.janitor.remove_empty_dirs(d)
