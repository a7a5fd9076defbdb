"""The sink's DataFrame: a batch's outputs read back from where its subtasks staged them.

Subtasks stage their outputs in checkpoint storage before they acknowledge (write-ahead), so the micro-batch
needs one Spark job only (run the subtasks, collect the acks), and the outputs the sink reads survive the loss
of the executors that produced them. The DataFrame is lazy: its reads run in the sink's own job.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

import pyarrow as pa

from spate.checkpoint.metadata import CheckpointMetadata
from spate.fs import storage_for
from spate.snapshot.outputs import OutputsHandle, read_outputs

HANDLE_COLUMN = "__spate_staged"


def staged_outputs_frame(spark: Any, checkpoint_uri: str, meta: CheckpointMetadata, output_schema: Any,
                         arrow_schema: pa.Schema, allow_pickle: bool) -> Any:
    """A DataFrame (``output_schema``) of checkpoint ``meta``'s staged outputs under ``checkpoint_uri``."""
    handles = [json.dumps(st.outputs.to_dict()) for st in meta.subtasks if st.outputs is not None]
    if not handles:
        return spark.createDataFrame([], output_schema)

    def read(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        return read_staged(checkpoint_uri, batches, arrow_schema, allow_pickle)

    refs = spark.createDataFrame([(h,) for h in handles], f"{HANDLE_COLUMN} string")
    return refs.mapInArrow(read, output_schema)


def read_staged(checkpoint_uri: str, batches: Iterable[pa.RecordBatch], arrow_schema: pa.Schema,
                allow_pickle: bool) -> Iterator[pa.RecordBatch]:
    """On an executor: the rows of every staged-outputs handle in ``batches``, as Arrow batches."""
    storage = storage_for(checkpoint_uri)
    for batch in batches:
        for handle in batch.column(0).to_pylist():
            rows = read_outputs(storage, OutputsHandle.from_dict(json.loads(handle)), allow_pickle)
            yield from pa.Table.from_pylist(rows, schema=arrow_schema).to_batches()
