"""Exactly-once table sinks: Parquet directories, Delta and Iceberg tables (:mod:`spate.sinks.table_sink`)."""

from spate.sinks.delta import DeltaSink
from spate.sinks.iceberg import IcebergSink
from spate.sinks.parquet import ParquetSink
from spate.sinks.table_sink import SinkFile, TableSink

__all__ = ["DeltaSink", "IcebergSink", "ParquetSink", "SinkFile", "TableSink"]
