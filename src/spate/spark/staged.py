"""The sink's DataFrame: a batch's outputs read back from where its subtasks staged them.

Subtasks stage their outputs in checkpoint storage before they acknowledge (write-ahead), so the micro-batch
needs one Spark job only (run the subtasks, collect the acks), and the outputs the sink reads survive the loss
of the executors that produced them. The DataFrame is lazy: its reads run in the sink's own job, so it is
valid during the sink call only (as ``foreachBatch``'s own DataFrame): later checkpoints may subsume the files.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import pyarrow as pa

from spate.checkpoint.metadata import CheckpointMetadata
from spate.fs import storage_for
from spate.snapshot.outputs import OutputsHandle, read_outputs_table


def staged_outputs_frame(spark: Any, checkpoint_uri: str, meta: CheckpointMetadata, output_schema: Any,
                         arrow_schema: pa.Schema, allow_pickle: bool) -> Any:
    """A DataFrame (``output_schema``) of checkpoint ``meta``'s staged outputs under ``checkpoint_uri``."""
    handles = [st.outputs.to_dict() for st in meta.subtasks if st.outputs is not None]
    if not handles:
        return spark.createDataFrame([], output_schema)

    def read(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        return read_staged(checkpoint_uri, handles, batches, arrow_schema, allow_pickle)

    return spark.range(0, len(handles), 1, len(handles)).mapInArrow(read, output_schema)  # a task per file


def read_staged(checkpoint_uri: str, handles: list[dict[str, Any]], batches: Iterable[pa.RecordBatch],
                arrow_schema: pa.Schema, allow_pickle: bool) -> Iterator[pa.RecordBatch]:
    """On an executor: the rows of the staged-outputs handles whose indexes ``batches`` hold."""
    storage = storage_for(checkpoint_uri)
    for batch in batches:
        for i in batch.column(0).to_pylist():
            yield from read_outputs_table(storage, OutputsHandle.from_dict(handles[i]), arrow_schema,
                                          allow_pickle).to_batches()
