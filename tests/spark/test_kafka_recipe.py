"""docs/spark.md's Kafka recipe ("Reading from Kafka"), run as written on a source that runs here.

The Kafka connector (``org.apache.spark:spark-sql-kafka-0-10_2.13``) is not among pyspark's jars and
``--packages`` fetches it from Maven Central, which these machines cannot reach (no internet; only package
registries). So the doc's ``python`` block is executed verbatim, without its ``__main__`` part (the only part
that names the Kafka source), and its ``build(kafka_df, root)`` gets a streaming DataFrame of the file source
whose rows have exactly the columns and types Spark's Kafka source gives (``key`` and ``value`` binary,
``topic``, ``partition``, ``offset``, ``timestamp``, ``timestampType``), one Parquet file per micro-batch.
Everything after the source is the recipe's own code path: the value decoded from JSON, the key cast to the user,
``StatefulStream`` with a checkpoint root, ``start(sink)``.

Checked: each batch's outputs equal a plain-Python count of the records; a restart on the same root goes on
from the offsets and state in the root (no batch processed twice, counts continue); Spark's offsets are in the
root beside spate's checkpoints; after the root was deleted, a restart is a new query that reads the whole input
again (as Kafka with ``startingOffsets=earliest``), from batch 0 with empty state, and delivers the rebuilt
outputs again, which is what the doc says.

With ``--connect`` (``make connect``) the same tests run on a Spark Connect session: the sink writes each batch's
outputs to files, as a sink on Connect must (it runs on the server), and the test reads them back.
"""

from __future__ import annotations

import json
import os
import shutil
import zlib
from collections import Counter
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pyarrow.parquet as pq
import pyspark
import pytest

from helpers.readme_blocks import REPO, plain_block, python_block
from spate import load_checkpoint
from spate.checkpoint.coordinator import list_complete_checkpoints
from spate.fs import CheckpointStorage

pytestmark = pytest.mark.spark

# what spark.readStream.format("kafka").load() gives (without includeHeaders)
KAFKA_COLUMNS = "key binary, value binary, topic string, partition int, offset long, timestamp timestamp, " \
                "timestampType int"
KAFKA_ARROW = pa.schema([("key", pa.binary()), ("value", pa.binary()), ("topic", pa.string()),
                         ("partition", pa.int32()), ("offset", pa.int64()), ("timestamp", pa.timestamp("us", "UTC")),
                         ("timestampType", pa.int32())])
PARTITIONS = 3
DOC = REPO / "docs" / "spark.md"
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def recipe() -> dict:
    """The doc's block, run as a module that is not ``__main__``: its processor and ``build``."""
    code = python_block("def build(kafka_df, checkpoint_root)")
    package = f"org.apache.spark:spark-sql-kafka-0-10_2.13:{pyspark.__version__}"  # the installed Spark's
    assert 'readStream.format("kafka")' in code and f"--packages {package} clicks.py" in code
    assert f"--packages {package} clicks.py" in plain_block("--packages", DOC)
    namespace: dict = {"__name__": "kafka_recipe"}  # not importable: Spark's cloudpickle ships its classes by value
    exec(compile(code, "docs/spark.md", "exec"), namespace)  # noqa: S102
    return namespace


def records(n_batches: int, per_batch: int = 40, users: int = 7) -> list[list[dict]]:
    """Kafka records per micro-batch: key = the user, value = a JSON click, offsets per partition in order."""
    next_offset = [0] * PARTITIONS
    batches = []
    for b in range(n_batches):
        rows = []
        for i in range(per_batch):
            user = f"u{(b * 5 + i * 3) % users}"
            partition = zlib.crc32(user.encode()) % PARTITIONS  # one key, one partition (as Kafka's partitioner)
            ts = T0 + timedelta(seconds=b * 60 + i)
            rows.append({"key": user.encode(), "value": json.dumps({"page": f"/p{i % 4}", "ts": ts.isoformat()})
                         .encode(), "topic": "clicks", "partition": partition, "offset": next_offset[partition],
                         "timestamp": ts, "timestampType": 0})
            next_offset[partition] += 1
        batches.append(rows)
    return batches


def write_batches(directory: str, batches: list[list[dict]], start: int = 0) -> None:
    """One Parquet file per batch, oldest first (the file source reads by modification time)."""
    os.makedirs(directory, exist_ok=True)
    for i, rows in enumerate(batches, start):
        path = os.path.join(directory, f"part-{i:05d}.parquet")
        pq.write_table(pa.Table.from_pylist(rows, schema=KAFKA_ARROW), path)
        os.utime(path, (1_700_000_000 + i, 1_700_000_000 + i))


def expected(batches: list[list[dict]]) -> dict[int, list[tuple]]:
    """What ClicksPerUser yields per batch, computed without Spark: the user's running count, its partition and
    the offset of its latest record in the batch."""
    running: Counter = Counter()
    out = {}
    for b, rows in enumerate(batches):
        latest: dict[str, tuple[int, int]] = {}
        for r in rows:
            user = r["key"].decode()
            running[user] += 1
            latest[user] = max(latest.get(user, (-1, -1)), (r["offset"], r["partition"]))
        out[b] = sorted((u, running[u], p, o) for u, (o, p) in latest.items())
    return out


def run(spark, source: str, root: str, seen: dict[int, list[tuple]], out: str) -> object:
    """The recipe's stream over the Kafka-shaped files, until they are all read (one file per batch); each batch's
    outputs written to ``<out>/batch=<n>`` (a second delivery of a batch would find its directory there and fail:
    the sink runs on the server on Spark Connect, so it writes where the test reads), then read into ``seen``."""
    kafka_df = spark.readStream.schema(KAFKA_COLUMNS).option("maxFilesPerTrigger", 1).parquet(source)
    stream = recipe()["build"](kafka_df, root)

    def sink(outputs, batch_id):
        outputs.write.mode("error").json(os.path.join(out, f"batch={batch_id}"))

    query = stream.start(sink, trigger={"availableNow": True})
    try:
        assert query.awaitTermination(300), "the query did not finish its input within 300 s"
        assert query.exception() is None
    finally:
        query.stop()
        stream.close()
    for name in sorted(os.listdir(out)):
        batch_id = int(name.split("=")[1])
        if batch_id not in seen:
            rows = spark.read.schema(stream.definition.output_schema).json(os.path.join(out, name)).collect()
            seen[batch_id] = sorted(tuple(r) for r in rows)
    return stream


def offsets_logged(root: str) -> list[int]:
    return sorted(int(n) for n in os.listdir(os.path.join(root, "_spark", "offsets")) if n.isdigit())


@pytest.fixture(scope="module")
def resumed(spark, tmp_path_factory) -> dict:
    """Two runs of the recipe on one root: batches 0-1, then (more records having arrived) batches 2-3."""
    tmp = tmp_path_factory.mktemp("kafka")
    source, root = str(tmp / "topic"), str(tmp / "root")
    batches = records(4)
    write_batches(source, batches[:2])
    seen: dict[int, list[tuple]] = {}
    run(spark, source, root, seen, str(tmp / "out"))
    first = {"seen": dict(seen), "offsets": offsets_logged(root),
             "checkpoints": list_complete_checkpoints(CheckpointStorage(root)),
             "query": load_checkpoint(CheckpointStorage(root)).query_id}
    with open(os.path.join(root, "_spark", "offsets", "1")) as f:
        first["offsets_1"] = f.read().splitlines()
    write_batches(source, batches[2:], start=2)  # more records arrive while the query is stopped
    stream = run(spark, source, root, seen, str(tmp / "out"))
    return {"source": source, "root": root, "batches": batches, "first": first, "seen": seen, "stream": stream}


def test_kafka_recipe_counts_each_record_once_and_resumes_from_the_root(resumed):
    want = expected(resumed["batches"])
    first = resumed["first"]
    assert first["seen"] == {0: want[0], 1: want[1]}
    assert first["offsets"] == [0, 1] and first["checkpoints"] == [0, 1], \
        "Spark's offsets and spate's checkpoints of batches 0 and 1 in the one root"
    logged = first["offsets_1"]
    assert logged[0] == "v1" and '"logOffset":1' in logged[2], logged  # the source's position after batch 1
    assert resumed["seen"] == want, "after the restart: batches 2 and 3 only, counts going on from the root's state"
    stream = resumed["stream"]
    assert [m.batch_id for m in stream.metrics] == [2, 3] and not any(m.replayed for m in stream.metrics)
    assert load_checkpoint(CheckpointStorage(resumed["root"])).checkpoint_id == 3


def test_a_lost_root_is_a_new_query_that_reads_the_input_again(spark, resumed, tmp_path):
    """The doc's "A restart after the root was lost": state and offsets go together, so the next start begins at
    batch 0 with empty state, reads everything the source still has (Kafka: startingOffsets), and the sink gets
    the rebuilt outputs under batch ids it has seen."""
    root = resumed["root"]
    lost_query = load_checkpoint(CheckpointStorage(root)).query_id
    assert lost_query == resumed["first"]["query"]
    shutil.rmtree(root)
    again: dict[int, list[tuple]] = {}
    run(spark, resumed["source"], root, again, str(tmp_path / "out"))
    assert again == expected(resumed["batches"]), "batch ids from 0, every record counted once more from empty state"
    assert again == resumed["seen"], "the lost batches' outputs delivered again, the same (the same files per batch)"
    assert load_checkpoint(CheckpointStorage(root)).query_id != lost_query, "a new query"
    assert offsets_logged(root) == [0, 1, 2, 3]
