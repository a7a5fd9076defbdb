"""Exactly-once table sinks (Parquet directory, Delta, Iceberg) against a model: random batches, crashes at every
step of the driver protocol and inside the sink's commit, restarts at other parallelisms. Every input row is
in the table exactly once with the model's running count, the table's own readers read it, no data file is
visible that the table does not hold, and nothing stays staged."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections import Counter
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.dataset as ds
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spate import DeltaSink, IcebergSink, LocalRunner, ParquetSink, Processor, SpateError
from spate.sinks.table_sink import STAGING_DIR
from spate.state.descriptors import ValueStateDescriptor

SCHEMA = pa.schema([("i", pa.int64()), ("k", pa.string()), ("n", pa.int64())])
KINDS = ("parquet", "delta", "iceberg")
DRIVER_STEPS = ["after_begin", "after_subtask_0", "after_acks", "after_complete", "after_sink_before_mark"]
COMMIT_STEPS = ["between_moves", "before_table_commit"]
RETRIED = "task_retried"  # not a crash: a subtask's task ran twice, the first attempt's file left staged


class Crash(Exception):
    """Fault injection: the driver dies here."""


class Count(Processor):
    """Each input row out again with its key's running count."""

    def open(self, ctx: Any) -> None:
        self.count = ctx.state(ValueStateDescriptor("count"))

    def process(self, key: Any, rows: list[dict], ctx: Any) -> Any:
        n = self.count.value() or 0
        for row in sorted(rows, key=lambda r: r["i"]):
            n += 1
            yield {"i": row["i"], "k": key, "n": n}
        self.count.update(n)


class MoveThenCrash:
    """Fault injection: storage whose second move dies (the first file of a batch moved, the rest not)."""

    def __init__(self, storage: Any) -> None:
        self.storage, self.moves = storage, 0

    def move(self, rel: str, to: str) -> None:
        self.moves += 1
        if self.moves == 2:
            raise Crash("between_moves")
        self.storage.move(rel, to)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.storage, name)


def faulty(kind: str, where: str, armed: list) -> Any:
    """A sink of ``kind`` whose commit dies at ``armed[0]`` (``between_moves`` / ``before_table_commit``)."""
    base = {"parquet": ParquetSink, "delta": DeltaSink, "iceberg": IcebergSink}[kind]

    class FaultySink(base):  # type: ignore[valid-type,misc]  # fault injection
        def _storage(self) -> Any:
            storage = super()._storage()
            return MoveThenCrash(storage) if armed == ["between_moves"] else storage

        def write(self, table: pa.Table, batch_id: int, subtask: int) -> Any:
            if armed == [RETRIED]:
                super().write(table, batch_id, subtask)  # the lost attempt's file
            return super().write(table, batch_id, subtask)

        def _commit_files(self, batch_id: int, files: list) -> None:
            if armed == ["before_table_commit"]:
                raise Crash("before_table_commit")
            super()._commit_files(batch_id, files)

    return FaultySink("db.out", warehouse=where) if kind == "iceberg" else FaultySink(where)


def table_rows(kind: str, where: str) -> list[dict]:
    """The table's rows, read by the table format's own reader."""
    if kind == "parquet":
        table = ds.dataset(where, format="parquet").to_table() if os.path.isdir(where) else SCHEMA.empty_table()
    elif kind == "delta":
        from deltalake import DeltaTable
        table = DeltaTable(where).to_pyarrow_table()
    else:
        table = IcebergSink("db.out", warehouse=where).load_table().scan().to_arrow()
    return sorted(table.select(["i", "k", "n"]).to_pylist(), key=lambda r: r["i"])


def visible_files(kind: str, where: str) -> tuple[set[str], set[str]]:
    """(data files in the table's data directory outside staging, data files the table holds)."""
    data = f"{where}/db/out/data" if kind == "iceberg" else where
    on_disk = {f for f in os.listdir(data) if f.endswith(".parquet")} if os.path.isdir(data) else set()
    if kind == "parquet":
        return on_disk, on_disk
    if kind == "delta":
        from deltalake import DeltaTable
        held = {os.path.basename(u) for u in DeltaTable(where).file_uris()}
    else:
        held = {os.path.basename(t.file.file_path) for t in
                IcebergSink("db.out", warehouse=where).load_table().scan().plan_files()}
    return on_disk, held


def commits(kind: str, where: str) -> int:
    """How many commits added data to the table."""
    if kind == "parquet":
        return len({f.split("-")[1] for f in os.listdir(where) if f.startswith("part-")}) if os.path.isdir(where) \
            else 0
    if kind == "delta":
        from deltalake import DeltaTable
        return sum(1 for c in DeltaTable(where).history() if c.get("operation") != "CREATE TABLE")
    return len(IcebergSink("db.out", warehouse=where).load_table().snapshots())


def staged_files(kind: str, where: str) -> list[str]:
    staging = f"{where}/db/out/data/{STAGING_DIR}" if kind == "iceberg" else f"{where}/{STAGING_DIR}"
    return os.listdir(staging) if os.path.isdir(staging) else []


def model(batches: list[list[dict]]) -> list[dict]:
    counts: Counter = Counter()
    out = []
    for rows in batches:
        for row in sorted(rows, key=lambda r: r["i"]):
            counts[row["k"]] += 1
            out.append({"i": row["i"], "k": row["k"], "n": counts[row["k"]]})
    return sorted(out, key=lambda r: r["i"])


def run_scenario(kind: str, sizes: list[int], segments: list[tuple[int, int, str | None]], final: int,
                 must_crash: bool = False) -> None:
    """``segments``: (parallelism, batches run to, the step of the next batch the driver dies at). A crash
    inside the commit happens only where there is something to commit (``between_moves``: two files or more);
    ``must_crash`` asserts that it did."""
    work = tempfile.mkdtemp(prefix="sink-model-")
    where, root = f"{work}/table", f"{work}/checkpoints"
    i = 0
    batches = []
    for size in sizes:
        batches.append([{"i": i + j, "k": f"k{(i + j) % 5}"} for j in range(size)])
        i += size
    armed: list = []

    def fault(step: str, batch_id: int) -> None:
        if armed == [(step, batch_id)]:
            raise Crash(step)

    def runner(parallelism: int) -> LocalRunner:
        return LocalRunner(Count, key="k", checkpoint_root=root, parallelism=parallelism, output_schema=SCHEMA,
                           sink=faulty(kind, where, commit_armed), fault_injector=fault)

    commit_armed: list = []
    try:
        for parallelism, stop, step in segments:
            r = runner(parallelism)
            stop = min(stop, len(batches))
            for n in range(r.next_batch_id, stop):
                r.run_batch(n, batches[n])
            if step == RETRIED and stop < len(batches) and r.next_batch_id == stop:
                commit_armed[:] = [RETRIED]
                r.run_batch(stop, batches[stop])
                commit_armed.clear()
            elif step is not None and stop < len(batches) and r.next_batch_id == stop:
                (commit_armed if step in COMMIT_STEPS else armed)[:] = [step if step in COMMIT_STEPS else
                                                                       (step, stop)]
                try:
                    r.run_batch(stop, batches[stop])
                    crashed = False
                except Crash:
                    crashed = True
                assert crashed or (step in COMMIT_STEPS and not must_crash), f"no crash at {step}"
                armed.clear()
                commit_armed.clear()
            r.close()
        r = runner(final)
        for n in range(r.next_batch_id, len(batches)):
            r.run_batch(n, batches[n])
        r.close()
        runner(final).close()  # a restart sweeps the staging directory
        assert table_rows(kind, where) == model(batches)
        assert commits(kind, where) == sum(1 for b in batches if b), "a batch committed twice, or not at all"
        on_disk, held = visible_files(kind, where)
        assert on_disk == held, f"data files outside the table: {sorted(on_disk - held)}"
        assert staged_files(kind, where) == [], "staged files of attempts that never completed were left"
    finally:
        shutil.rmtree(work, ignore_errors=True)


segment_st = st.tuples(st.integers(1, 4), st.integers(0, 6),
                       st.sampled_from([None, *DRIVER_STEPS, *COMMIT_STEPS, RETRIED]))


@pytest.mark.parametrize("kind", KINDS)
@settings(max_examples=int(os.environ.get("SPATE_SINK_EXAMPLES", "12")))
@given(sizes=st.lists(st.integers(0, 12), min_size=1, max_size=7), segments=st.lists(segment_st, max_size=3),
       final=st.integers(1, 4))
def test_table_matches_model_across_crashes(kind: str, sizes: list[int], segments: list, final: int) -> None:
    run_scenario(kind, sizes, segments, final)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("step", [*DRIVER_STEPS, *COMMIT_STEPS, RETRIED])
def test_every_crash_step(kind: str, step: str) -> None:
    """Each crash step once, deterministically: a crash in batch 1 of 3, a restart at another parallelism."""
    run_scenario(kind, [5, 7, 4], [(2, 1, step)], 3, must_crash=step != RETRIED)


def test_parquet_table_is_read_by_duckdb_and_pyarrow(tmp_path: Any) -> None:
    where = str(tmp_path / "out")
    with LocalRunner(Count, key="k", checkpoint_root=str(tmp_path / "cp"), parallelism=2, output_schema=SCHEMA,
                     sink=ParquetSink(where)) as r:
        for n in range(3):
            r.run_batch(n, [{"i": 10 * n + j, "k": f"k{j % 3}"} for j in range(10)])
    got = duckdb.sql(f"select count(*), max(n) from read_parquet('{where}/*.parquet')").fetchall()[0]
    assert got == (30, 12)  # k0 is 4 of every batch's 10 rows
    assert ds.dataset(where, format="parquet").count_rows() == 30


def test_stopping_deletes_what_retried_attempts_of_committed_batches_staged(tmp_path: Any) -> None:
    """A task retried after its executor died leaves its first attempt's file staged: the batch commits the
    retry's. A stop deletes such files of committed batches, and leaves those of later batches (a newer
    driver may be running them)."""
    where = tmp_path / "out"
    r = LocalRunner(Count, key="k", checkpoint_root=str(tmp_path / "cp"), output_schema=SCHEMA,
                    sink=ParquetSink(str(where)))
    r.run_batch(0, [{"i": 1, "k": "a"}])
    app = r.coordinator.query.query_id.replace("-", "")[:32]
    lost, later = (f"{app}-{b:012d}-00000-0123456789ab.parquet" for b in (0, 7))
    for name in (lost, later):
        (where / STAGING_DIR / name).write_bytes(b"x")
    r.run_batch(1, [{"i": 2, "k": "a"}])
    r.close()
    assert os.listdir(where / STAGING_DIR) == [later]
    assert ds.dataset(str(where), format="parquet").count_rows() == 2


def test_a_fenced_driver_never_sweeps_the_files_of_the_batch_a_newer_one_runs(tmp_path: Any) -> None:
    """The sweep after a failed batch deletes staged files of batches after the latest checkpoint: a driver that
    another took the root from must not, as those may be the newer driver's running batch."""
    from spate.errors import FencedError

    where = tmp_path / "out"
    old = LocalRunner(Count, key="k", checkpoint_root=str(tmp_path / "cp"), output_schema=SCHEMA,
                      sink=ParquetSink(str(where)))
    old.run_batch(0, [{"i": 1, "k": "a"}])
    new = LocalRunner(Count, key="k", checkpoint_root=str(tmp_path / "cp"), output_schema=SCHEMA,
                      sink=ParquetSink(str(where)))
    app = new.coordinator.query.query_id.replace("-", "")[:32]
    running = f"{app}-{1:012d}-00000-0123456789ab.parquet"  # the newer driver's batch 1, not committed yet
    (where / STAGING_DIR / running).write_bytes(b"x")
    assert old._driver.committer is not None
    with pytest.raises(FencedError):
        old._driver.committer.clean()
    assert os.listdir(where / STAGING_DIR) == [running]
    old.close()  # its own sweep at the end deletes only committed batches' files
    assert os.listdir(where / STAGING_DIR) == [running]
    new.close()


def test_delta_and_iceberg_hold_one_commit_per_batch_with_its_token(tmp_path: Any) -> None:
    from deltalake import DeltaTable
    delta, ice = str(tmp_path / "delta"), str(tmp_path / "ice")
    queries = []
    for sink, root in ((DeltaSink(delta), "cp-d"), (IcebergSink("db.out", warehouse=ice), "cp-i")):
        with LocalRunner(Count, key="k", checkpoint_root=str(tmp_path / root), parallelism=3, output_schema=SCHEMA,
                         sink=sink) as r:
            for n in range(4):
                r.run_batch(n, [{"i": 10 * n + j, "k": f"k{j}"} for j in range(6)])
            queries.append(r.coordinator.query.query_id.replace("-", "")[:32])
    dt = DeltaTable(delta)
    assert dt.version() == 4  # the table's creation, then one commit per batch
    assert dt.transaction_version(f"spate-{queries[0]}") == 3
    table = IcebergSink("db.out", warehouse=ice).load_table()
    summaries = [s.summary.additional_properties for s in table.snapshots()]
    assert [(s["spate.app-id"], s["spate.batch-id"]) for s in summaries] == [(queries[1], str(n)) for n in range(4)]


def test_table_sink_needs_an_output_schema(tmp_path: Any) -> None:
    with pytest.raises(SpateError, match="output_schema"):
        LocalRunner(Count, key="k", checkpoint_root=str(tmp_path / "cp"), sink=ParquetSink(str(tmp_path / "t")))


@pytest.mark.parametrize("kind", ["delta", "iceberg"])
def test_existing_table_of_other_columns_is_refused_before_any_batch(tmp_path: Any, kind: str) -> None:
    where = str(tmp_path / "t")
    other = pa.schema([("x", pa.float64())])

    def sink() -> Any:
        return DeltaSink(where) if kind == "delta" else IcebergSink("db.out", warehouse=where)

    LocalRunner(Count, key="k", checkpoint_root=str(tmp_path / "a"), output_schema=other, sink=sink()).close()
    with pytest.raises(SpateError, match="the table exists with columns"):
        LocalRunner(Count, key="k", checkpoint_root=str(tmp_path / "b"), output_schema=SCHEMA, sink=sink())


def test_clean_staging_deletes_only_this_querys_files(tmp_path: Any) -> None:
    """Files in the staging directory that another query staged, or that are not spate's, stay."""
    where = tmp_path / "t"
    (where / STAGING_DIR).mkdir(parents=True)
    mine_old = "abc-000000000001-00000-0123456789ab.parquet"
    mine_pending = "abc-000000000004-00000-0123456789ab.parquet"
    mine_running = "abc-000000000006-00001-0123456789ab.parquet"  # a batch that may still be running
    theirs, user = "xyz-000000000001-00000-0123456789ab.parquet", "notes.txt"
    for name in (mine_old, mine_pending, mine_running, theirs, user):
        (where / STAGING_DIR / name).write_bytes(b"x")
    sink = ParquetSink(str(where))
    sink.open("abc", SCHEMA)
    assert sink.clean_staging(delivered_upto=2, latest_completed=None) == [f"{STAGING_DIR}/{mine_old}"]
    assert sink.clean_staging(delivered_upto=2, latest_completed=5) == [f"{STAGING_DIR}/{mine_running}"]
    assert sorted(os.listdir(where / STAGING_DIR)) == sorted([mine_pending, theirs, user])


def test_duckdb_reads_the_delta_and_iceberg_tables_through_their_readers(tmp_path: Any) -> None:
    """DuckDB's own delta and iceberg extensions are downloaded on first use (no network here): it reads the
    Delta table through deltalake's Arrow dataset and the Iceberg table through pyiceberg's scan."""
    from deltalake import DeltaTable
    delta, ice = str(tmp_path / "delta"), str(tmp_path / "ice")
    for sink, root in ((DeltaSink(delta), "cp-d"), (IcebergSink("db.out", warehouse=ice), "cp-i")):
        with LocalRunner(Count, key="k", checkpoint_root=str(tmp_path / root), parallelism=2, output_schema=SCHEMA,
                         sink=sink) as r:
            for n in range(3):
                r.run_batch(n, [{"i": 10 * n + j, "k": f"k{j % 4}"} for j in range(8)])
    dataset = DeltaTable(delta).to_pyarrow_dataset()  # noqa: F841  (DuckDB finds it by its name)
    assert duckdb.sql("select count(*), max(n) from dataset").fetchall() == [(24, 6)]
    con = IcebergSink("db.out", warehouse=ice).load_table().scan().to_duckdb("outputs")
    assert con.sql("select count(*), max(n) from outputs").fetchall() == [(24, 6)]
