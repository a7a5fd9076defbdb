"""What runs in a Spark Python worker: one call per subtask and micro-batch (partition i of the batch's
placed input, :mod:`spate.spark.placement`, holds subtask i's rows, its heartbeat row and its plan, so a task
receives its own plan only, and runs where the subtask's state lives).

The subtask's live state stays in this process between batches (and its lmdb state on executor-local disk),
but Python workers are not sticky: the next batch of a subtask may run in another worker, which then takes
the lmdb state over (it is unlocked between batches and tagged with the checkpoint it reflects) or restores
it from checkpoint storage. Returned: the subtask's ack; the batch's outputs are staged in
checkpoint storage, where the sink reads them once the checkpoint completed (:mod:`spate.spark.staged`).
"""

from __future__ import annotations

import json
import resource
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from spate.checkpoint.protocol import SubtaskPlan
from spate.runtime.batch import KeyedBatch
from spate.runtime.localstate import remove_idle_copies, remove_other_parallelisms
from spate.runtime.services import WorkerServices
from spate.runtime.subtask import ProcessorFactory, Subtask, SubtaskConfig
from spate.sinks.table_sink import TableSink
from spate.spark.placement import this_executor
from spate.spark.settings import SpateSettings, executor_local_dir

KG_COLUMN = "__spate_kg"
SUBTASK_COLUMN = "__spate_subtask"
HEARTBEAT_COLUMN = "__spate_heartbeat"
ROUTE_COLUMN = "__spate_route"  # the value whose hash sends the row to its subtask's partition
INITIAL_COLUMN = "__spate_initial"  # a row of the initial state (a struct of its columns), null on input rows
ACK_COLUMN = "ack"
ACK_SCHEMA = pa.schema([(ACK_COLUMN, pa.string())])  # what a mapInArrow task returns: its subtask's ack (JSON)


@dataclass(frozen=True)
class TaskSpec:
    """What every task of one run of a stream needs, built once per ``start()`` and shipped to executors inside
    the task's closure.

    ``run_id`` names one ``start()`` of the query: subtasks a worker kept from another run (which may have run
    another processor) are closed, never reused. ``settings`` are the query's as the run started: executors read
    only what does not change while it runs (a subtask's parallelism is its plan's, which follows every
    rescale). The sink choice: ``stage_outputs`` (whether a sink gets the outputs), ``table_sink`` (the query's
    opened table sink: outputs become its data files) and ``staged_format`` (how outputs are staged for a function
    sink; ``"parquet"``: files Spark reads)."""

    run_id: str
    factory: ProcessorFactory
    settings: SpateSettings
    key_columns: tuple[str, ...]
    output_schema: pa.Schema
    max_parallelism: int  # the root's key groups: the driver routes rows with it
    stage_outputs: bool = False
    table_sink: TableSink | None = None
    staged_format: str = "arrow"

    def subtask_config(self) -> SubtaskConfig:
        """The subtasks' settings on this executor: lmdb state without a ``local_dir`` goes to this
        executor's local disk (:func:`executor_local_dir`), decided here, not on the driver."""
        s = self.settings
        local_dir = s.local_dir or (executor_local_dir() if s.table == "lmdb" else None)
        return s.subtask_config(local_dir=local_dir, stage_outputs=self.stage_outputs,
                                output_schema=self.output_schema, sticky=False, table_sink=self.table_sink,
                                staged_format=self.staged_format)


IDLE_SCAN_INTERVAL_S = 60.0  # how often a worker lists the executor's local copies for idle ones


@dataclass
class _Served:
    """A subtask this worker keeps open, and when it last ran here: the worker's batch count and the clock."""

    subtask: Subtask
    batch: int
    time: float


class _Run:
    """What this worker keeps for one run of one query (one checkpoint root): the run's worker services and the
    subtasks it served, closed when they stayed idle for the grace period of the run's settings."""

    def __init__(self, spec: TaskSpec, plan: SubtaskPlan) -> None:
        self.run_id, self.query_id = spec.run_id, plan.query_id
        self.settings, self.config = spec.settings, spec.subtask_config()
        self.services = WorkerServices(plan.checkpoint_uri, self.config.file_merging, self.config.changelog)
        self.served: dict[tuple[int, int], _Served] = {}
        self.latest = -1  # the newest checkpoint a plan of the run brought
        self._planned: tuple[int, int | None] | None = None  # the latest plan's parallelism, and its base's
        self._scanned_at = float("-inf")  # when this worker last looked for idle local copies

    def advance(self, plan: SubtaskPlan) -> bool:
        """Follow the run to ``plan``; True if it brings a newer batch. At a new parallelism the subtasks of
        the old one are closed; local copies of other parallelisms are deleted, except the base's while the
        rescale is not complete (the new subtasks build their state from them)."""
        if (plan.parallelism, plan.base_parallelism) != self._planned:
            self._planned = (plan.parallelism, plan.base_parallelism)
            for key in [k for k in self.served if k[1] != plan.parallelism]:
                self.served.pop(key).subtask.close()
            if self._local_dir is not None:
                remove_other_parallelisms(self._local_dir, self.query_id, plan.parallelism,
                                          keep=plan.base_parallelism)
        newer = plan.checkpoint_id > self.latest
        self.latest = max(self.latest, plan.checkpoint_id)
        return newer

    def subtask(self, factory: ProcessorFactory, plan: SubtaskPlan, batch: int, now: float) -> Subtask:
        """The subtask of ``plan``, kept from an earlier batch or new; it runs now."""
        key = (plan.index, plan.parallelism)
        served = self.served.get(key)
        if served is None:
            subtask = Subtask(plan.index, plan.parallelism, factory, self.config, self.services)
            served = self.served[key] = _Served(subtask, batch, now)
        served.batch, served.time = batch, now
        return served.subtask

    def evict_idle(self, batch: int, now: float) -> None:
        """Close the subtasks that did not run here for the grace period (their local copies stay)."""
        s = self.settings
        for key, served in list(self.served.items()):
            if batch - served.batch >= s.evict_idle_after_batches and now - served.time >= s.evict_idle_after_s:
                del self.served[key]
                served.subtask.close()

    def remove_idle_copies(self, now: float) -> list[str]:
        """Delete this executor's local copies of the query that no process holds and none used for the grace
        period, looking at most once per :data:`IDLE_SCAN_INTERVAL_S` (or grace period, if shorter): not every
        batch. Returns those deleted."""
        grace = self.settings.evict_idle_after_s
        if self._local_dir is None or now - self._scanned_at < min(IDLE_SCAN_INTERVAL_S, grace):
            return []
        self._scanned_at = now
        return remove_idle_copies(self._local_dir, self.query_id, now - grace)

    @property
    def _local_dir(self) -> str | None:
        return self.config.local_dir if self.config.table == "lmdb" else None

    def close(self) -> None:
        """Close every subtask kept (local copies stay on disk), then the services."""
        for served in self.served.values():
            served.subtask.close()
        self.served.clear()
        self.services.close()


class WorkerSubtasks:
    """The subtasks this Python worker keeps between batches and their worker services: per checkpoint root,
    for one run of each query. It owns both, and closes them with :meth:`close`.

    A plan of another run of a query closes what this worker kept from the query's earlier run before any of
    the new run's subtasks opens, so a restarted query never runs an old processor and never opens lmdb state
    that a closed subtask still holds open. A subtask not run here for the grace period
    (:class:`~spate.spark.settings.SpateSettings` ``evict_idle_after_batches`` and ``evict_idle_after_s``) is
    closed, and with it the services of a root left without subtasks; local copies of the query that no
    process holds and none used for the grace period are deleted. ``clock`` gives the time in seconds since
    the epoch (compared with the times local copies were last used).
    """

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._runs: dict[str, _Run] = {}  # checkpoint root -> what this worker keeps of the query's run
        self._batches = 0  # batches (of any query) this worker took part in
        self._clock = clock

    def get(self, spec: TaskSpec, plan: SubtaskPlan) -> Subtask:
        """The subtask that runs ``plan`` in ``spec``'s run, kept from an earlier batch of the run or new.
        The first plan of a batch in this worker also closes idle subtasks and deletes idle local copies."""
        now = self._clock()
        run = self._run_of(spec, plan)
        newer = run.advance(plan)
        if newer:
            self._batches += 1
        subtask = run.subtask(spec.factory, plan, self._batches, now)
        if newer:
            self._evict_idle(now)
            run.remove_idle_copies(now)
        return subtask

    def served(self, checkpoint_uri: str) -> set[tuple[int, int]]:
        """(index, parallelism) of the subtasks this worker keeps open for the query at ``checkpoint_uri``."""
        run = self._runs.get(checkpoint_uri)
        return set(run.served) if run is not None else set()

    def _run_of(self, spec: TaskSpec, plan: SubtaskPlan) -> _Run:
        run = self._runs.get(plan.checkpoint_uri)
        if run is None or run.run_id != spec.run_id:
            self.evict(plan.checkpoint_uri)
            run = self._runs[plan.checkpoint_uri] = _Run(spec, plan)
        return run

    def _evict_idle(self, now: float) -> None:
        """Close idle subtasks; a run left without any is closed, and its idle local copies deleted."""
        for uri, run in list(self._runs.items()):
            run.evict_idle(self._batches, now)
            if not run.served:
                self.evict(uri)
                run.remove_idle_copies(now)

    def evict(self, checkpoint_uri: str) -> None:
        """Close (without deleting local state) every subtask kept for the query at ``checkpoint_uri``, and its
        services."""
        run = self._runs.pop(checkpoint_uri, None)
        if run is not None:
            run.close()

    def close(self) -> None:
        """Close every subtask and service (the worker is going away)."""
        for uri in list(self._runs):
            self.evict(uri)


WORKER_SUBTASKS = WorkerSubtasks()  # the one registry of this Python worker, living as long as the worker


def run_partition(spec: TaskSpec, input_schema: pa.Schema, items: Iterable[bytes],
                  subtasks: WorkerSubtasks = WORKER_SUBTASKS) -> Iterator[str]:
    """Run the one subtask of this task's partition (:func:`spate.spark.placement.placed_batch`): ``items``
    are its rows as one Arrow record batch (of ``input_schema``: the routed rows as Spark writes them to Arrow)
    and its plan. Yields the subtask's ack (JSON)."""
    received = list(items)
    if len(received) != 2:
        raise RuntimeError(f"a spate task got {len(received)} items instead of its rows and its plan: Spark did "
                           "not keep one subtask per partition")
    started = time.perf_counter()
    rows = pa.ipc.read_record_batch(pa.py_buffer(received[0]), input_schema)
    plan = SubtaskPlan.from_dict(json.loads(received[1]))
    yield run_subtask(spec, plan, pa.Table.from_batches([rows]), subtasks,
                      arrow_read_ms=(time.perf_counter() - started) * 1000)


def run_arrow_partition(spec: TaskSpec, plans: list[bytes], batches: Iterable[pa.RecordBatch],
                        subtasks: WorkerSubtasks = WORKER_SUBTASKS) -> Iterator[pa.RecordBatch]:
    """Run the one subtask of this task's partition of the routed batch (``mapInArrow``, where no plan can be
    zipped with the partition): ``batches`` are its rows and its heartbeat row, whose subtask column names the
    plan of ``plans`` it runs. Yields its ack as a one-row batch of :data:`ACK_SCHEMA`."""
    started = time.perf_counter()
    received = list(batches)
    table = pa.Table.from_batches(received) if received else None
    indexes = pc.unique(table.column(SUBTASK_COLUMN)).to_pylist() if table is not None else []
    if len(indexes) != 1:
        raise RuntimeError(f"a spate task got the rows of subtasks {indexes} instead of one subtask's: Spark did not "
                           "keep one subtask per partition")
    assert table is not None
    plan = SubtaskPlan.from_dict(json.loads(plans[indexes[0]]))
    ack = run_subtask(spec, plan, table, subtasks, arrow_read_ms=(time.perf_counter() - started) * 1000)
    yield pa.RecordBatch.from_pydict({ACK_COLUMN: [ack]}, schema=ACK_SCHEMA)


def run_subtask(spec: TaskSpec, plan: SubtaskPlan, table: pa.Table,
                subtasks: WorkerSubtasks = WORKER_SUBTASKS, arrow_read_ms: float = 0.0) -> str:
    """Run one subtask's batch: ``table`` holds its rows and its heartbeat row (so every subtask runs every
    batch, and timers fire without input). The outputs were checked against the output schema as the
    processor produced them (:mod:`spate.runtime.outputs`). Returns the ack, which says on which executor
    the subtask's state now lives."""
    started = time.perf_counter()
    _check_rows_belong(plan, table)
    subtask = subtasks.get(spec, plan)
    batch, initial = keyed_batches(spec, table)
    grouped = time.perf_counter()
    try:
        out = subtask.run(plan, batch, initial)
    finally:
        subtask.release_local_state()
    executor = this_executor()
    out.ack.executor = str(executor) if executor is not None else None
    stats = out.ack.stats
    stats["spark_partition"] = _partition_id()
    stats["peak_rss_bytes"] = peak_rss_bytes()
    if spec.settings.profile:
        stats["profile"] = {"arrow_read_ms": round(arrow_read_ms, 3),
                            "group_ms": round((grouped - started) * 1000, 3), **stats.get("profile", {}),
                            "task_ms": round(arrow_read_ms + (time.perf_counter() - started) * 1000, 3)}
    return json.dumps(out.ack.to_dict())


def peak_rss_bytes() -> int:
    """This process's peak resident set size (Linux reports ``ru_maxrss`` in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _check_rows_belong(plan: SubtaskPlan, table: pa.Table) -> None:
    """Every row of the partition must be the plan's subtask's."""
    others = set(pc.unique(table.column(SUBTASK_COLUMN)).to_pylist()) - {plan.index}
    if others:
        raise RuntimeError(f"rows of subtasks {sorted(others)} reached the task of subtask {plan.index}")


def _partition_id() -> int | None:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    return ctx.partitionId() if ctx is not None else None


def keyed_batch(spec: TaskSpec, table: pa.Table) -> KeyedBatch:
    """The subtask's data rows (heartbeat rows dropped) grouped by key with Arrow, with the stream's own
    columns only."""
    return keyed_batches(spec, table)[0]


def keyed_batches(spec: TaskSpec, table: pa.Table) -> tuple[KeyedBatch, KeyedBatch | None]:
    """:func:`keyed_batch`, and the subtask's rows of the initial state grouped by key when the batch has
    them (the first batch of a new query given an initial state)."""
    rows = table.filter(pc.invert(table.column(HEARTBEAT_COLUMN)))
    rows = rows.drop_columns([SUBTASK_COLUMN, HEARTBEAT_COLUMN, ROUTE_COLUMN])
    if INITIAL_COLUMN not in rows.column_names:
        return KeyedBatch.from_arrow(rows, spec.key_columns, KG_COLUMN), None
    is_initial = pc.is_valid(rows.column(INITIAL_COLUMN))
    data = rows.filter(pc.invert(is_initial)).drop_columns([INITIAL_COLUMN])
    return (KeyedBatch.from_arrow(data, spec.key_columns, KG_COLUMN),
            _initial_batch(rows.filter(is_initial), spec.key_columns))


def _initial_batch(rows: pa.Table, key_columns: tuple[str, ...]) -> KeyedBatch:
    """Initial-state rows with their own columns (the struct's fields), grouped by the key the driver put in
    the stream's key columns."""
    struct = rows.column(INITIAL_COLUMN).combine_chunks()
    keys = {f"__spate_key{i}": rows.column(c) for i, c in enumerate(key_columns)}
    fields = {struct.type.field(i).name: struct.field(i) for i in range(struct.type.num_fields)}
    grouped = KeyedBatch.from_arrow(pa.table({**keys, KG_COLUMN: rows.column(KG_COLUMN), **fields}), list(keys),
                                    KG_COLUMN)
    return KeyedBatch(grouped.keys, grouped.key_groups, grouped.offsets,
                      table=grouped.table.drop_columns(list(keys)))
