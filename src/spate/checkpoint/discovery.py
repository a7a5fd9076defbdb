"""Finding the complete checkpoints of a root: the ``chk-<n>`` directories holding a metadata file, and which
of them count under the fencing epochs' seals (:mod:`spate.checkpoint.epochs`)."""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow.fs as pafs

from spate.checkpoint.epochs import EpochLog, EpochState
from spate.checkpoint.metadata import CheckpointMetadata, read_metadata
from spate.errors import CheckpointError, CorruptFileError, MissingFileError
from spate.fs import CheckpointStorage
from spate.layout import METADATA_FILE, QUERY_FILE, checkpoint_id_of, metadata_path

MAX_ROOTS_NAMED = 10  # roots found below a directory that is not one, named in the error


def open_root(root: str) -> CheckpointStorage:
    """The storage of an existing checkpoint root (``_query``) or savepoint directory (``_metadata``). A path
    that does not exist, or a directory that is neither (e.g. the folder holding a root), is a
    :class:`CheckpointError` that says what a root looks like and names the roots just below it."""
    storage = CheckpointStorage(root)
    if storage.fs.get_file_info(storage.root).type == pafs.FileType.NotFound:
        raise CheckpointError(f"checkpoint root {root} does not exist; check the path or URI")
    if storage.exists(QUERY_FILE) or storage.exists(METADATA_FILE) or metadata_ids(storage):
        return storage  # a root (one that lost its _query still holds checkpoints), or a savepoint directory
    below = [d for d in storage.list_dirs() if storage.exists(f"{d}/{QUERY_FILE}")][:MAX_ROOTS_NAMED]
    parent = root.rstrip("/")
    hint = f"; the roots in it: {', '.join(parent + '/' + d for d in below)}" if below else "; no query ran there yet"
    raise CheckpointError(f"{root} is not a spate checkpoint root: a root holds {QUERY_FILE} (the query's identity) "
                          f"and chk-<n>/{METADATA_FILE} for each complete checkpoint, a savepoint directory "
                          f"{METADATA_FILE}{hint}")


def metadata_ids(storage: CheckpointStorage) -> list[int]:
    """Ids of every ``chk-<n>`` directory holding a metadata file, ascending (not yet verified)."""
    ids = [n for name in storage.list_dirs() if (n := checkpoint_id_of(name)) is not None]
    return sorted(n for n in ids if storage.exists(metadata_path(n)))


def written_by(storage: CheckpointStorage, checkpoint_id: int) -> CheckpointMetadata:
    """The metadata of checkpoint ``checkpoint_id``, whichever driver wrote it."""
    return read_metadata(storage, metadata_path(checkpoint_id))


@dataclass
class Discovery:
    """The complete checkpoints of a root as one driver saw them."""

    retained: list[CheckpointMetadata]  # the newest visible ones, ascending
    latest_id: int  # the newest visible id, -1 if none


def discover(storage: CheckpointStorage, epochs: EpochState, retained: int) -> Discovery:
    """Read metadata newest first until ``retained`` visible checkpoints are found (metadata a fenced driver
    wrote after a take-over looked is skipped: it never counts)."""
    found: list[CheckpointMetadata] = []
    for n in reversed(metadata_ids(storage)):
        if len(found) == retained:
            break
        try:
            meta = written_by(storage, n)
        except MissingFileError:
            continue  # an older driver subsumed it while this one looked
        if epochs.visible(n, meta.epoch):
            found.append(meta)
    found.reverse()
    return Discovery(found, found[-1].checkpoint_id if found else -1)


def list_complete_checkpoints(storage: CheckpointStorage) -> list[int]:
    """Ids of the complete checkpoints of a root, ascending: those with a metadata file that counts under
    the epochs' seals (not yet verified; one that cannot be read is listed). A metadata file needs reading only
    if a seal might exclude it. For inspection: a driver finds its checkpoints with :func:`discover`."""
    epochs = EpochLog(storage).read()
    lowest_seal = min((s.sealed for s in epochs.seals.values()), default=None)
    out = []
    for n in metadata_ids(storage):
        try:
            if lowest_seal is None or n <= lowest_seal or epochs.visible(n, written_by(storage, n).epoch):
                out.append(n)
        except MissingFileError:
            continue  # subsumed while listing
        except CorruptFileError:
            out.append(n)  # unreadable, so its epoch is unknown: listed, for inspection to say what is wrong
    return out
