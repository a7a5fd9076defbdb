"""The driver's side of a table sink (:mod:`spate.sinks.table_sink`): the delivery of a complete checkpoint is
the commit of the data files its subtasks staged; what attempts that never completed staged is cleaned."""

from __future__ import annotations

import logging
import time

import pyarrow as pa

from spate.checkpoint.coordinator import Coordinator
from spate.checkpoint.discovery import metadata_ids
from spate.checkpoint.metadata import CheckpointMetadata
from spate.sinks.table_sink import TableSink

log = logging.getLogger(__name__)
CLEAN_EVERY = 100  # batches between sweeps of the staging directory (retried Spark tasks leave files behind)


class TableCommitter:
    """Commits complete checkpoints' staged data files to ``sink`` (opened here with the query's id and
    ``schema``), in checkpoint order, and sweeps the staging directory of attempts that never completed."""

    def __init__(self, sink: TableSink, coordinator: Coordinator, schema: pa.Schema | None) -> None:
        self.sink, self.coordinator = sink, coordinator
        query = coordinator.query
        assert query is not None, "the coordinator is started"
        sink.open(query.query_id, schema)
        self._since_clean = 0
        self.last_commit_ms = 0.0

    def deliver(self, meta: CheckpointMetadata) -> None:
        """Commit checkpoint ``meta``'s data files to the table (batch id = checkpoint id)."""
        started = time.perf_counter()
        self.sink.commit(meta.checkpoint_id, [st.sink_file for st in meta.subtasks if st.sink_file is not None])
        self.last_commit_ms = (time.perf_counter() - started) * 1000
        self._since_clean += 1
        if self._since_clean >= CLEAN_EVERY:
            self.clean(committed_only=True)

    def clean(self, committed_only: bool = False) -> None:
        """Delete staged files no complete checkpoint will commit (between batches, on the owning driver):
        those of committed batches, and unless ``committed_only`` (at the start, after a failed batch) those of
        batches after the latest complete checkpoint. Between batches and at the end only the former: a newer
        driver that took the root over meanwhile may be running the next batch."""
        self._since_clean = 0
        after = None
        if not committed_only:
            self.coordinator.take_over.check()  # a newer driver may be running a batch: its files are not ours
            # every metadata file counts, also one whose write was reported failed after it went through
            after = max(metadata_ids(self.coordinator.storage), default=-1)
        deleted = self.sink.clean_staging(self.coordinator.delivery.delivered_upto(), after)
        if deleted:
            log.info("%r: deleted %d staged data files of attempts that never completed", self.sink, len(deleted))
