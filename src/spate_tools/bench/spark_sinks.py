"""``spate bench spark``'s table-sink variants: spate writing each batch's outputs to a Parquet directory, a
Delta table and an Iceberg table (:mod:`spate.sinks`), beside Spark's ``transformWithState`` writing Parquet
with its own file sink; the tables' files and rows, counted after the run."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pyarrow.dataset as ds

from spate import DeltaSink, IcebergSink, ParquetSink, TableSink

SPATE_TABLE_VARIANTS = {"spate-parquet": "parquet", "spate-delta": "delta", "spate-iceberg": "iceberg"}
SPARK_TABLE_VARIANTS = ("transformWithState-parquet",)
ICEBERG_TABLE = "bench.counts"


def table_location(ckpt: str) -> str:
    return f"{ckpt}-table"


def table_sink(variant: str, ckpt: str) -> TableSink:
    """The table sink of spate's ``variant``, next to its checkpoint root."""
    where, kind = table_location(ckpt), SPATE_TABLE_VARIANTS[variant]
    if kind == "parquet":
        return ParquetSink(where)
    if kind == "delta":
        return DeltaSink(where)
    return IcebergSink(ICEBERG_TABLE, warehouse=where)


def table_row_count(variant: str, ckpt: str) -> int:
    """Rows in the variant's table, read by the table format's own reader."""
    where = table_location(ckpt)
    kind = SPATE_TABLE_VARIANTS.get(variant, "parquet")
    if kind == "parquet":  # Spark's file sink lists its files in _spark_metadata; every file here is committed
        return ds.dataset(where, format="parquet", exclude_invalid_files=True).count_rows()
    if kind == "delta":
        from deltalake import DeltaTable
        return DeltaTable(where).to_pyarrow_dataset().count_rows()
    return IcebergSink(ICEBERG_TABLE, warehouse=where).load_table().scan().to_arrow().num_rows


def start_spark_parquet(stateful: Any, ckpt: str) -> Any:
    """Spark's ``transformWithState`` (``stateful``: its result) appending to a Parquet directory with Spark's
    file sink (exactly once through its ``_spark_metadata`` log)."""
    return (stateful.writeStream.format("parquet").option("path", table_location(ckpt))
            .option("checkpointLocation", ckpt).outputMode("append").trigger(availableNow=True).start())


def on_every_batch(spark: Any, observer: Callable[[], None]) -> Any:
    """Call ``observer`` after each batch of any query of ``spark`` (a query whose sink is a table, not a
    function the bench could wrap); returns the listener, for ``spark.streams.removeListener``."""
    from pyspark.sql.streaming import StreamingQueryListener

    class AfterBatch(StreamingQueryListener):
        def onQueryStarted(self, event: Any) -> None:  # noqa: N802
            pass

        def onQueryProgress(self, event: Any) -> None:  # noqa: N802
            if event.progress.numInputRows:
                observer()

        def onQueryIdle(self, event: Any) -> None:  # noqa: N802
            pass

        def onQueryTerminated(self, event: Any) -> None:  # noqa: N802
            pass

    listener = AfterBatch()
    spark.streams.addListener(listener)
    return listener


def table_files(ckpt: str) -> set[str]:
    """Every file in the variant's table directory now (data files and the table format's own)."""
    where = table_location(ckpt)
    return {os.path.relpath(os.path.join(d, f), where) for d, _, files in os.walk(where) for f in files}
