"""The one Spark job of a micro-batch on a Spark Connect session, built with DataFrame operations only.

Connect has no RDDs, so no plan can be zipped with a partition and no executor preferred: the batch is routed
as in classic mode (:class:`~spate.spark.subtask_job.RoutedInput`: ``repartition(P)`` on a routing value, exactly
P partitions, subtask i's rows and heartbeat row in partition i), ``mapInArrow`` runs each partition's subtask
with the plan its heartbeat row names (the plans travel in the function's closure), and the acks come back as
one row each. A subtask that lands on another executor than its state catches up from checkpoint storage (its
ack says so: ``restored``, or ``caught_up`` when a local copy there was only behind).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from spate.checkpoint.protocol import SubtaskAck
from spate.spark.subtask_job import RoutedInput
from spate.spark.task import ACK_COLUMN, ACK_SCHEMA, run_arrow_partition
from spate.spark.worker_errors import batch_failed

ACK_DDL = f"{ACK_COLUMN} string"


class ArrowSubtaskJob(RoutedInput):
    """Runs the subtasks of one run of a stream as one ``mapInArrow`` job per batch (any session; the only one
    a Connect session allows)."""

    def run(self, batch_df: Any, batch_id: int, plans: list[bytes], *, with_initial: bool = False
            ) -> list[SubtaskAck]:
        """Batch ``batch_id``'s job for ``plans`` (one per subtask, encoded): route every row to its subtask's
        partition, run each subtask, collect the acks."""
        spec, p = self.spec, len(plans)
        routed = self.routed(batch_df, p, with_initial=with_initial)

        def task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            return run_arrow_partition(spec, plans, batches)

        try:
            rows = routed.mapInArrow(task, ACK_DDL).collect()
        except Exception as e:
            told = batch_failed(batch_id, e)
            if told is None:
                raise
            raise told from None
        acks = [SubtaskAck.from_dict(json.loads(row[ACK_COLUMN])) for row in rows]
        if sorted(a.index for a in acks) != list(range(p)):
            raise RuntimeError(f"batch {batch_id}: acks of subtasks {sorted(a.index for a in acks)} came "
                               f"back, not one of each of {p}")
        return acks


__all__ = ["ACK_SCHEMA", "ArrowSubtaskJob"]
