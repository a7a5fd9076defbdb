"""A folder of the user's own given as the checkpoint root, as the user met it: it happened to hold a
``chk-1/_metadata`` (another tool's checkpoint) and spate called it "a damaged spate root: restore it from a
backup", though spate never ran there. It is named as not a spate root, with the fix, and left as it was."""

from __future__ import annotations

import os

import pytest

from spate import LocalRunner, Processor
from spate.errors import CheckpointError, NotARootError


class Count(Processor):
    def process(self, key, rows, ctx):
        yield {"key": key, "n": len(rows)}


def _tree(root):
    return sorted((os.path.relpath(os.path.join(d, f), root), open(os.path.join(d, f), "rb").read())
                  for d, _dirs, files in os.walk(root) for f in files)


def _users_folder(tmp_path):
    root = tmp_path / "my-job"
    (root / "chk-1").mkdir(parents=True)
    (root / "chk-1" / "_metadata").write_bytes(b"not spate's: another engine's checkpoint\n")
    (root / "notes.txt").write_text("mine\n")
    return str(root)


def test_a_folder_that_was_never_a_root_is_named_so_and_left_as_it_was(tmp_path):
    root = _users_folder(tmp_path)
    before = _tree(root)
    with pytest.raises(NotARootError) as refused, LocalRunner(Count, key="key", checkpoint_root=root) as runner:
        runner.run_batch(0, [{"key": "a"}])
    message = str(refused.value)
    assert "is not a spate checkpoint root (no _query, no _epochs/: spate never ran a query here)" in message
    assert "chk-1" in message and "notes.txt" in message
    assert "pick an empty or new folder" in message
    assert "damaged" not in message and "backup" not in message
    assert _tree(root) == before and sorted(os.listdir(root)) == ["chk-1", "notes.txt"]  # nothing written or lost


def test_a_spate_root_that_lost_its_query_file_is_still_called_damaged(tmp_path):
    root = str(tmp_path / "root")
    with LocalRunner(Count, key="key", checkpoint_root=root) as runner:
        runner.run_batch(0, [{"key": "a"}])
    os.remove(os.path.join(root, "_query"))
    with pytest.raises(CheckpointError, match="_query is missing but checkpoints exist; the root is damaged: "
                                              "restore it from a backup") as refused, \
            LocalRunner(Count, key="key", checkpoint_root=root) as runner:
        runner.run_batch(1, [{"key": "a"}])
    assert not isinstance(refused.value, NotARootError)


def test_an_empty_folder_is_taken(tmp_path):
    root = tmp_path / "new"
    root.mkdir()
    with LocalRunner(Count, key="key", checkpoint_root=str(root)) as runner:
        assert runner.run_batch(0, [{"key": "a"}]).outputs == [{"key": "a", "n": 1}]
