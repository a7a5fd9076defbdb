"""The names spate writes under a checkpoint root, and nothing else: every such path is built here and recognized
here.

spate deletes only files whose names match this layout: a user's file, a file another tool put into the
root, or anything reached through a symbolic link is never touched. ``docs/formats.md`` lists the layout;
``tests/storage/test_layout.py`` checks that every builder's output is recognized.
"""

from __future__ import annotations

import re
import uuid

# -- names ---------------------------------------------------------------------------------------------------
QUERY_FILE = "_query"  # the query's identity
DELIVERED_FILE = "_delivered"  # the newest checkpoint whose outputs the sink received
METADATA_FILE = "_metadata"  # in chk-<n>/: checkpoint n is complete
EPOCHS_DIR = "_epochs"  # the drivers' claims, seals and completion marks
SHARED_DIR = "shared"  # state several checkpoints (and subtasks, after a rescale) may reference
CHANGELOG_DIR = f"{SHARED_DIR}/changelog"  # change files, merging off
TASKOWNED_DIR = "taskowned"  # file merging: one directory per worker process
STAGED_DIR = "staged"  # outputs staged for a sink, one directory per batch
INITIAL_DIR = "_initial"  # on Spark Connect: a new query's initial state, staged by Spark's Parquet writer
SAVEPOINTS_DIR = "savepoints"  # savepoints written into the root: spate's, but never deleted by it
CHECKPOINT_PREFIX = "chk-"
SUBTASK_PREFIX = f"{SHARED_DIR}/subtask-"

KEY_GROUPS_SUFFIX = ".kg"  # a keyed snapshot: frames of key groups
NATIVE_SNAPSHOT_SUFFIX = ".lmdb"  # a keyed snapshot: an lmdb table's own file (a materialization)
OPERATOR_STATE_SUFFIX = ".op"
STAGED_OUTPUTS_SUFFIX = ".out"
STAGED_PARQUET_SUFFIX = ".parquet"  # staged outputs as a Parquet file of their own (Spark reads them natively)
CHANGE_FILE_SUFFIX = ".chg"  # change sets of the changelog
CHANGE_LIST_SUFFIX = ".cll"  # a list of change-set handles several checkpoints' metadata reference
SEGMENT_FILE_SUFFIX = ".seg"  # file merging: a physical file holding segments
SEAL_SUFFIX = ".seal"
COMPLETED_SUFFIX = ".completed"
TEMP_SUFFIX = ".tmp"


# -- builders ------------------------------------------------------------------------------------------------
def random_name(suffix: str = "") -> str:
    """An attempt-unique file name (never reused, so a late write cannot clobber another file)."""
    return uuid.uuid4().hex + suffix


def data_file(directory: str, suffix: str) -> str:
    """A new data file of ``directory``: a random name ending in ``suffix``."""
    return f"{directory}/{random_name(suffix)}"


def temporary_path(path: str) -> str:
    """A temporary file next to the marker ``path``, written before the atomic rename or link."""
    return f"{path}.{random_name(TEMP_SUFFIX)}"


def change_list_file() -> str:
    """A new change-set list, written by the coordinator (see :mod:`spate.checkpoint.changelists`)."""
    return data_file(CHANGELOG_DIR, CHANGE_LIST_SUFFIX)


def checkpoint_dir(checkpoint_id: int) -> str:
    return f"{CHECKPOINT_PREFIX}{checkpoint_id}"


def metadata_path(checkpoint_id: int) -> str:
    return f"{checkpoint_dir(checkpoint_id)}/{METADATA_FILE}"


def delivered_path(checkpoint_id: int) -> str:
    """Per-checkpoint delivery marker of older spate versions (still honoured when reading)."""
    return f"{checkpoint_dir(checkpoint_id)}/{DELIVERED_FILE}"


def staged_dir(checkpoint_id: int) -> str:
    """Outputs a batch staged for the sink (merging off, or as Parquet files)."""
    return f"{STAGED_DIR}/{checkpoint_id}"


def staged_initial_dir(run_id: str) -> str:
    """Where one ``start()`` on Spark Connect stages a new query's initial state (``run_id``: 32 hex digits)."""
    return f"{INITIAL_DIR}/{run_id}"


def subtask_dir(index: int, parallelism: int) -> str:
    """Directory of subtask ``index`` of ``parallelism``'s shared state."""
    return f"{SUBTASK_PREFIX}{index}-{parallelism}"


def worker_dir(worker_id: str) -> str:
    """Directory of a worker process's private state and change files (file merging)."""
    return f"{TASKOWNED_DIR}/{worker_id}"


def claim_path(epoch: int) -> str:
    return f"{EPOCHS_DIR}/{epoch:010d}"


def seal_path(epoch: int) -> str:
    return f"{claim_path(epoch)}{SEAL_SUFFIX}"


def completed_path(epoch: int) -> str:
    return f"{claim_path(epoch)}{COMPLETED_SUFFIX}"


# -- recognizers ---------------------------------------------------------------------------------------------
_HEX = r"[0-9a-f]{32}"
_TEMP = rf"(?:\.{_HEX}{re.escape(TEMP_SUFFIX)})?"  # a marker's temporary file
_CHECKPOINT = rf"{CHECKPOINT_PREFIX}(\d+)"
_SUBTASK = rf"{SUBTASK_PREFIX}\d+-\d+"
_WORKER = rf"{TASKOWNED_DIR}/[0-9A-Za-z_-]+"
_STAGED = rf"{STAGED_DIR}/\d+"
_INITIAL = rf"{INITIAL_DIR}/[0-9a-f]{{32}}"
# what Spark's Parquet writer leaves in a staged initial state's directory (checksums beside, on a local file system)
_INITIAL_FILE = re.compile(rf"{_INITIAL}/\.?(?:part-[0-9A-Za-z._-]+\.parquet|_SUCCESS)(?:\.crc)?")
_EPOCH_FILE = re.compile(rf"(\d+)({re.escape(SEAL_SUFFIX)}|{re.escape(COMPLETED_SUFFIX)})?")  # a name in _epochs/


def _data(directory: str, *suffixes: str) -> str:
    return rf"{directory}/{_HEX}(?:{'|'.join(re.escape(s) for s in suffixes)})"


_FILES = re.compile("|".join(rf"(?:{p})" for p in (
    rf"{QUERY_FILE}{_TEMP}",
    rf"{DELIVERED_FILE}{_TEMP}",
    rf"{EPOCHS_DIR}/\d+",
    rf"{EPOCHS_DIR}/\d+(?:{re.escape(SEAL_SUFFIX)}|{re.escape(COMPLETED_SUFFIX)}){_TEMP}",
    rf"{_CHECKPOINT}/{METADATA_FILE}{_TEMP}",
    rf"{_CHECKPOINT}/{DELIVERED_FILE}{_TEMP}",
    _data(_CHECKPOINT, OPERATOR_STATE_SUFFIX),
    _data(_SUBTASK, KEY_GROUPS_SUFFIX, NATIVE_SNAPSHOT_SUFFIX, SEGMENT_FILE_SUFFIX),
    _data(CHANGELOG_DIR, CHANGE_FILE_SUFFIX, CHANGE_LIST_SUFFIX),
    _data(_WORKER, SEGMENT_FILE_SUFFIX),
    _data(_STAGED, STAGED_OUTPUTS_SUFFIX, STAGED_PARQUET_SUFFIX),
)))
_DIRS = re.compile("|".join((EPOCHS_DIR, _CHECKPOINT, SHARED_DIR, _SUBTASK, CHANGELOG_DIR, TASKOWNED_DIR, _WORKER,
                             STAGED_DIR, _STAGED, INITIAL_DIR, _INITIAL)))


def is_spate_file(rel: str) -> bool:
    """Whether ``rel`` (relative to a checkpoint root) is a name spate writes there."""
    return _FILES.fullmatch(rel) is not None


def is_staged_initial_file(rel: str) -> bool:
    """Whether ``rel`` is a file Spark wrote into a staged initial state's directory (``_initial/<hex>/``) for
    spate: spate deletes those once the query has a checkpoint; the root's cleanup leaves ``_initial`` alone."""
    return _INITIAL_FILE.fullmatch(rel) is not None


def is_spate_dir(rel: str) -> bool:
    """Whether ``rel`` is a directory spate creates under a checkpoint root."""
    return _DIRS.fullmatch(rel) is not None


def checkpoint_id_of(name: str) -> int | None:
    """The checkpoint id of the directory name ``chk-<n>``, or None for another name."""
    m = re.fullmatch(_CHECKPOINT, name)
    return int(m.group(1)) if m else None


def epoch_file_of(name: str) -> tuple[int, str] | None:
    """(epoch, kind) of the file ``name`` in ``_epochs/``: kind ``""`` for a claim, ``.seal`` or
    ``.completed``; None for another name (a temporary file, say)."""
    m = _EPOCH_FILE.fullmatch(name)
    return (int(m.group(1)), m.group(2) or "") if m else None


def epoch_of(name: str) -> int | None:
    """The epoch a file ``name`` in ``_epochs/`` belongs to, whatever it is (temporary files too)."""
    m = re.match(r"\d+", name)
    return int(m.group()) if m else None


def in_subtask_dir(rel: str) -> bool:
    """Whether ``rel`` lies in a subtask's shared-state directory (``shared/subtask-<i>-<P>/``)."""
    return rel.startswith(SUBTASK_PREFIX)


def in_worker_dir(rel: str) -> bool:
    """Whether ``rel`` lies in a worker process's directory (``taskowned/<worker>/``)."""
    return rel.startswith(f"{TASKOWNED_DIR}/")


def in_shared_or_worker_dir(rel: str) -> bool:
    """Whether ``rel`` lies below ``shared/`` or ``taskowned/``: state whose files outlive one checkpoint."""
    return rel.startswith((f"{SHARED_DIR}/", f"{TASKOWNED_DIR}/"))


def is_marker(rel: str) -> bool:
    """Whether ``rel`` is a marker (``_query``, ``_metadata``, ``_epochs/...``) rather than a data file."""
    return rel.rpartition("/")[2].startswith("_") or rel.startswith(f"{EPOCHS_DIR}/")


def is_engine_owned(rel: str) -> bool:
    """Top-level directories whose names start with ``_`` (other than spate's ``_epochs``) belong to the engine
    that runs spate (Spark's own checkpoint, ``_spark``): spate neither reads nor deletes them."""
    top, sep, _rest = rel.partition("/")
    return bool(sep) and top.startswith("_") and top != EPOCHS_DIR
