"""spate's windows on Spark (``StatefulStream`` + :class:`WindowedProcessor`) give what Spark's own streaming
aggregation gives (``withWatermark`` + ``groupBy(window(...))`` / ``session_window``, Append output mode) on the
same input files, batch by batch, through a restart at another parallelism (2, then 3) with the changelog and
file merging on.

The two lateness rules differ, so the input avoids the rows where they disagree. With ``wm(n)`` = the largest
event time of the batches before ``n`` minus the delay (the same in both):

- spate (Flink's rule) drops a row of batch ``n`` from each window whose last timestamp (``end - 1``) is at or
  below ``wm(n)``, and fires a window in the batch whose watermark reaches ``end - 1``;
- Spark drops late input against the *previous* batch's watermark ``wm(n - 1)`` and emits (evicts) a window in
  the batch whose watermark reaches ``end``. For ``window(...)`` it drops a row from each window that ended at
  or before ``wm(n - 1)`` (seen here: a sliding-window row at or below ``wm(n - 1)`` still counted in its
  window ending after it), not the whole row.

Event times and the delay are whole seconds, so ``end - 1 <= wm`` equals ``end <= wm``: both emit a window in
the same batch. The rules disagree on a row of batch ``n`` in a window ending in ``(wm(n - 1), wm(n)]``: Spark
counts it there (the window is still in its state), spate drops it (the watermark it sees, from the batches
before, already passed the window). So every row is either clearly late for both (all its windows ended at or
before ``wm(n - 1)``) or on time for both (after ``wm(n - 1)``, in windows all ending after ``wm(n)``), for a
row-wise or a window-wise reading of Spark's rule alike; :func:`check_input` asserts it. Session windows:
spate merges sessions that touch (Flink), Spark those that overlap, so no two rows of a key are exactly one gap
apart.

Batch indexes line up: both compute a batch's watermark from the batches before it. Spark would run one more
(no-data) batch at the end when the last batch moved the watermark past a window's end, whereas spate (on
``foreachBatch``) fires such windows only with the next data batch. So the input ends with a row far ahead (of
another user) and one more batch that leaves the watermark where it was: every test window closes in a data
batch, Spark runs no extra batch, and the union of everything emitted is the same too.
"""

from __future__ import annotations

import datetime as dt
import sys

import pytest
from pyspark import cloudpickle

from helpers import aggregates
from helpers.aggregates import CountSum
from helpers.file_source import write_files
from spate import load_checkpoint, verify_checkpoint
from spate.fs import CheckpointStorage
from spate.spark.stream import StatefulStream
from spate.windows import SessionWindows, SlidingWindows, TumblingWindows, WindowedProcessor

pytestmark = pytest.mark.spark
cloudpickle.register_pickle_by_value(sys.modules[__name__])  # executors cannot import test modules
cloudpickle.register_pickle_by_value(aggregates)  # nor CountSum's
INPUT = "user string, v long, ts timestamp"
OUTPUT = "user string, start long, end long, n long, total long"
BASE = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
BASE_MS = int(BASE.timestamp() * 1000)
DELAY_S = 5
FAR = 1_000  # the flush rows' event time (s): every test window ends long before it

# (user, event time in s after BASE, v) per batch
BATCHES = [
    [("a", 1, 1), ("a", 3, 2), ("b", 2, 4), ("c", 7, 8), ("a", 12, 16)],  # wm(1) = 7
    [("a", 9, 1), ("b", 14, 2), ("c", 11, 4), ("b", 21, 8), ("a", 10, 32)],  # wm(2) = 16
    [("c", 18, 1), ("a", 18, 2), ("b", 18, 4), ("c", 26, 8)],  # wm(3) = 21
    [("b", 25, 1), ("a", 24, 2), ("c", 33, 4), ("b", 5, 128), ("c", 22, 8)],  # wm(4) = 28; b@5: late
    [("a", 31, 1), ("c", 30, 2), ("b", 29, 4), ("a", 40, 8), ("c", 14, 256)],  # wm(5) = 35; c@14: late
    [("b", 37, 1), ("c", 39, 2), ("zz", FAR, 0)],  # wm(6) = 995: every test window closes
    [("a", 20, 512), ("zz", FAR, 0)],  # late; the watermark stays: Spark runs no extra batch
]
RESTART_AT = 3  # batches 0..2 at parallelism 2, then 3..6 at parallelism 3

CASES = {
    "tumbling": (TumblingWindows(10_000), lambda F: F.window("ts", "10 seconds")),
    "sliding": (SlidingWindows(10_000, 5_000), lambda F: F.window("ts", "10 seconds", "5 seconds")),
    "session": (SessionWindows(5_000), lambda F: F.session_window("ts", "5 seconds")),
}


def output(key, window, result):
    return {"user": key, "start": window.start, "end": window.end, "n": result[0], "total": result[1]}


def late_row(key, row):
    return {"user": key, "start": -1, "end": -1, "n": 0, "total": row["v"]}


def as_json(batches):
    return [[{"user": u, "v": v, "ts": (BASE + dt.timedelta(seconds=s)).isoformat()} for u, s, v in rows]
            for rows in batches]


def watermarks(batches):
    """Each batch's watermark (s after BASE): the largest event time of the batches before it minus the delay."""
    out, top = [], None
    for rows in batches:
        out.append(None if top is None else top - DELAY_S)
        top = max([top if top is not None else -10**9, *(s for _, s, _ in rows)])
    return out


def check_input(assigner, batches):
    """Every row late for both rules or on time for both (the module's docstring); returns the late rows."""
    late = []
    wms = watermarks(batches)
    for n, rows in enumerate(batches):
        prev = wms[n - 1] if n else None
        wm = wms[n]
        for user, s, v in rows:
            ends = [w.end // 1000 for w in assigner.assign(s * 1000)]
            if prev is not None and all(end <= prev for end in ends):
                late.append((user, -1, -1, 0, v))
                continue
            where = f"batch {n}: {user}@{s}"
            assert prev is None or s > prev, f"{where} is at or below wm(n - 1) in a window still open"
            assert wm is None or all(end > wm for end in ends), f"{where} has a window ending in (wm(n - 1), wm(n)]"
    if assigner.merging:
        for rows in batches:
            for user, s, _ in rows:
                gap = assigner.gap_ms // 1000
                assert not any(u == user and abs(t - s) == gap for rows2 in batches for u, t, _ in rows2), (
                    f"{user}@{s}: a row exactly one gap away")
    return sorted(late)


def collect_into(got):
    def sink(df, batch_id):
        got.setdefault(batch_id, []).extend(tuple(r) for r in df.collect())

    return sink


def run_spark(spark, source, checkpoint):
    """Spark's own aggregation of every case in one query (a union of three aggregations on one watermark)."""
    from pyspark.sql import functions as F  # noqa: N812

    df = spark.readStream.schema(INPUT).option("maxFilesPerTrigger", 1).json(source).withWatermark(
        "ts", f"{DELAY_S} seconds")
    out = None
    for kind, (_, window) in sorted(CASES.items()):
        agg = df.groupBy(window(F).alias("w"), "user").agg(F.count("*").alias("n"), F.sum("v").alias("total"))
        agg = agg.select(F.lit(kind).alias("kind"), "user", F.unix_millis("w.start").alias("start"),
                         F.unix_millis("w.end").alias("end"), "n", "total")
        out = agg if out is None else out.unionByName(agg)
    got: dict = {}
    query = out.writeStream.outputMode("append").foreachBatch(collect_into(got)).option(
        "checkpointLocation", checkpoint).start()
    query.processAllAvailable()
    query.stop()
    return got


def run_spate(spark, source, tmp_path, assigner, parallelism, got):
    df = spark.readStream.schema(INPUT).option("maxFilesPerTrigger", 1).json(source)
    processor = WindowedProcessor(assigner, timestamp="ts", aggregate=CountSum(), value=lambda row: row["v"],
                                  output=output, late_rows=late_row)
    # no batches without input: the first run would end with one where the watermark moved (a boundary Spark's
    # single run does not have), shifting the batch ids this test compares
    stream = StatefulStream(df, "user", processor, OUTPUT, checkpoint_root=str(tmp_path / "spate"),
                            parallelism=parallelism, event_time_column="ts", watermark_delay_ms=DELAY_S * 1000,
                            changelog=True, file_merging="across", local_dir=str(tmp_path / "local"),
                            idle_batches=False)
    stream.start(collect_into(got), trigger={"availableNow": True}).awaitTermination()
    stream.close()
    return stream


def relative(rows):
    """Window bounds in s after BASE (late rows keep -1), as a sorted list (a multiset)."""
    return sorted((u, s if s < 0 else (s - BASE_MS) // 1000, e if e < 0 else (e - BASE_MS) // 1000, n, t)
                  for u, s, e, n, t in rows)


@pytest.fixture(scope="module")
def spark_emitted(spark, tmp_path_factory):
    """What Spark's own aggregation emitted per batch, all input files there from the start (one query, no
    restart): ``{kind: {batch: rows}}``."""
    tmp = tmp_path_factory.mktemp("spark-windows")
    write_files(str(tmp / "in"), as_json(BATCHES))
    emitted = run_spark(spark, str(tmp / "in"), str(tmp / "spark"))
    return {kind: {b: relative([r[1:] for r in rows if r[0] == kind]) for b, rows in emitted.items()}
            for kind in CASES}


@pytest.mark.parametrize("kind", sorted(CASES))
def test_windows_equal_sparks_own_aggregation(spark, tmp_path, spark_emitted, kind):
    """spate restarts after batch 2 at parallelism 3 (windows and sessions open across it: e.g. c's session
    [18, 38) gets rows from batches 2 to 4) and emits the same windows as Spark in the same batches."""
    assigner, _ = CASES[kind]
    late = check_input(assigner, BATCHES)
    want = spark_emitted[kind]
    files = as_json(BATCHES)
    got: dict = {}
    write_files(str(tmp_path / "in"), files[:RESTART_AT])
    run_spate(spark, str(tmp_path / "in"), tmp_path, assigner, 2, got)
    write_files(str(tmp_path / "in"), files[RESTART_AT:], start=RESTART_AT)
    second = run_spate(spark, str(tmp_path / "in"), tmp_path, assigner, 3, got)

    got = {b: relative(rows) for b, rows in got.items()}
    assert sorted(want) == sorted(got) == list(range(len(BATCHES))), "Spark ran no extra batch, spate one each"
    spate_late = sorted(r for rows in got.values() for r in rows if r[1] == -1)
    got = {b: [r for r in rows if r[1] != -1] for b, rows in got.items()}
    assert got == want, kind  # batch by batch, as multisets
    assert sorted(r for rows in got.values() for r in rows) == sorted(r for rows in want.values() for r in rows)
    assert spate_late == late, "the rows late for Spark were late for spate (its late_rows side output)"
    assert sum(len(rows) for rows in want.values()) >= 10, "the windows fired"

    storage = CheckpointStorage(str(tmp_path / "spate"))
    meta = load_checkpoint(storage)
    assert meta.parallelism == 3 and verify_checkpoint(storage, meta) == []
    recovered = [st.recovery for st in second.metrics[0].subtasks]  # from storage, or the local copies here
    assert len(recovered) == 3 and set(recovered) <= {"restored", "rescaled"}, recovered
