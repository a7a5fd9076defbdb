"""spate's figures in the query's progress, where Spark users look: a ``StreamingQueryListener`` added to the
stream gets each batch's progress with a ``stateOperators`` entry named ``spate`` and ``observedMetrics["spate"]``;
``stream.last_progress`` holds the same. The state row counts are compared with Spark's own for the same
processor and input (Spark's transformWithState on RocksDB reports them in its ``stateOperators`` entry)."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator

import pandas as pd
import pytest
from pyspark import cloudpickle
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle, StreamingQueryListener

from helpers.file_source import write_files
from helpers.spark_query import drain
from helpers.spark_session import spark_conf

pytestmark = pytest.mark.spark
cloudpickle.register_pickle_by_value(sys.modules[__name__])
ROCKSDB = {"spark.sql.streaming.stateStore.providerClass":
           "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"}
# two batches: 3 users, then 2 of them again and a new one; each row's n becomes a map entry of its user
BATCHES = [[{"user": u, "n": n} for u, n in [("a", 1), ("a", 2), ("b", 1), ("c", 7)]],
           [{"user": u, "n": n} for u, n in [("a", 3), ("b", 1), ("d", 5)]]]


class CountsAndSeen(StatefulProcessor):
    """A count per user (value state) and the numbers it sent (map state, one entry per distinct number)."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.count = handle.getValueState("count", "c long")
        self.seen = handle.getMapState("seen", "n long", "x boolean")

    def handleInputRows(self, key, rows, timerValues) -> Iterator[pd.DataFrame]:  # noqa: N802,N803
        total = self.count.get()[0] if self.count.exists() else 0
        for df in rows:
            total += len(df)
            for n in df["n"]:
                self.seen.updateValue((int(n),), (True,))
        self.count.update((total,))
        yield pd.DataFrame({"user": [key[0]], "count": [total]})

    def close(self) -> None:
        pass


class Recorder(StreamingQueryListener):
    def __init__(self) -> None:
        self.events: list = []

    def onQueryStarted(self, event) -> None:  # noqa: N802
        self.events.append(("started", event))

    def onQueryProgress(self, event) -> None:  # noqa: N802
        self.events.append(("progress", event.progress))

    def onQueryIdle(self, event) -> None:  # noqa: N802
        pass

    def onQueryTerminated(self, event) -> None:  # noqa: N802
        self.events.append(("terminated", event))

    def progress(self, batch_id: int, timeout_s: float = 60.0):
        """The progress of ``batch_id`` once Spark's listener bus delivered it."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = [p for kind, p in self.events if kind == "progress" and p.batchId == batch_id]
            if found:
                return found[-1]
            time.sleep(0.1)
        raise AssertionError(f"no progress event of batch {batch_id} within {timeout_s} s: {self.events}")


def _source(spark, tmp_path):
    source = str(tmp_path / "in")
    write_files(source, BATCHES)
    return spark.readStream.schema("user string, n long").option("maxFilesPerTrigger", 1).json(source)


def _spark_state_rows(spark, tmp_path) -> dict[int, tuple[int, int]]:
    """Spark's (numRowsTotal, numRowsUpdated) of its transformWithState, per batch."""
    with spark_conf(spark, **ROCKSDB, **{"spark.sql.shuffle.partitions": "2"}):
        tws = _source(spark, tmp_path).groupBy("user").transformWithStateInPandas(
            CountsAndSeen(), "user string, count long", "Update", "None")
        query = drain(lambda: tws.writeStream.foreachBatch(lambda df, i: df.collect()).option(
            "checkpointLocation", str(tmp_path / "spark")).start())
        progress = {p["batchId"]: p for p in query.recentProgress if p["numInputRows"]}
    return {b: (p["stateOperators"][0]["numRowsTotal"], p["stateOperators"][0]["numRowsUpdated"])
            for b, p in progress.items()}


def _started(df, tmp_path, parallelism=2):
    """spate's query over ``df`` with a :class:`Recorder` added, run to the end of its input."""
    from spate.spark.stream import transform_with_state

    stream = transform_with_state(df, "user", CountsAndSeen(), "user string, count long",
                                  checkpoint_root=str(tmp_path / "spate"), parallelism=parallelism,
                                  local_dir=str(tmp_path / "spate-local"), idle_batches=False)
    recorder = Recorder()
    stream.add_listener(recorder)
    try:
        stream.start(lambda df, i: None, trigger={"availableNow": True}).awaitTermination()
    except BaseException:
        stream.close()
        raise
    return stream, recorder


def test_a_progress_event_reaches_the_stream_as_its_json_without_a_java_exception(spark, tmp_path, monkeypatch):
    """spate's listener takes each progress event from the JVM as its JSON (one py4j call). pyspark's own bridge
    reads it field by field, and every Java map it reads ends in a Java exception that pyspark converts by asking
    the JVM about 15 exception classes: about 5 per event (docs/benchmarks.md)."""
    import traceback

    import pyspark.errors.exceptions.captured as captured

    real, converted_in_listener = captured.convert_exception, []

    def convert_exception(e):
        if any(frame.name == "onQueryProgress" for frame in traceback.extract_stack()):
            converted_in_listener.append(str(e).splitlines()[0])
        return real(e)

    monkeypatch.setattr(captured, "convert_exception", convert_exception)
    stream, recorder = _started(_source(spark, tmp_path), tmp_path)
    try:
        progress = [recorder.progress(0), recorder.progress(1)]
    finally:
        stream.close()
    assert converted_in_listener == []
    spark_own = {p["batchId"]: p for p in stream.query.recentProgress}
    for p in progress:  # the event as Spark has it, spate's figures added
        own = spark_own[p.batchId]
        assert (str(p.id), str(p.runId), p.numInputRows, p.sink.description) == (
            str(own["id"]), str(own["runId"]), own["numInputRows"], own["sink"]["description"])
        assert p.durationMs == own["durationMs"] and p.durationMs["triggerExecution"] >= 0
        assert [s.description for s in p.sources] == [s["description"] for s in own["sources"]]


def test_progress_carries_spates_figures_to_listeners_and_last_progress(spark, tmp_path):
    stream, recorder = _started(_source(spark, tmp_path), tmp_path)
    try:
        first, second = recorder.progress(0), recorder.progress(1)
    finally:
        stream.close()
    want = _spark_state_rows(spark, tmp_path)
    for batch_id, progress, rows in ((0, first, 4), (1, second, 3)):
        entry = next(op for op in progress.stateOperators if op.operatorName == "spate")
        figures = progress.observedMetrics["spate"]
        assert progress.batchId == batch_id and progress.numInputRows == rows
        assert figures.input_rows == rows and not figures.replayed
        # a count per user and a map entry per (user, number): Spark's RocksDB counts the same rows
        assert (entry.numRowsTotal, entry.numRowsUpdated) == want[batch_id]
        assert figures.state_rows == entry.numRowsTotal
        assert entry.numStateStoreInstances == figures.parallelism == 2
        assert entry.memoryUsedBytes == figures.state_bytes > 0
        assert figures.checkpoint_new_bytes > 0 and figures.files > 0
        assert entry.customMetrics["checkpoint_new_bytes"] == figures.checkpoint_new_bytes
        assert figures.local_reuse + figures.restored + figures.rescaled <= 2
    # batch 1: counts of a, b, d written; map entries a:3, b:1 (again), d:5 written, of which a:3 and d:5 new
    assert want == {0: (3 + 4, 3 + 4), 1: (4 + 6, 3 + 3)}
    assert [kind for kind, _ in recorder.events][:1] == ["started"]
    assert recorder.events[-1][0] == "terminated"
    assert stream.last_progress is not None and stream.last_progress.batchId == 1
    assert stream.last_progress.observedMetrics["spate"].state_rows == 10
    assert [p.batchId for p in stream.recent_progress] == [0, 1]


def test_other_queries_and_spark_listeners_are_left_alone(spark, tmp_path):
    """A query that is not the stream's gets no spate entries, and the stream's listener leaves the session."""
    stream, mine = _started(_source(spark, tmp_path), tmp_path, parallelism=1)
    mine.progress(1)
    other = spark.readStream.format("rate").option("rowsPerSecond", 5).load().writeStream.format("noop").start()
    try:
        deadline = time.monotonic() + 60
        while not other.lastProgress and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        other.stop()
        stream.close()
    assert other.lastProgress and not other.lastProgress["stateOperators"]
    assert {str(p.id) for kind, p in mine.events if kind == "progress"} == {str(stream.query.id)}


def test_after_a_restart_the_new_bytes_are_what_the_batch_added(spark, tmp_path):
    """The first batch after a restart counts the bytes its checkpoint adds to the one the query resumed from,
    not every byte the checkpoint references; the state rows carry on."""
    source = str(tmp_path / "in")
    last = []
    for run, batch in enumerate(BATCHES):
        write_files(source, [batch], start=run)
        df = spark.readStream.schema("user string, n long").option("maxFilesPerTrigger", 1).json(source)
        stream, recorder = _started(df, tmp_path)
        try:
            last.append(recorder.progress(run).observedMetrics["spate"])
        finally:
            stream.close()
    first, resumed = last
    assert first.checkpoint_new_bytes == first.state_bytes > 0  # a new query: everything is new
    assert 0 < resumed.checkpoint_new_bytes < resumed.state_bytes
    assert (first.state_rows, resumed.state_rows) == (7, 10)


def test_an_event_that_arrives_while_the_early_ones_are_passed_on_comes_after_them():
    """Met in the pyspark 4.1 smoke: a query fast enough to end before ``start()`` returned had its events kept
    until the stream knew its id; Spark's listener thread passed the termination on while the kept progress
    events were still being passed, so a listener saw "terminated" before the last "progress"."""
    from types import SimpleNamespace

    from spate.spark.progress import ProgressListener

    seen: list[str] = []
    racing: list[threading.Thread] = []
    listener = ProgressListener(lambda batch_id: None)

    class Recording(StreamingQueryListener):
        def onQueryStarted(self, event):  # noqa: N802
            seen.append("started")
            # Spark's listener thread posts the query's end now, while the kept events are being passed on
            racing.append(threading.Thread(target=listener.onQueryTerminated, args=(SimpleNamespace(id="q"),)))
            racing[0].start()
            racing[0].join(0.3)

        def onQueryIdle(self, event):  # noqa: N802
            seen.append("idle")

        def onQueryProgress(self, event):  # noqa: N802
            pass

        def onQueryTerminated(self, event):  # noqa: N802
            seen.append("terminated")

    listener.listeners.append(Recording())
    listener.onQueryStarted(SimpleNamespace(id="q"))
    listener.onQueryIdle(SimpleNamespace(id="q"))
    listener.attach("q")
    racing[0].join(5)
    assert seen == ["started", "idle", "terminated"]
