"""A staged initial state's clean-up (Spark Connect, :mod:`spate.spark.staged_initial_state`): it deletes what
Spark's Parquet writer wrote under ``_initial/<run>/`` and nothing else, and never follows a link out of the
root. The staging itself runs over a real Connect server in tests/connect/test_connect_stream.py."""

from __future__ import annotations

import os

from spate.fs import CheckpointStorage
from spate.layout import is_spate_file, is_staged_initial_file, staged_initial_dir
from spate.spark.staged_initial_state import remove_staged_initial_states

RUN = "0123456789abcdef0123456789abcdef"
SPARKS = ["part-00000-9f1c2d3e-4b5a-6789-abcd-ef0123456789-c000.snappy.parquet",
          ".part-00000-9f1c2d3e-4b5a-6789-abcd-ef0123456789-c000.snappy.parquet.crc", "_SUCCESS", "._SUCCESS.crc"]


def _touch(path: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write("x")


def test_the_recognizer_knows_sparks_writer_files_only():
    for name in SPARKS:
        rel = f"{staged_initial_dir(RUN)}/{name}"
        assert is_staged_initial_file(rel) and not is_spate_file(rel)  # the root's cleanup leaves them alone
    for rel in (f"{staged_initial_dir(RUN)}/notes.txt", f"_initial/run/{SPARKS[0]}",
                f"{staged_initial_dir(RUN)}/sub/{SPARKS[0]}", f"staged/1/{SPARKS[0]}"):
        assert not is_staged_initial_file(rel), rel


def test_removal_deletes_sparks_files_keeps_others_and_follows_no_link(tmp_path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    for name in SPARKS:
        _touch(str(root / staged_initial_dir(RUN) / name))
    other = "fedcba9876543210fedcba9876543210"
    _touch(str(root / staged_initial_dir(other) / SPARKS[0]))
    _touch(str(root / staged_initial_dir(other) / "notes.txt"))  # not Spark's: stays, and so does its directory
    _touch(str(outside / SPARKS[0]))
    os.symlink(outside, root / staged_initial_dir("ab" * 16))
    remove_staged_initial_states(CheckpointStorage(str(root)))
    assert not (root / staged_initial_dir(RUN)).exists()
    assert sorted(os.listdir(root / staged_initial_dir(other))) == ["notes.txt"]
    assert (outside / SPARKS[0]).exists()
