"""The ``spate`` command: tables by default, JSON with --json, exit codes, and the demo and benchmark smoke
runs (CI runs --quick)."""

from __future__ import annotations

import json
import os
import re

import pytest

from spate import Coordinator, LocalRunner, Processor, ValueStateDescriptor
from spate.checkpoint.inspect import keyed_state_entries, load_checkpoint
from spate.fs import CheckpointStorage
from spate_tools.cli import main

PICKLED = ValueStateDescriptor("blob", serializer="pickle")


class Job(Processor):
    def open(self, ctx):
        self.count = ctx.state(ValueStateDescriptor("count", default=0))
        self.blob = ctx.state(PICKLED)
        self.log = ctx.get_list_state("log")

    def process(self, key, rows, ctx):
        self.count.update(self.count.value() + len(rows))
        self.blob.update(frozenset([key]))
        ctx.register_event_time_timer(1000 + len(rows))
        return None

    def end_batch(self, ctx):
        self.log.add(ctx.batch_id)


@pytest.fixture
def root(tmp_path):
    path = str(tmp_path / "ckpt")
    with LocalRunner(Job, key="k", checkpoint_root=path, parallelism=2, allow_pickle=True) as r:
        r.run([[{"k": "a"}, {"k": "b"}, {"k": "a"}], [{"k": "c"}]])
    return path


def run(capsys, *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().out


def test_list_and_show(root, capsys):
    code, out = run(capsys, "checkpoints", "list", root)
    assert code == 0 and "checkpoint" in out and "parallelism" in out
    code, out = run(capsys, "checkpoints", "list", root, "--json")
    data = json.loads(out)
    assert [c["checkpoint_id"] for c in data["checkpoints"]] == [0, 1]
    code, out = run(capsys, "checkpoints", "show", root, "--checkpoint", "0")
    assert code == 0 and "checkpoint 0" in out and "keyed" in out and "operator" in out
    code, out = run(capsys, "checkpoints", "show", root, "--json")
    assert json.loads(out)["metadata"]["checkpoint_id"] == 1


def test_list_marks_a_corrupt_checkpoint_and_lists_the_others(root, capsys):
    """A corrupt latest _metadata: the older checkpoint is still listed, the corrupt one marked and why."""
    path = os.path.join(root, "chk-1", "_metadata")
    with open(path, "r+b") as f:
        f.seek(40)
        f.write(b"\xff\xfe")
    code, out = run(capsys, "checkpoints", "list", root)
    assert code == 0
    assert re.search(r"\b0 +ok +2 ", out) and re.search(r"\b1 +CORRUPT \(below\)", out), out
    assert re.search(r"checkpoint 1: .*chk-1/_metadata.*checksum", out), out
    code, out = run(capsys, "checkpoints", "list", root, "--json")
    rows = json.loads(out)["checkpoints"]
    assert [(r["checkpoint_id"], r["ok"]) for r in rows] == [(0, True), (1, False)] and "checksum" in rows[1]["problem"]


def test_show_says_per_subtask_where_it_ran_and_how_its_state_got_to_the_base(tmp_path, capsys, monkeypatch):
    """lmdb with the changelog: batches 0-1 keep their state on local disk; a heap runner (another machine) runs
    batch 2; the lmdb runner comes back and catches its copy (at 1) up to 2 by replaying one change set."""
    path, local = str(tmp_path / "ckpt"), str(tmp_path / "local")
    acknowledge = Coordinator.acknowledge

    def on_an_executor(self, ack):  # as the Spark transport does
        ack.executor = f"{ack.index + 1}@10.0.0.{ack.index + 1}"
        return acknowledge(self, ack)

    monkeypatch.setattr(Coordinator, "acknowledge", on_an_executor)
    src = [[{"k": "a"}, {"k": "b"}, {"k": "c"}]] * 4
    kw = dict(key="k", checkpoint_root=path, parallelism=2, changelog=True, allow_pickle=True)
    with LocalRunner(Job, table="lmdb", local_dir=local, **kw) as r:
        r.run(src, until=2)
    with LocalRunner(Job, table="heap", **kw) as r:
        r.run(src, until=3)
    with LocalRunner(Job, table="lmdb", local_dir=local, **kw) as r:
        r.run(src)
    expected = {1: "reused", 2: "restored", 3: "caught_up"}
    for n, recovery in expected.items():
        code, out = run(capsys, "checkpoints", "show", path, "--checkpoint", str(n), "--json")
        subtasks = json.loads(out)["subtasks"]
        assert code == 0 and [s["recovery"] for s in subtasks] == [recovery] * 2, n
        assert [s["executor"] for s in subtasks] == ["1@10.0.0.1", "2@10.0.0.2"]
        assert sum(s["rows"] for s in subtasks) == 3
    caught_up = subtasks
    assert [(s["caught_up_from"], s["restored_from"]) for s in caught_up] == [(1, 2)] * 2
    assert all(s["restore_bytes"] > 0 and s["restore_ms"] > 0 for s in caught_up)
    code, out = run(capsys, "checkpoints", "show", path)
    assert code == 0 and "caught up 1 -> 2" in out and "2@10.0.0.2" in out
    code, out = run(capsys, "checkpoints", "show", path, "--checkpoint", "2")
    assert "restored from 1" in out and "1@10.0.0.1" in out


def test_dump_keyed_operator_and_timers(root, capsys):
    code, out = run(capsys, "state", "dump", root, "--state", "count", "--json")
    rows = json.loads(out)["rows"]
    assert code == 0 and {r["key"]: r["value"] for r in rows} == {"a": 2, "b": 1, "c": 1}
    code, out = run(capsys, "state", "dump", root, "--state", "count")
    assert "key" in out and "a" in out
    code, out = run(capsys, "state", "dump", root, "--state", "log", "--json")
    assert sorted(r["element"] for r in json.loads(out)["rows"]) == [0, 0, 1, 1]
    code, out = run(capsys, "state", "dump", root, "--state", "timers:event", "--json")
    assert sorted((r["key"], r["user_key"]) for r in json.loads(out)["rows"]) == [("a", 1002), ("b", 1001),
                                                                                  ("c", 1001)]


def test_pickled_state_needs_opt_in(root, capsys):
    code = main(["state", "dump", root, "--state", "blob"])
    assert code == 2 and "--allow-pickle" in capsys.readouterr().err
    code, out = run(capsys, "state", "dump", root, "--state", "blob", "--allow-pickle")
    assert code == 0 and "frozenset" in out


def test_unknown_state_is_a_clear_error(root, capsys):
    assert main(["state", "dump", root, "--state", "nope"]) == 2
    assert "no keyed state named 'nope'" in capsys.readouterr().err


def test_verify_exit_codes(root, capsys):
    code, out = run(capsys, "checkpoints", "verify", root, "--json")
    assert code == 0 and json.loads(out)["ok"]
    victim = next(os.path.join(d, f) for d, _, fs in os.walk(os.path.join(root, "shared")) for f in fs)
    with open(victim, "r+b") as f:
        f.seek(25)
        f.write(b"\xff\xfe")
    code, out = run(capsys, "checkpoints", "verify", root)
    assert code == 1 and "checksum mismatch" in out
    assert main(["checkpoints", "verify", os.path.join(root, "empty")]) == 2  # no such root: a usage error


@pytest.mark.parametrize("command", [["checkpoints", "list"], ["checkpoints", "verify"], ["checkpoints", "show"],
                                     ["state", "dump", "--state", "count"]])
def test_a_folder_that_is_not_a_root_is_refused_with_what_a_root_looks_like(root, tmp_path, capsys, command):
    """The folder holding a root (as the demo's output folder does) names the root; an empty one says so."""
    parent = os.path.dirname(root)
    assert main([*command[:2], parent, *command[2:]]) == 2
    err = capsys.readouterr().err
    assert f"{parent} is not a spate checkpoint root: a root holds _query" in err
    assert f"the roots in it: {root}" in err
    (tmp_path / "nothing").mkdir()
    assert main([*command[:2], str(tmp_path / "nothing"), *command[2:]]) == 2
    assert "no query ran there yet" in capsys.readouterr().err


def test_demo_quick_verifies(tmp_path, capsys):
    code, out = run(capsys, "demo", "--local", "--quick", "--json", "--dir", str(tmp_path / "demo"))
    summary = json.loads(out)
    assert code == 0 and summary["verified"] and all(summary["checks"].values())
    assert summary["rescale"]["to_parallelism"] == 3 and summary["rescale"]["subtasks_restored"] == [0, 1, 2]


def test_demo_names_its_root_and_the_next_commands_and_its_folder_is_no_root(tmp_path, capsys):
    """As the issue met it: `spate checkpoints list demo-out` on the demo's folder printed "(none)", exit 0."""
    workdir = tmp_path / "demo-out"
    code, out = run(capsys, "demo", "--local", "--quick", "--dir", str(workdir))
    root = str(workdir / "checkpoints")
    assert code == 0 and f"checkpoint root: {root}" in out and f"spate checkpoints list {root}" in out
    assert main(["checkpoints", "list", str(workdir)]) == 2
    assert f"the roots in it: {root}" in capsys.readouterr().err
    code, out = run(capsys, "checkpoints", "list", root)
    assert code == 0 and re.search(r"\b\d+ +ok ", out)


def test_bench_state_quick_json_shape(tmp_path, capsys):
    code, out = run(capsys, "bench", "state", "--quick", "--json", "--out", str(tmp_path))
    data = json.loads(out)
    assert code == 0 and data["bench"] == "state"
    variants = {(r["variant"], r["op"]) for r in data["results"]}
    assert {("heap", "value_put"), ("lmdb", "map_get"), ("raw-lmdb", "value_get"), ("lmdb", "snapshot"),
            ("heap", "restore")} <= variants
    assert all(r.get("ops_per_s", 0) > 0 or r.get("mb_per_s", 0) > 0 for r in data["results"])
    assert os.path.exists(tmp_path / "state.png")


def test_bench_filemerging_quick_json_shape(tmp_path, capsys):
    code, out = run(capsys, "bench", "filemerging", "--quick", "--json", "--out", str(tmp_path))
    data = json.loads(out)
    by = {r["variant"]: r for r in data["results"]}
    assert code == 0 and data["bench"] == "filemerging" and set(by) == {"off", "within", "across"}
    for r in by.values():
        assert {"files_created", "files_deleted", "files_alive", "space_amplification", "checkpoint_ms_p50",
                "checkpoint_ms_p99"} <= set(r)
        assert r["files_created"] - r["files_deleted"] == r["files_alive"], "every created file is accounted for"
    assert by["across"]["files_created"] < by["within"]["files_created"] < by["off"]["files_created"]
    assert os.path.exists(tmp_path / "filemerging.png")


@pytest.mark.spark
def test_spark_demo_quick_verifies(spark, tmp_path, capsys):
    code, out = run(capsys, "demo", "--quick", "--json", "--dir", str(tmp_path / "demo"))
    summary = json.loads(out)
    assert code == 0 and summary["verified"] and all(summary["checks"].values())
    r = summary["rescale"]
    assert r["to_parallelism"] == 4 and sorted(r["subtasks_restored"] + r["subtasks_from_local_copies"]) == [0, 1, 2, 3]
    assert summary["chart"] and os.path.exists(summary["chart"])


def test_savepoint_of_an_older_checkpoint_when_the_latest_is_corrupt(root, tmp_path, capsys):
    """The way back as the README tells it: the latest _metadata is corrupt, so a restart on the root fails;
    `spate checkpoints savepoint ROOT --checkpoint 0 --to DIR` copies checkpoint 0, checked, and a new query
    restores from it with the state of checkpoint 0."""
    with open(os.path.join(root, "chk-1", "_metadata"), "r+b") as f:
        f.seek(40)
        f.write(b"\xff\xfe")
    target = str(tmp_path / "back" / "sp-0")
    code, out = run(capsys, "checkpoints", "savepoint", root, "--checkpoint", "0", "--to", target)
    assert code == 0 and f"restore_from={target!r}" in out, out
    assert main(["checkpoints", "savepoint", root, "--checkpoint", "1", "--to", str(tmp_path / "sp-1")]) == 1
    assert "checkpoint 1 of" in capsys.readouterr().err and not os.path.exists(tmp_path / "sp-1")
    assert main(["checkpoints", "savepoint", root, "--checkpoint", "0", "--to", os.path.join(root, "x")]) == 1
    assert "inside the checkpoint root" in capsys.readouterr().err
    new_root = str(tmp_path / "new")
    with LocalRunner(Job, key="k", checkpoint_root=new_root, restore_from=target, allow_pickle=True) as r:
        r.run_batch(1, [{"k": "a"}])  # batch 1 again, from checkpoint 0's state
    counts = {e.key: e.value for e in keyed_state_entries(CheckpointStorage(new_root),
                                                         load_checkpoint(CheckpointStorage(new_root)), "count")}
    assert counts == {"a": 3, "b": 1}  # checkpoint 0 had a: 2, b: 1 (batch 1's "c" is not in it)
