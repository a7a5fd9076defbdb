"""Spark's own checkpoint for roots Hadoop cannot open (s3://, other pyarrow URIs): a driver-local copy that spate
mirrors into ``<root>/_spark`` before each batch's checkpoint can complete and restores from it on start, so a
driver restarted on another machine resumes Spark's offsets (spate/spark/spark_checkpoint.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import Counter

import pytest

from helpers.clicks import JOB, CountClicks, clicks, job_outputs, reference_outputs, run_stream, state
from helpers.file_source import write_files
from spate.errors import CheckpointError, FencedError
from spate.fs import CheckpointStorage
from spate.spark.spark_checkpoint import SparkCheckpointMirror, check_locations, hadoop_opens
from spate_tools.cli import main as cli


# -- where Spark's checkpoint goes ---------------------------------------------------------------------------
def test_hadoop_opens_local_and_hdfs_roots_as_written_only():
    assert hadoop_opens("/data/ckpt") and hadoop_opens("relative/ckpt") and hadoop_opens("file:///data/ckpt")
    assert hadoop_opens("hdfs://nn:8020/q") and hadoop_opens("viewfs://cluster/q")
    assert not hadoop_opens("s3://bucket/q")
    assert not hadoop_opens("s3://bucket/q?endpoint_override=127.0.0.1:9000&scheme=http")
    assert not hadoop_opens("gs://bucket/q") and not hadoop_opens("abfs://c@acct.dfs.core.windows.net/q")
    assert not hadoop_opens("hdfs://nn:8020/q?user=spark"), "pyarrow options are not a Hadoop path"


def test_bad_locations_are_refused_with_the_fix():
    with pytest.raises(ValueError, match=r"use s3://bucket/q"):
        check_locations(None, "s3a://bucket/q", None, None)
    with pytest.raises(ValueError, match="not both"):
        check_locations(None, "s3://b/q", "/tmp/x", "/tmp/y")
    with pytest.raises(ValueError, match=r"carries \?options.*omit spark_checkpoint") as e:
        check_locations(None, "s3://b/q", "s3://AKEY:SECRET@b/q/_spark?endpoint_override=h:1", None)
    assert "SECRET" not in str(e.value), "credentials are not echoed"


@pytest.mark.spark
def test_a_spark_checkpoint_hadoop_cannot_open_is_refused_before_the_root_is_touched(spark, tmp_path):
    from spate.spark.stream import StatefulStream

    os.makedirs(tmp_path / "in")
    df = spark.readStream.schema("user string").json(str(tmp_path / "in"))
    root = str(tmp_path / "root")
    stream = StatefulStream(df, "user", CountClicks, "user string", checkpoint_root=root)
    with pytest.raises(ValueError, match=r'no file system for the scheme \'s3\'.*"s3a://".*Omit spark_checkpoint'):
        stream.start(spark_checkpoint="s3://bucket/q/_spark")
    assert not os.path.exists(root), "nothing was written"
    check_locations(spark, root, str(tmp_path / "spark"), None)  # a plain path is fine
    check_locations(spark, root, f"file://{tmp_path}/spark", None)


# -- the mirror, on local directories ------------------------------------------------------------------------
def spark_files(local: str, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = os.path.join(local, "checkpoint", rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)


def remote_files(remote: CheckpointStorage) -> dict[str, str]:
    return {rel: remote.read(rel).decode() for rel, _size in remote.list_files()}


def new_mirror(tmp_path, name="machine-a", fence=None):
    return SparkCheckpointMirror(CheckpointStorage(str(tmp_path / "root")).sub("_spark"), str(tmp_path / name),
                                 fence=fence)


def batch(n: int) -> dict[str, str]:
    """What Spark wrote locally when foreachBatch(n) is called: commit n-1, source log n, offsets n."""
    files = {f"sources/0/{n}": f"v1\nfile-{n}", f"offsets/{n}": f"v1\n{{}}\n{{\"logOffset\":{n}}}"}
    return files | ({f"commits/{n - 1}": "v1\n{}"} if n else {"metadata": '{"id":"q"}'})


def test_mirror_uploads_new_files_only_in_order_and_skips_links_and_dot_files(tmp_path):
    mirror = new_mirror(tmp_path)
    mirror.open(None)
    local = str(tmp_path / "machine-a")
    spark_files(local, batch(0) | {"offsets/.0.crc": "crc"})
    os.symlink("/etc/hostname", os.path.join(local, "checkpoint", "offsets", "9"))
    created: list[str] = []
    real = mirror.remote.create_exclusive
    mirror.remote.create_exclusive = lambda rel, data: (created.append(rel), real(rel, data))[1]
    mirror.sync()
    assert created == ["metadata", "sources/0/0", "offsets/0"], "source log before the offsets that refer to it"
    assert remote_files(mirror.remote) == batch(0)
    mirror.sync()
    assert len(created) == 3, "nothing new, nothing uploaded"
    spark_files(local, batch(1))
    mirror.sync()
    assert created[3:] == ["sources/0/1", "offsets/1", "commits/0"]
    assert remote_files(mirror.remote) == batch(0) | batch(1)


def test_mirror_deletes_only_what_spark_purged(tmp_path):
    mirror = new_mirror(tmp_path)
    mirror.open(None)
    local = os.path.join(str(tmp_path / "machine-a"), "checkpoint")
    for n in range(4):
        spark_files(str(tmp_path / "machine-a"), batch(n))
    mirror.sync()
    mirror.remote.write("notes.txt", b"a user's file")  # not spate's: never deleted
    for rel in ("offsets/0", "commits/0", "sources/0/0", "metadata", "offsets/3"):
        os.remove(os.path.join(local, rel))
    mirror.sync()
    left = set(remote_files(mirror.remote))
    assert not left & {"offsets/0", "commits/0", "sources/0/0"}, "Spark's purge of old log entries is mirrored"
    assert {"metadata", "offsets/3", "notes.txt"} <= left, "never the metadata, a newest entry or a foreign file"


def test_mirror_restores_a_missing_or_foreign_local_copy_and_reuses_a_current_one(tmp_path):
    a = new_mirror(tmp_path)
    a.open(None)
    for n in range(3):
        spark_files(str(tmp_path / "machine-a"), batch(n))
        a.sync()
    spark_files(str(tmp_path / "machine-a"), {"commits/2": "v1\n{}"})  # written after the last batch's sync

    again = new_mirror(tmp_path)  # the same machine restarts: its copy is the root's
    again.open(2)
    assert again.reused_local and again.downloaded == 0
    assert "commits/2" in remote_files(again.remote), "what Spark wrote after the last sync is uploaded"

    b = new_mirror(tmp_path, "machine-b")  # a new machine: restored from the root
    b.open(2)
    assert not b.reused_local and b.downloaded == len(remote_files(b.remote))
    restored = str(tmp_path / "machine-b" / "checkpoint")
    assert {os.path.relpath(os.path.join(d, f), restored) for d, _, fs in os.walk(restored) for f in fs} == \
        set(remote_files(b.remote))
    spark_files(str(tmp_path / "machine-b"), batch(3))
    b.sync()

    spark_files(str(tmp_path / "machine-a"), {"offsets/3": "stale, never uploaded"})
    a_again = new_mirror(tmp_path)  # machine A comes back: B ran the query since, A's copy is stale
    a_again.open(3)
    assert not a_again.reused_local
    with open(tmp_path / "machine-a" / "checkpoint" / "offsets" / "3") as f:
        assert f.read() == batch(3)["offsets/3"], "the root's copy replaced the stale one"
    assert not [n for n in os.listdir(tmp_path / "machine-a") if n.endswith((".tmp", ".old"))]


def test_a_local_copy_that_lost_a_file_is_restored(tmp_path):
    a = new_mirror(tmp_path)
    a.open(None)
    spark_files(str(tmp_path / "machine-a"), batch(0))
    a.sync()
    os.remove(tmp_path / "machine-a" / "checkpoint" / "metadata")  # e.g. a temp-file cleaner
    again = new_mirror(tmp_path)
    again.open(0)
    assert not again.reused_local and os.path.exists(tmp_path / "machine-a" / "checkpoint" / "metadata")


def test_a_log_entry_another_driver_wrote_differently_is_an_error(tmp_path):
    a, b = new_mirror(tmp_path), new_mirror(tmp_path, "machine-b")
    a.open(None)
    b.open(None)
    spark_files(str(tmp_path / "machine-a"), batch(0))
    a.sync()
    spark_files(str(tmp_path / "machine-b"), batch(0) | {"offsets/0": "v1\n{}\n{\"logOffset\":7}"})
    with pytest.raises(CheckpointError, match=r"_spark/offsets/0: .*another driver ran this query"):
        b.sync()
    assert remote_files(a.remote)["offsets/0"] == batch(0)["offsets/0"], "the root's entry is kept"


def test_a_fenced_driver_uploads_nothing(tmp_path):
    def fenced():
        raise FencedError("taken over")

    mirror = new_mirror(tmp_path, fence=fenced)
    mirror.open(None)
    spark_files(str(tmp_path / "machine-a"), batch(0))
    with pytest.raises(FencedError):
        mirror.sync()
    assert remote_files(mirror.remote) == {}


def test_a_spark_checkpoint_behind_spates_is_refused_and_the_local_copy_kept(tmp_path):
    a = new_mirror(tmp_path)
    a.open(None)
    for n in range(2):
        spark_files(str(tmp_path / "machine-a"), batch(n))
        a.sync()
    shutil.rmtree(tmp_path / "root" / "_spark")  # lost, or the query ran with another spark_checkpoint
    with pytest.raises(CheckpointError, match=r"complete checkpoint 1, but Spark's own checkpoint in it .* holds no "
                                              r"offsets.*was left as it was.*spark_checkpoint=\.\.\.\), pass that"):
        new_mirror(tmp_path).open(1)
    assert os.path.exists(tmp_path / "machine-a" / "checkpoint" / "offsets" / "1")


@pytest.mark.spark
def test_a_local_root_whose_spark_checkpoint_was_lost_is_refused_not_skipped(spark, tmp_path):
    """As a user met it: on a local root (Spark writes its checkpoint in <root>/_spark itself), ``_spark`` deleted
    and a new file added; the restart skipped batch 0 as done, so the new file's rows were never counted. Now
    the start is refused, nothing is written, and the state is as the last checkpoint left it."""
    source, root = str(tmp_path / "in"), str(tmp_path / "root")
    batches = clicks(3)
    write_files(source, batches[:2])
    run_stream(spark, source, root, 2, {})
    before = state(root)
    shutil.rmtree(os.path.join(root, "_spark"))
    write_files(source, batches[2:], start=2)
    with pytest.raises(CheckpointError, match=r"complete checkpoint 1, but Spark's own checkpoint in it .* holds no "
                                              r"offsets.*losing their rows"):
        run_stream(spark, source, root, 2, {})
    assert state(root) == before and not os.path.exists(os.path.join(root, "_spark"))


# -- on Spark, with the root on S3 (moto on loopback) ---------------------------------------------------------
@pytest.mark.spark
def test_s3_root_needs_no_spark_checkpoint_and_resumes_on_a_new_machine(spark, s3_uri, tmp_path,
                                                                          monkeypatch):
    """Three batches on machine A; its local Spark checkpoint is deleted (machine B); B resumes Spark's offsets
    from the root. B's source reads every remaining file in one batch: a Spark that started over would put the
    already processed files into that batch, and spate would skip it as done, losing the new files."""
    from spate.spark.stream import StatefulStream

    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # the default driver-local directory: ~/.spate/...
    # credentials in the root's URI: Spark's Python workers do not see the driver's AWS_* variables
    source, root = str(tmp_path / "in"), s3_uri("no-spark-checkpoint").replace("s3://", "s3://testing:testing@")
    batches = clicks(6, seed=5)
    write_files(source, batches[:3])
    sink_log: dict = {}

    def run(max_files):
        reader = spark.readStream.schema("user string, page string, n long")
        df = (reader.option("maxFilesPerTrigger", max_files) if max_files else reader).json(source)
        stream = StatefulStream(df, "user", CountClicks, "user string, clicks long, batch long",
                                checkpoint_root=root, parallelism=2, table="heap")

        def sink(out, batch_id):
            sink_log.setdefault(batch_id, []).append(sorted([r.user, r.clicks, r.batch] for r in out.collect()))

        query = stream.start(sink, trigger={"availableNow": True})
        query.awaitTermination()
        assert query.exception() is None
        stream.close()
        return stream

    first = run(1)
    location = first.spark_checkpoint.location
    assert location.startswith(f"file://{tmp_path}/home/.spate/spark-checkpoints/"), location
    remote = CheckpointStorage(root).sub("_spark")
    mirrored = {rel for rel, _ in remote.list_files()}
    assert {"metadata", "offsets/2", "commits/1", "sources/0/2"} <= mirrored and not [
        r for r in mirrored if "/." in r or r.startswith(".")], "Spark's files, not its .crc checksums"
    assert cli(["checkpoints", "verify", root]) == 0

    shutil.rmtree(first.spark_checkpoint.mirror.local_dir)  # a new machine
    write_files(source, batches[3:], start=3)
    second = run(0)
    assert not second.spark_checkpoint.mirror.reused_local and second.spark_checkpoint.mirror.downloaded
    assert [(m.batch_id, m.replayed) for m in second.metrics] == [(2, True), (3, False)], \
        "batch 2 (its commit never reached the root) is re-run by Spark and skipped by spate; batch 3 is new"
    want = reference_outputs(batches[:3] + [batches[3] + batches[4] + batches[5]])
    assert {b: runs for b, runs in sink_log.items()} == {b: [rows] for b, rows in want.items()}, \
        "every batch reached the sink once, equal to a single-process run"
    assert state(root) == dict(Counter(r["user"] for rows in batches for r in rows))
    assert "offsets/3" in {rel for rel, _ in remote.list_files()}
    assert cli(["checkpoints", "verify", root]) == 0


@pytest.mark.spark
@pytest.mark.parametrize("fault", ["driver-dies-after-checkpoint:2", "driver-dies-mid-batch:2"])
def test_driver_dies_and_restarts_on_a_new_machine_with_an_s3_root(s3_uri, tmp_path, fault):
    """The driver process dies after checkpoint 2 completed (inside the sink), or before it completed; its local
    Spark checkpoint is lost with its machine; the restart resumes from the root, reading every remaining file
    in one batch. No batch is lost or duplicated: the outputs equal a fault-free single-process run."""
    source, out = str(tmp_path / "in"), str(tmp_path / "out")
    root = s3_uri(f"dies-{fault.partition(':')[0]}")
    batches = clicks(5, seed=11)
    write_files(source, batches)

    def job(fault="", expect=0, max_files=1):
        proc = subprocess.run([sys.executable, JOB, source, root, out, "2", fault, "--max-files", str(max_files),
                               "--spark-checkpoint-cache", str(tmp_path / "machine")],
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == expect, proc.stderr[-3000:]

    job(fault, expect=17)
    assert os.listdir(tmp_path / "machine")
    shutil.rmtree(tmp_path / "machine")  # the machine is gone
    job(max_files=0)
    want = reference_outputs(batches[:3] + [batches[3] + batches[4]])
    assert job_outputs(out, 4) == want, "every batch's outputs equal a fault-free run"
    assert not os.path.exists(os.path.join(out, "batch-4.json")), "the remaining files were one batch"
    assert state(root) == dict(Counter(r["user"] for rows in batches for r in rows)), "state counted once"
    with open(os.path.join(out, "summary.json")) as f:
        summary = json.load(f)
    if fault.startswith("driver-dies-after-checkpoint"):  # Spark re-runs batch 2, spate skips it
        assert summary["replayed"] == [2] and summary["redelivered"] == [2], summary
    else:  # checkpoint 2 never completed: Spark re-runs batch 2 from its logged offsets, spate processes it
        assert summary["replayed"] == [] and summary["metrics"][0]["batch_id"] == 2, summary
