"""The mistakes a new user makes with ``LocalRunner``, as they make them: each is a ``SpateError`` that names the
argument (or the key, batch and subtask) and the fix, and nothing already checkpointed is lost."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from spate import LocalRunner, Processor, SpateError, ValueStateDescriptor, load_checkpoint, verify_checkpoint
from spate.fs import CheckpointStorage

COUNT = ValueStateDescriptor("count", default=0)


class Count(Processor):
    def open(self, ctx):
        self.count = ctx.state(COUNT)

    def process(self, key, rows, ctx):
        self.count.update(self.count.value() + len(rows))
        yield {"user": key, "count": self.count.value()}


def test_a_row_without_the_key_column_names_the_column_and_the_rows_columns(tmp_path):
    with LocalRunner(Count, key="user", checkpoint_root=str(tmp_path / "c")) as runner:
        runner.run_batch(0, [{"user": "a"}])
        with pytest.raises(SpateError, match=r"input row \{'usr': 'b'\} has no key column 'user': each input row "
                                             r"must be a dict holding the key= columns; its columns: \['usr'\]"):
            runner.run_batch(1, [{"usr": "b"}])
        assert [o["count"] for o in runner.run_batch(1, [{"user": "a"}]).outputs] == [2], "nothing was lost"


def test_a_key_function_that_fails_is_named(tmp_path):
    runner = LocalRunner(Count, key=lambda row: row["user"].lower(), checkpoint_root=str(tmp_path / "c"))
    with runner, pytest.raises(SpateError, match=r"the key function failed on input row \{'user': 3\}: Attribute"):
        runner.run_batch(0, [{"user": 3}])


def test_a_root_that_is_a_file(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(SpateError, match=r"checkpoint root .*notes.txt is a file; a root is a directory .*pass a "
                                         r"directory path"):
        LocalRunner(Count, key="user", checkpoint_root=str(tmp_path / "notes.txt"))
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_a_parallelism_given_as_text(tmp_path):
    with pytest.raises(SpateError, match=r"parallelism must be an int, got '2' \(str\): pass parallelism=2"):
        LocalRunner(Count, key="user", checkpoint_root=str(tmp_path / "c"), parallelism="2")
    with LocalRunner(Count, key="user", checkpoint_root=str(tmp_path / "c"), parallelism=np.int64(2)) as runner:
        assert runner.parallelism == 2 and type(runner.settings.parallelism) is int


def test_a_hadoop_style_s3a_root(tmp_path):
    with pytest.raises(SpateError, match=r"checkpoint root s3a://bucket/q: pyarrow opens no file system for it .*"
                                         r"s3:// \(not s3a://: that is Hadoop's name for S3\)"):
        LocalRunner(Count, key="user", checkpoint_root="s3a://bucket/q")


class Boom(Processor):
    def process(self, key, rows, ctx):
        if key == "b":
            raise ZeroDivisionError("the user's bug")
        yield {"user": key}


def test_a_processors_exception_carries_its_key_batch_and_subtask(tmp_path):
    with LocalRunner(Boom, key="user", checkpoint_root=str(tmp_path / "c"), parallelism=1) as runner:
        runner.run_batch(0, [{"user": "a"}])
        with pytest.raises(ZeroDivisionError, match="the user's bug") as e:
            runner.run_batch(1, [{"user": "a"}, {"user": "b"}])
    assert e.value.__notes__ == ["spate: in Boom, batch 1, subtask 0 of 1, key 'b'"]


def test_a_new_root_starts_from_an_older_retained_checkpoint_of_another(tmp_path):
    """The documented way back to an older checkpoint: restore_from='<root>/chk-<n>' into a new root. Subtasks
    that get no rows in the new root's first batch still hold restored state: the new root must not name the
    old root's files for it."""
    old, new = str(tmp_path / "old"), str(tmp_path / "new")
    users = [f"u{i}" for i in range(20)]
    with LocalRunner(Count, key="user", checkpoint_root=old, parallelism=2) as runner:
        for n in range(3):
            runner.run_batch(n, [{"user": u} for u in users])
    for parallelism in (2, 3):
        root = f"{new}-{parallelism}"
        with LocalRunner(Count, key="user", checkpoint_root=root, parallelism=parallelism,
                         restore_from=f"{old}/chk-1") as runner:
            got = [(o["user"], o["count"]) for o in runner.run_batch(0, [{"user": "u0"}]).outputs]
        assert got == [("u0", 3)], "the state of checkpoint 1 (2 each), not of the latest (3 each)"
        storage = CheckpointStorage(root)
        assert verify_checkpoint(storage, load_checkpoint(storage)) == []
    with pytest.raises(SpateError, match=r"no savepoint or retained checkpoint at .*old/chk-9: .*old/chk-9/_metadata "
                                         r"is missing .*`spate checkpoints list <root>` shows the retained ones"):
        LocalRunner(Count, key="user", checkpoint_root=str(tmp_path / "third"), restore_from=f"{old}/chk-9")
    shutil.rmtree(old)  # the new roots hold all they need
    with LocalRunner(Count, key="user", checkpoint_root=f"{new}-2", parallelism=2) as runner:
        got = sorted((o["user"], o["count"]) for o in runner.run_batch(1, [{"user": u} for u in users]).outputs)
    assert got == sorted((u, 4 if u == "u0" else 3) for u in users)


class Tags(Processor):
    def process(self, key, rows, ctx):
        yield {"user": key, "tags": {r["tag"] for r in rows}}  # a set: msgpack cannot store it


def test_an_output_value_that_cannot_be_stored_fails_its_batch_naming_key_and_field_without_a_schema(tmp_path):
    from spate.errors import OutputError

    with LocalRunner(Tags, key="user", checkpoint_root=str(tmp_path / "c")) as runner:
        with pytest.raises(OutputError, match=r"Tags.process for key 'ann' produced field 'tags' = \{'x'\} of type "
                                              r"set, which outputs cannot store .*convert it \(a list for a set"):
            runner.run_batch(0, [{"user": "ann", "tag": "x"}])
        assert runner.next_batch_id == 0, "the batch failed before its checkpoint"
