"""``StatefulStream`` and ``transform_with_state`` on a Spark Connect session (a real Connect server on loopback,
:mod:`helpers.spark_connect`): the run's driver side lives in the server's ``foreachBatch`` process, the subtasks
run in ``mapInArrow``; outputs reach the sink exactly once, through restarts at other parallelisms and a crash
between a checkpoint and its sink, and a failed batch raises spate's error on the client."""

from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter

import pandas as pd
import pytest
from pyspark import cloudpickle
from pyspark.sql import functions as F
from pyspark.sql.streaming import StatefulProcessor, StreamingQueryListener

from helpers.clicks import SCHEMA, CountClicks, clicks, reference_outputs, state
from helpers.file_source import write_files
from helpers.side_by_side import SilenceAlert
from spate import AutoscalePolicy, load_checkpoint, verify_checkpoint
from spate.checkpoint.discovery import list_complete_checkpoints
from spate.errors import SettingError
from spate.fs import CheckpointStorage
from spate.spark.stream import StatefulStream, transform_with_state
from spate.spark.worker_errors import BatchFailedError

pytestmark = pytest.mark.spark
cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the server's Python cannot import the tests


def file_sink(out: str, fail_marker: str | None = None):
    """A sink (it runs on the server) that writes each batch's outputs to ``<out>/batch-<n>.json``, overwriting:
    idempotent per batch id. With ``fail_marker``, its first call after the marker file appears raises once."""
    def sink(df, batch_id):
        rows = sorted([r["user"], r["clicks"], r["batch"]] for r in df.collect())
        if fail_marker is not None and os.path.exists(fail_marker):
            os.remove(fail_marker)
            raise RuntimeError(f"the sink crashed at batch {batch_id} (injected)")
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, f"batch-{batch_id}.json"), "w") as f:
            json.dump(rows, f)
    return sink


def outputs(out: str) -> dict[int, list]:
    return {int(name[6:-5]): json.load(open(os.path.join(out, name))) for name in os.listdir(out)}


def run(connect, source, root, parallelism, sink, start=None, **settings):
    df = connect.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(source)
    stream = StatefulStream(df, "user", CountClicks, "user string, clicks long, batch long", checkpoint_root=root,
                            parallelism=parallelism, **settings)
    query = stream.start(sink, trigger={"availableNow": True}, **(start or {}))
    try:
        query.awaitTermination()
    finally:
        stream.close()
    return stream, query


@pytest.mark.parametrize("table", ["lmdb", "heap"])
def test_exactly_once_through_restarts_at_other_parallelisms(connect, tmp_path, table):
    source, root, out = str(tmp_path / "in"), str(tmp_path / "ckpt"), str(tmp_path / "out")
    batches = clicks(6, seed=2)
    elsewhere = {"spark_checkpoint": f"file://{tmp_path}/spark"}  # Spark's checkpoint given, as a Hadoop URI
    for parallelism, upto in ((2, 2), (3, 4), (1, 6)):
        write_files(source, batches[upto - 2:upto], start=upto - 2)
        run(connect, source, root, parallelism, file_sink(out), elsewhere, table=table,
            local_dir=str(tmp_path / "local"))
        assert load_checkpoint(CheckpointStorage(root)).parallelism == parallelism
    assert outputs(out) == reference_outputs(batches), "every batch's outputs equal a single-process run"
    assert state(root) == dict(Counter(r["user"] for rows in batches for r in rows))
    storage = CheckpointStorage(root)
    assert verify_checkpoint(storage, load_checkpoint(storage)) == []


def test_a_crash_between_checkpoint_and_sink_redelivers_the_batch(connect, tmp_path):
    source, root, out = str(tmp_path / "in"), str(tmp_path / "ckpt"), str(tmp_path / "out")
    marker = str(tmp_path / "crash-once")
    batches = clicks(3, seed=4)
    write_files(source, batches)
    open(marker, "w").close()  # the first sink call raises: checkpoint 0 completed, its outputs not delivered
    with pytest.raises(BatchFailedError, match="the sink crashed at batch 0"):
        run(connect, source, root, 2, file_sink(out, marker))
    assert load_checkpoint(CheckpointStorage(root)).checkpoint_id == 0 and not os.path.exists(out)
    run(connect, source, root, 2, file_sink(out, marker))
    assert outputs(out) == reference_outputs(batches)


class Bad(CountClicks):
    def process(self, key, rows, ctx):
        yield {"user": key, "clicks": "many", "batch": ctx.batch_id}


def test_a_failed_batch_raises_spates_error_on_the_client(connect, tmp_path):
    source = str(tmp_path / "in")
    write_files(source, clicks(1))
    df = connect.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(source)
    stream = StatefulStream(df, "user", Bad, "user string, clicks long, batch long",
                            checkpoint_root=str(tmp_path / "ckpt"), parallelism=2)
    events = Events()
    stream.add_listener(events)
    query = stream.start(file_sink(str(tmp_path / "out")), trigger={"availableNow": True})
    with pytest.raises(BatchFailedError) as failed:
        query.awaitTermination()
    message = str(failed.value)
    assert message.startswith("batch 0 failed on an executor: spate.errors.OutputError: Bad.process for key"), message
    assert "'many'" in message and failed.value.batch_id == 0
    assert isinstance(query.exception(), BatchFailedError)
    stream.close()
    ended = events.order[-1]  # the listener heard of the failure too, Spark's exception text with spate's message
    assert ended[0] == "terminated" and "'many'" in ended[2], events.order


class Events(StreamingQueryListener):
    """The events a stream's listener got on the client, in order."""

    def __init__(self) -> None:
        self.progress: list = []
        self.order: list = []  # (kind, query id)

    def onQueryStarted(self, event) -> None:  # noqa: N802
        self.order.append(("started", str(event.id)))

    def onQueryProgress(self, event) -> None:  # noqa: N802
        self.progress.append(event.progress)
        self.order.append(("progress", str(event.progress.id)))

    def onQueryIdle(self, event) -> None:  # noqa: N802
        pass

    def onQueryTerminated(self, event) -> None:  # noqa: N802
        self.order.append(("terminated", str(event.id), event.exception))


def wait_for(condition, timeout_s=60.0):
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


def test_the_client_sees_figures_progress_and_rescales_through_the_root(connect, tmp_path):
    """metrics, summary(), last_progress and the stream's listeners on the client, with spate's figures read from
    the root; rescale() from the client reaches the running query's driver on the server."""
    source, root, out = str(tmp_path / "in"), str(tmp_path / "ckpt"), str(tmp_path / "out")
    batches = clicks(4, seed=6)
    write_files(source, batches[:2])
    df = connect.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(source)
    stream = StatefulStream(df, "user", CountClicks, "user string, clicks long, batch long", checkpoint_root=root,
                            parallelism=2)
    events = Events()
    stream.add_listener(events)
    query = stream.start(file_sink(out), trigger={"processingTime": "1 second"})
    try:
        wait_for(lambda: [m.batch_id for m in stream.metrics] == [0, 1])
        stream.rescale(3, "by hand")
        write_files(source, batches[2:], start=2)
        wait_for(lambda: [m.batch_id for m in stream.metrics] == [0, 1, 2, 3])
    finally:
        query.stop()
        stream.close()
    assert outputs(out) == reference_outputs(batches)
    assert [m.parallelism for m in stream.metrics] == [2, 2, 3, 3] and stream.settings.parallelism == 3
    assert [m.rows for m in stream.metrics] == [len(b) for b in batches]
    assert stream.rescales[-1]["to"] == 3 and stream.rescales[-1]["reason"] == "by hand"
    summary = stream.summary()
    assert summary["batches"] == 4 and summary["rows"] == sum(map(len, batches)) and summary["parallelism"] == 3
    assert 0 <= summary["local_reuse"] <= 1 and summary["batch_ms_p50"] > 0
    spate_progress = [p for p in events.progress if "spate" in p.observedMetrics]
    assert [p.batchId for p in spate_progress] == [0, 1, 2, 3]
    # before the rescale every subtask counts its entries (after it, one built over old copies may not, until folded)
    assert spate_progress[1].observedMetrics["spate"].state_rows == len({r["user"] for b in batches[:2] for r in b})
    assert stream.last_progress is not None and stream.last_progress.batchId >= 3
    assert not os.listdir(os.path.join(root, "_requests")), "the driver took the request"
    # the query's start first, its end last (stopped: no exception), every event of this query
    qid = str(query.id)
    assert events.order[0] == ("started", qid) and events.order[-1] == ("terminated", qid, None)
    assert {e[1] for e in events.order} == {qid} and [e[0] for e in events.order[1:-1]] == [
        "progress"] * (len(events.order) - 2)


def test_a_timer_fires_on_an_idle_stream(connect, tmp_path):
    """transform_with_state over Connect, every user silent after one file: the alerts come in batches without
    input (the tick source, its wake file in the root), once each, and an idle query with nothing due runs no
    batch."""
    source, root, out = str(tmp_path / "in"), str(tmp_path / "ckpt"), str(tmp_path / "out")
    write_files(source, [[{"user": "a"}, {"user": "b"}]])
    df = connect.readStream.schema("user string").json(source)
    stream = transform_with_state(df, "user", SilenceAlert(), "user string, value string",
                                  time_mode="ProcessingTime", checkpoint_root=root, parallelism=2,
                                  idle_batches=True)

    def sink(outputs, batch_id):
        rows = sorted([r["user"], r["value"]] for r in outputs.collect())
        if rows:
            os.makedirs(out, exist_ok=True)
            with open(os.path.join(out, f"batch-{batch_id}.json"), "w") as f:
                json.dump(rows, f)

    query = stream.start(sink, trigger={"processingTime": "500 milliseconds"})
    try:
        wait_for(lambda: os.path.isdir(out) and sum(len(rows) for rows in outputs(out).values()) >= 2)
        time.sleep(2.5)  # nothing more is due: no more batches
        checkpoints = len(list_complete_checkpoints(CheckpointStorage(root)))
        time.sleep(1.5)
        assert len(list_complete_checkpoints(CheckpointStorage(root))) == checkpoints, "an idle query ran a batch"
    finally:
        query.stop()
        stream.close()
    alerts = outputs(out)
    assert sorted(row for rows in alerts.values() for row in rows) == [["a", "silent"], ["b", "silent"]]
    assert min(alerts) > 0, "fired in a batch without input"
    assert os.path.isfile(os.path.join(root, "_ticks", "wake.json"))


class ClicksFrom(StatefulProcessor):
    """Counts a user's clicks from the count an initial state gives (``handleInitialState``)."""

    def init(self, handle):
        self.count = handle.getValueState("count", "n long")

    def handleInitialState(self, key, initial, timerValues):  # noqa: N802,N803
        self.count.update((int(initial["n"].sum()),))

    def handleInputRows(self, key, rows, timerValues):  # noqa: N802,N803
        n = sum(len(df) for df in rows) + (self.count.get()[0] if self.count.exists() else 0)
        self.count.update((n,))
        yield pd.DataFrame({"user": [key[0]], "clicks": [n]})

    def close(self):
        pass


def test_an_initial_state_goes_into_the_first_run_only(connect, tmp_path):
    """The initial state (``df.groupBy(key)`` of a client DataFrame) is staged in the root for the server's
    driver, routed into the new query's first batch, and deleted once the query has a checkpoint; a restart given
    it again keeps the checkpoint's state, as on Spark."""
    source, root, out = str(tmp_path / "in"), str(tmp_path / "ckpt"), str(tmp_path / "out")
    initial = connect.createDataFrame([("ann", 10), ("cid", 5)], "user string, n long").groupBy("user")
    for batch, users in enumerate((["ann", "ann", "bob"], ["ann", "cid"])):
        write_files(source, [[{"user": u, "page": "/", "ts": 0} for u in users]], start=batch)
        df = connect.readStream.schema(SCHEMA).json(source)
        stream = transform_with_state(df, "user", ClicksFrom(), "user string, clicks long", checkpoint_root=root,
                                      parallelism=2, initial_state=initial)
        stream.start(lambda d, n: d.write.mode("overwrite").json(f"{out}/{n}"),
                     trigger={"availableNow": True}).awaitTermination()
        stream.close()
        assert not os.path.exists(os.path.join(root, "_initial"))
    got = {n: sorted(tuple(r) for r in connect.read.schema("user string, clicks long").json(f"{out}/{n}").collect())
           for n in (0, 1)}
    assert got == {0: [("ann", 12), ("bob", 1)], 1: [("ann", 13), ("cid", 6)]}


def test_the_autoscaler_rescales_a_running_stream_on_the_server(connect, tmp_path):
    """A target no batch can meet: the autoscaler (in the server's foreachBatch process) doubles the parallelism
    up to the policy's maximum; the client sees the rescales and their reasons through the root."""
    source, root, out = str(tmp_path / "in"), str(tmp_path / "ckpt"), str(tmp_path / "out")
    batches = clicks(5, seed=2)
    write_files(source, batches)
    policy = AutoscalePolicy(min_parallelism=1, max_parallelism=4, target_batch_ms=0.001, cooldown_batches=1)
    stream, _query = run(connect, source, root, 1, file_sink(out), autoscale=policy)
    assert outputs(out) == reference_outputs(batches)
    assert [m.parallelism for m in stream.metrics] == [1, 2, 2, 4, 4]
    assert [(r["from"], r["to"]) for r in stream.rescales] == [(1, 2), (2, 4)]
    assert all("target" in r["reason"] for r in stream.rescales), stream.rescales


def test_what_connect_cannot_do_is_refused_before_anything_is_written(connect, tmp_path):
    """The autoscaler's backlog rule (Spark's progress of the query is not visible where it runs), a driver-local
    copy of Spark's checkpoint (Spark's driver is the server), and an initial state on a root Spark cannot
    write by path: each refused with the fix, at start(), with nothing written."""
    source, root = str(tmp_path / "in"), str(tmp_path / "ckpt")
    write_files(source, clicks(1))
    df = connect.readStream.schema(SCHEMA).json(source)
    initial = connect.createDataFrame([("ann", 1)], "user string, n long").groupBy("user")

    def stream(checkpoint_root=root, **settings):
        return StatefulStream(df, "user", CountClicks, "user string, clicks long, batch long",
                              checkpoint_root=checkpoint_root, parallelism=1, **settings)

    backlog = AutoscalePolicy(min_parallelism=1, max_parallelism=4, max_backlog_rows=100)
    with pytest.raises(SettingError, match="max_backlog_rows is not available on a Spark Connect session.*"
                                           "target_batch_ms"):
        stream(autoscale=backlog).start(lambda d, n: None)
    with pytest.raises(SettingError, match="spark_checkpoint_cache is not available on a Spark Connect session"):
        stream().start(lambda d, n: None, spark_checkpoint_cache=str(tmp_path / "cache"))
    s3 = "s3://bucket/ckpt?endpoint_override=127.0.0.1:9&scheme=http&region=us-east-1"
    with pytest.raises(SettingError, match="initial_state on a Spark Connect session is staged in the checkpoint "
                                           "root.*write_savepoint"):
        transform_with_state(df, "user", ClicksFrom(), "user string, clicks long", checkpoint_root=s3,
                             parallelism=1, initial_state=initial).start(lambda d, n: None,
                                                                          spark_checkpoint=f"file://{tmp_path}/s")
    assert sorted(os.listdir(tmp_path)) == ["in"], "refused before anything was written"


def test_an_initial_state_parquet_cannot_hold_is_a_setting_error(connect, tmp_path):
    """An initial state with a column Spark's Parquet writer refuses (an interval of ``make_interval``): a
    SettingError naming the cast, raised at start(), nothing of the query run; the same start with the column
    cast goes on from there."""
    source, root, out = str(tmp_path / "in"), str(tmp_path / "ckpt"), str(tmp_path / "out")
    write_files(source, [[{"user": "ann", "page": "/", "ts": 0}]])
    df = connect.readStream.schema(SCHEMA).json(source)
    rows = connect.createDataFrame([("ann", 10)], "user string, n long").withColumn(
        "note", F.expr("make_interval(0, 0, 0, 1, 0, 0, 0)"))

    def stream(initial):
        return transform_with_state(df, "user", ClicksFrom(), "user string, clicks long", checkpoint_root=root,
                                    parallelism=1, initial_state=initial.groupBy("user"))

    with pytest.raises(SettingError, match="could not write it.*INTERVAL.*cast\\('string'\\)"):
        stream(rows).start(lambda d, n: d.write.json(f"{out}/{n}"))
    assert not os.path.exists(out)
    fixed = stream(rows.withColumn("note", F.col("note").cast("string")))
    fixed.start(lambda d, n: d.write.json(f"{out}/{n}"), trigger={"availableNow": True}).awaitTermination()
    fixed.close()
    assert [tuple(r) for r in connect.read.schema("user string, clicks long").json(f"{out}/0").collect()] == \
        [("ann", 11)]
    assert not os.path.exists(os.path.join(root, "_initial"))
