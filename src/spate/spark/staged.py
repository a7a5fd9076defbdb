"""The sink's DataFrame: a batch's outputs read back from where its subtasks staged them.

Subtasks stage their outputs in checkpoint storage before they acknowledge (write-ahead), so the micro-batch
needs one Spark job only (run the subtasks, collect the acks), and the outputs the sink reads survive the loss
of the executors that produced them. The DataFrame is lazy: its reads run in the sink's own job, so it is
valid during the sink call only (as ``foreachBatch``'s own DataFrame): later checkpoints may subsume the files.

Staged as Parquet files (where Spark reads the checkpoint root as it is), the DataFrame is Spark's own Parquet
scan, in the JVM; staged framed (Arrow IPC, or another root), Python tasks read them back.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from spate.checkpoint.metadata import CheckpointMetadata
from spate.errors import SettingError
from spate.fs import CheckpointStorage, LocalStorage, storage_for
from spate.snapshot.outputs import PARQUET, OutputsHandle, read_outputs_table

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

_GLOB = "*?[]{}\\"  # characters Hadoop's globbing of paths interprets
_VERIFY_CHECKSUMS = "parquet.page.verify-checksum.enabled"


def spark_readable(storage: CheckpointStorage) -> bool:
    """Whether Spark reads files of ``storage`` by their path as it is: a local or mounted shared file system
    whose root has no character Hadoop's path globbing would interpret. Object stores need Hadoop connectors
    (``s3a://``) whose configuration spate does not know."""
    return isinstance(storage, LocalStorage) and not any(c in storage.root for c in _GLOB)


def parquet_writable(schema: pa.Schema | None) -> bool:
    """Whether Spark's Parquet source reads outputs of ``schema`` (it refuses columns of the null type)."""
    return schema is None or not any(pa.types.is_null(f.type) for f in schema)


def staged_format(setting: str, storage: CheckpointStorage, schema: pa.Schema | None = None) -> str:
    """How subtasks stage outputs of ``schema`` for a function sink: the ``staged_outputs`` setting
    (``"auto"``, ``"parquet"`` or ``"arrow"``) resolved for ``storage``."""
    if setting == "auto":
        return PARQUET if spark_readable(storage) and parquet_writable(schema) else "arrow"
    if setting == PARQUET and not spark_readable(storage):
        raise SettingError(f"staged_outputs='parquet' needs a checkpoint root Spark reads by path (a local or "
                           f"mounted file system, no glob characters {_GLOB!r} in its path); {storage.uri} is not "
                           "one: use staged_outputs='auto' or 'arrow'")
    if setting == PARQUET and not parquet_writable(schema):
        raise SettingError("staged_outputs='parquet': Spark's Parquet source reads no column of the null type, which "
                           "the output schema has: use staged_outputs='auto' or 'arrow'")
    return setting


@dataclass(frozen=True)
class StagedOutputs:
    """How a run's sink reads the outputs its subtasks staged in checkpoint ``storage`` (the root): as DataFrames
    of ``schema`` (a ``StructType``), whose rows read back by Python tasks are checked against ``arrow_schema``;
    pickled values only if ``allow_pickle``."""

    storage: CheckpointStorage
    schema: StructType
    arrow_schema: pa.Schema
    allow_pickle: bool

    def frame(self, spark: Any, meta: CheckpointMetadata) -> Any:
        """A DataFrame of checkpoint ``meta``'s staged outputs."""
        storage, schema = self.storage, self.schema
        handles = [st.outputs for st in meta.subtasks if st.outputs is not None]
        if not handles:
            return spark.createDataFrame([], schema)
        if spark_readable(storage) and all(h.serializer == PARQUET for h in handles):
            paths = [f"file://{storage.path(h.path)}" for h in handles]
            # Spark's reader is asked to verify the page checksums spate wrote
            return spark.read.schema(schema).option(_VERIFY_CHECKSUMS, "true").parquet(*paths)
        encoded = [h.to_dict() for h in handles]
        uri, arrow_schema, allow_pickle = storage.uri, self.arrow_schema, self.allow_pickle

        def read(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            return read_staged(uri, encoded, batches, arrow_schema, allow_pickle)

        return spark.range(0, len(encoded), 1, len(encoded)).mapInArrow(read, schema)  # a task per file


def read_staged(checkpoint_uri: str, handles: list[dict[str, Any]], batches: Iterable[pa.RecordBatch],
                arrow_schema: pa.Schema, allow_pickle: bool) -> Iterator[pa.RecordBatch]:
    """On an executor: the rows of the staged-outputs handles whose indexes ``batches`` hold."""
    storage = storage_for(checkpoint_uri)
    for batch in batches:
        for i in batch.column(0).to_pylist():
            yield from read_outputs_table(storage, OutputsHandle.from_dict(handles[i]), arrow_schema,
                                          allow_pickle).to_batches()
