"""Placement: a subtask's batch runs on the executor that holds its live state.

Spark's own state store does this with ``StateStoreCoordinator`` and ``StateStoreRDD.getPreferredLocations``.
From PySpark, without a JVM class of our own, the one RDD whose preferred locations we choose is
``SparkContext.makeRDD(Seq[(element, locations)])``. So each batch is a zip of two RDDs of P partitions
(:func:`placed_batch`):

- the batch's rows, routed to partition i for subtask i, as Arrow (``Dataset.toArrowBatchRdd`` with no row
  limit: one record batch per partition, and every partition holds its subtask's heartbeat row), and
- subtask i's plan, in partition i of a ``makeRDD`` whose preferred location is the executor that ran
  subtask i last (``executor_<host>_<id>``, Spark's ``ExecutorCacheTaskLocation``).

A zip's partition prefers its parents' locations, so Spark's delay scheduling applies as for cached blocks:
subtask i runs on its executor when a slot frees up there within ``spark.locality.wait``, elsewhere after
that, and at once elsewhere when the executor is gone (the subtask then catches up or restores there). The
zip and the Python stage over it are one stage of the batch's one job; nothing is cached or shipped twice.

The driver learns where a subtask's state lives from its ack (``SubtaskAck.executor``, found by each
Python worker from its executor JVM's command line: :func:`this_executor`).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from spate.checkpoint.assignment import overlapping_subtasks
from spate.checkpoint.protocol import SubtaskAck
from spate.spark.jvm_class import jvm_class
from spate.spark.procfs import cmdline, parent

_LOCATION_PREFIX = "executor_"  # Spark's TaskLocation tag for "this executor" (process-local)


@dataclass(frozen=True)
class ExecutorId:
    """A Spark executor: the host it registered with and its id."""

    host: str
    executor_id: str

    def __str__(self) -> str:
        return f"{self.executor_id}@{self.host}"

    @staticmethod
    def parse(text: str) -> ExecutorId:
        executor_id, _, host = text.partition("@")
        if not executor_id or not host:
            raise ValueError(f"not an executor ('<id>@<host>'): {text!r}")
        return ExecutorId(host, executor_id)

    @property
    def location(self) -> str:
        """The preferred-location string Spark's scheduler reads as this executor."""
        return f"{_LOCATION_PREFIX}{self.host}_{self.executor_id}"


@functools.lru_cache(maxsize=1)
def this_executor() -> ExecutorId | None:
    """The executor whose Python worker this is, or None (local mode, or not found).

    Python workers are forked by ``pyspark.daemon``, which the executor JVM starts; every cluster manager
    starts that JVM with ``--executor-id <id> --hostname <host>`` (standalone, YARN, Kubernetes)."""
    pid = os.getpid()
    for _ in range(8):
        found = _executor_in(cmdline(pid))
        if found is not None:
            return found
        pid = parent(pid)
        if pid <= 1:
            return None
    return None


def _executor_in(args: list[str]) -> ExecutorId | None:
    if "--executor-id" not in args or "--hostname" not in args:
        return None
    try:
        return ExecutorId(args[args.index("--hostname") + 1], args[args.index("--executor-id") + 1])
    except IndexError:
        return None


class Placement:
    """Driver side: the executor each subtask of the current parallelism last ran on."""

    def __init__(self) -> None:
        self._parallelism = 0
        self._executors: dict[int, ExecutorId] = {}

    def record(self, parallelism: int, acks: list[SubtaskAck]) -> None:
        """The acks of a completed batch: where each subtask's state now lives."""
        if parallelism != self._parallelism:
            self._parallelism, self._executors = parallelism, {}
        for ack in acks:
            if ack.executor:
                self._executors[ack.index] = ExecutorId.parse(ack.executor)
            else:
                self._executors.pop(ack.index, None)

    def locations(self, parallelism: int, alive: Collection[str] | None = None,
                  max_parallelism: int | None = None) -> list[list[str]]:
        """Per subtask, its preferred locations (none known: no preference).

        At a new parallelism (an online rescale, given ``max_parallelism``), subtask i prefers the executor of
        the old subtask holding the largest part of its key groups: the one whose local copy it starts from.
        With ``alive`` (the ids of the application's live executors), an executor that is gone is preferred
        by nobody, and one holding more than its share (``ceil(P / alive executors)``) keeps its preference
        for the lowest-numbered subtasks only: the others go where Spark has room (e.g. the replacement of a
        lost executor) and recover there once, instead of queueing behind each other on one executor."""
        if parallelism == self._parallelism:
            executors = self._executors
        elif max_parallelism is not None and self._parallelism:
            seeds = overlapping_subtasks(max_parallelism, self._parallelism, parallelism)
            executors = {i: e for i, row in enumerate(seeds) if (e := self._executors.get(row[0])) is not None}
        else:
            return [[] for _ in range(parallelism)]
        share = -(-parallelism // len(alive)) if alive else parallelism
        kept: dict[ExecutorId, int] = {}
        out: list[list[str]] = []
        for i in range(parallelism):
            e = executors.get(i)
            if e is None or (alive is not None and e.executor_id not in alive) or kept.get(e, 0) >= share:
                out.append([])
                continue
            kept[e] = kept.get(e, 0) + 1
            out.append([e.location])
        return out

    def executor_of(self, index: int) -> ExecutorId | None:
        return self._executors.get(index)


def alive_executors(sc: Any) -> set[str] | None:
    """The ids of the application's live executors (the driver excluded), or None if Spark does not say."""
    master = str(getattr(sc, "master", ""))
    if master == "local" or master.startswith("local["):  # one process, no executors: asking makes Spark warn
        return set()
    try:
        ids = sc._jsc.sc().getExecutorIds()  # noqa: SLF001 - Spark's own list, through the gateway
        return {str(ids.apply(i)) for i in range(ids.size())}
    except Exception:  # noqa: BLE001 - another Spark version: place without it
        return None


def placed_batch(routed_df: Any, plans: list[bytes], locations: list[list[str]]) -> Any:
    """The JavaRDD whose partition i yields two byte strings, subtask i's rows as one Arrow record batch and
    its plan, preferring ``locations[i]``. ``routed_df`` must have exactly ``len(plans)`` partitions, none
    empty (each holds its subtask's heartbeat row)."""
    sc = routed_df.sparkSession.sparkContext
    jvm = sc._jvm
    rows = _arrow_batches(routed_df)
    scala, array_list, pair, class_tag, java_class = (jvm_class(jvm, name) for name in (
        "scala.jdk.javaapi.CollectionConverters", "java.util.ArrayList", "scala.Tuple2", "scala.reflect.ClassTag",
        "java.lang.Class"))
    items = array_list()
    for plan, where in zip(plans, locations, strict=True):
        prefs = array_list()
        for location in where:
            prefs.add(location)
        items.add(pair(bytearray(plan), scala.asScala(prefs).toList()))
    byte_array = class_tag.apply(java_class.forName("[B"))
    plan_rdd = sc._jsc.sc().makeRDD(scala.asScala(items).toList(), byte_array)
    return rows.toJavaRDD().zip(plan_rdd.toJavaRDD())


_MAX_RECORDS = "spark.sql.execution.arrow.maxRecordsPerBatch"


def _arrow_batches(routed_df: Any) -> Any:
    """The JVM RDD of ``routed_df`` as one Arrow record batch per partition (no row limit). Spark 4.2 takes the
    limit as an argument; 4.0 and 4.1 read it (and the time zone) from the session when called, so it is set
    on the batch's session for the call."""
    from py4j.protocol import Py4JError

    jdf = routed_df._jdf  # noqa: SLF001
    try:
        return jdf.toArrowBatchRdd(0, "UTC", False, False)
    except Py4JError:  # Spark 4.0, 4.1: no such overload
        conf = routed_df.sparkSession.conf
        before = conf.get(_MAX_RECORDS, None)
        conf.set(_MAX_RECORDS, "0")
        try:
            return jdf.toArrowBatchRdd()
        finally:
            if before is None:
                conf.unset(_MAX_RECORDS)
            else:
                conf.set(_MAX_RECORDS, before)


__all__ = ["ExecutorId", "Placement", "alive_executors", "placed_batch", "this_executor"]
