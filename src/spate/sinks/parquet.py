"""A directory of Parquet files as an exactly-once table sink (:mod:`spate.sinks.table_sink`)."""

from __future__ import annotations

import pyarrow as pa

from spate.sinks.table_sink import SinkFile, TableSink


class ParquetSink(TableSink):
    """Appends each batch's outputs to the directory ``location`` as ``part-<batch>-<subtask>-<query>.parquet``
    files (local, ``file://``, ``s3://``, ``hdfs://``), readable by any Parquet reader (``spark.read.parquet``,
    ``pyarrow.dataset``, DuckDB's ``read_parquet('<dir>/*.parquet')``), which all skip ``_spate_staging``.

    A directory has no commit log: a batch's files appear one rename after the other, so a reader listing the
    directory during a commit may see part of that batch (after a crash, the restart completes it). Each batch
    is in the directory exactly once; for atomic batches use :class:`~spate.sinks.delta.DeltaSink` or
    :class:`~spate.sinks.iceberg.IcebergSink`."""

    format = "parquet"

    def _open_table(self, schema: pa.Schema) -> None:
        """Nothing to create: the directory appears with its first file."""

    def _committed(self, batch_id: int) -> bool:
        return False  # the moves are the commit, each skipped once done

    def _commit_files(self, batch_id: int, files: list[SinkFile]) -> None:
        """The files are in place: nothing more to record."""
