"""Every path the layout builds is a path the layout recognizes: spate deletes only what it recognizes, so a
builder whose output were not recognized would leak files, and one recognizing too much could delete a user's."""

from __future__ import annotations

import re

import pytest

from spate import layout
from spate.layout import (
    CHANGE_FILE_SUFFIX,
    CHANGELOG_DIR,
    EPOCHS_DIR,
    KEY_GROUPS_SUFFIX,
    OPERATOR_STATE_SUFFIX,
    QUERY_FILE,
    SEGMENT_FILE_SUFFIX,
    STAGED_OUTPUTS_SUFFIX,
    checkpoint_dir,
    data_file,
    delivered_path,
    is_marker,
    is_spate_dir,
    is_spate_file,
    metadata_path,
    staged_dir,
    subtask_dir,
    temporary_path,
    worker_dir,
)

MARKERS = [QUERY_FILE, layout.DELIVERED_FILE, metadata_path(7), delivered_path(7), layout.claim_path(3),
           layout.seal_path(3), layout.completed_path(3)]
DATA_FILES = [
    data_file(checkpoint_dir(7), OPERATOR_STATE_SUFFIX),
    data_file(subtask_dir(1, 4), KEY_GROUPS_SUFFIX),
    data_file(subtask_dir(1, 4), SEGMENT_FILE_SUFFIX),
    data_file(CHANGELOG_DIR, CHANGE_FILE_SUFFIX),
    data_file(worker_dir(layout.random_name()[:16]), SEGMENT_FILE_SUFFIX),
    data_file(staged_dir(7), STAGED_OUTPUTS_SUFFIX),
    layout.change_list_file(),
]
DIRS = [EPOCHS_DIR, checkpoint_dir(7), layout.SHARED_DIR, subtask_dir(1, 4), CHANGELOG_DIR, layout.TASKOWNED_DIR,
        worker_dir("0123456789abcdef"), layout.STAGED_DIR, staged_dir(7)]


# a marker's temporary file, written before the atomic rename or link (the layout does not name a claim's)
TEMPORARY = [temporary_path(p) for p in MARKERS if p != layout.claim_path(3)]


def _named(path: str) -> str:
    """A test id without the path's random names, the same in every process that collects the tests."""
    return re.sub(r"[0-9a-f]{16,32}", "<hex>", path)


@pytest.mark.parametrize("path", MARKERS + TEMPORARY, ids=_named)
def test_markers_are_recognized(path):
    assert is_spate_file(path) and is_marker(path)


@pytest.mark.parametrize("path", DATA_FILES, ids=_named)
def test_data_files_are_recognized(path):
    assert is_spate_file(path) and not is_marker(path)


@pytest.mark.parametrize("path", DIRS)
def test_directories_are_recognized(path):
    assert is_spate_dir(path) and not is_spate_file(path)


def test_every_data_file_lies_in_a_recognized_directory():
    assert all(is_spate_dir(p.rpartition("/")[0]) for p in DATA_FILES + MARKERS if "/" in p)


@pytest.mark.parametrize("path", ["notes.txt", "chk-7/notes.txt", "shared/subtask-1-4/x.kg", "_epochs/3.tmp",
                                  f"{subtask_dir(1, 4)}/../{QUERY_FILE}", "chk-x", "staged/7/sub"])
def test_other_names_are_not_spate_s(path):
    assert not is_spate_file(path) and not is_spate_dir(path)


def test_recognizers_read_back_what_builders_wrote():
    assert layout.checkpoint_id_of(checkpoint_dir(12)) == 12 and layout.checkpoint_id_of("chk-x") is None
    assert layout.epoch_file_of(layout.claim_path(3).rpartition("/")[2]) == (3, "")
    assert layout.epoch_file_of(layout.seal_path(3).rpartition("/")[2]) == (3, layout.SEAL_SUFFIX)
    assert layout.epoch_file_of(layout.completed_path(3).rpartition("/")[2]) == (3, layout.COMPLETED_SUFFIX)
    assert layout.epoch_of(temporary_path(layout.seal_path(3)).rpartition("/")[2]) == 3
    assert layout.in_subtask_dir(DATA_FILES[1]) and layout.in_worker_dir(DATA_FILES[4])
    assert all(layout.in_shared_or_worker_dir(p) for p in DATA_FILES[1:5])
