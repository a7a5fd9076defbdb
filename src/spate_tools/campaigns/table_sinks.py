"""The crash campaign's table sinks (``spate fuzz --sink parquet|delta|iceberg``): the model job's outputs as
rows of a table, the table sink to write them with, and the table read back as deliveries per batch."""

from __future__ import annotations

import json
import os
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds

from spate import DeltaSink, IcebergSink, ParquetSink, TableSink
from spate.runtime.processor import Context
from spate_tools.campaigns.model_job import ModelJob

KINDS = ("parquet", "delta", "iceberg")
SCHEMA = pa.schema([("batch", pa.int64()), ("row", pa.string())])
ICEBERG_TABLE = "fuzz.outputs"


def row_text(row: dict[str, Any]) -> str:
    """One output row, comparable across serialization: its items, sorted, after a JSON round trip."""
    return repr(sorted(json.loads(json.dumps(row)).items()))


class TableRows(ModelJob):
    """The model job, each output row a table row: (batch id, :func:`row_text` of the row)."""

    def process(self, key: Any, rows: Sequence[dict[str, Any]], ctx: Context) -> list[dict]:
        return [{"batch": ctx.batch_id, "row": row_text(r)} for r in super().process(key, rows, ctx)]

    def on_timer(self, key: Any, timestamp_ms: int, ctx: Context) -> list[dict]:
        return [{"batch": ctx.batch_id, "row": row_text(r)} for r in super().on_timer(key, timestamp_ms, ctx)]


def make_sink(kind: str, where: str) -> TableSink:
    if kind == "parquet":
        return ParquetSink(where)
    if kind == "delta":
        return DeltaSink(where)
    if kind == "iceberg":
        return IcebergSink(ICEBERG_TABLE, warehouse=where)
    raise ValueError(f"unknown table sink {kind!r}: use one of {KINDS}")


def read_table(kind: str, where: str) -> dict[int, list[list[str]]]:
    """The table's rows per batch, as one delivery each (a batch committed twice shows as doubled rows)."""
    if kind == "parquet":
        table = ds.dataset(where, format="parquet").to_table() if os.path.isdir(where) else SCHEMA.empty_table()
    elif kind == "delta":
        from deltalake import DeltaTable
        table = DeltaTable(where).to_pyarrow_table()
    else:
        table = IcebergSink(ICEBERG_TABLE, warehouse=where).load_table().scan().to_arrow()
    rows: dict[int, list[str]] = defaultdict(list)
    for r in table.to_pylist():
        rows[r["batch"]].append(r["row"])
    return {b: [sorted(texts)] for b, texts in rows.items()}


def expected_rows(model_rows: list[dict]) -> list[str]:
    """The model's outputs of a batch as the table holds them."""
    return sorted(row_text(r) for r in model_rows)
