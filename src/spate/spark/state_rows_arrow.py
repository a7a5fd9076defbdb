"""The rows of :func:`~spate.spark.state_frame.read_state` as Arrow batches, for a session without RDDs (Spark
Connect): one ``mapInArrow`` task per subtask of the checkpoint, each rebuilding that subtask's state from
checkpoint storage as the classic reader does, its rows shaped to the frame's schema and written as Arrow."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from itertools import islice
from typing import Any

BATCH_ROWS = 4096  # rows per Arrow batch a task yields


@dataclass
class ArrowStateRows:
    """The ``mapInArrow`` function: subtask numbers in (the ``id`` column of ``spark.range``), state rows out.

    ``read`` yields a subtask's raw rows, ``shape`` makes one a tuple in the frame's column order (both are the
    classic reader's), ``schema`` is the frame's Spark schema and ``arrow_schema`` its Arrow form."""

    read: Callable[[Iterable[int]], Iterator[Any]]
    shape: Callable[[Any], tuple]
    schema: Any
    arrow_schema: Any

    def __call__(self, batches: Iterable[Any]) -> Iterator[Any]:
        for batch in batches:
            for subtask in batch.column(0).to_pylist():
                rows = (self.shape(r) for r in self.read([subtask]))
                while chunk := list(islice(rows, BATCH_ROWS)):
                    yield self._batch(chunk)

    def _batch(self, rows: list[tuple]) -> Any:
        import pyarrow as pa

        columns = [pa.array([plain(row[i], field.dataType) for row in rows], type=self.arrow_schema.field(i).type)
                   for i, field in enumerate(self.schema.fields)]
        return pa.RecordBatch.from_arrays(columns, schema=self.arrow_schema)


def plain(value: Any, dtype: Any) -> Any:
    """``value`` in the form pyarrow builds ``dtype`` from: structs as dicts (from tuples, Rows or dicts), maps
    as lists of pairs, nested to any depth."""
    from pyspark.sql.types import ArrayType, MapType, StructType

    if value is None:
        return None
    if isinstance(dtype, StructType):
        if isinstance(value, dict):
            return {f.name: plain(value.get(f.name), f.dataType) for f in dtype.fields}
        if hasattr(value, "__fields__"):  # a Row: by name
            return plain(value.asDict(), dtype)
        return {f.name: plain(v, f.dataType) for f, v in zip(dtype.fields, value, strict=False)}
    if isinstance(dtype, ArrayType):
        return [plain(v, dtype.elementType) for v in value]
    if isinstance(dtype, MapType):
        pairs = value.items() if isinstance(value, dict) else value
        return [(plain(k, dtype.keyType), plain(v, dtype.valueType)) for k, v in pairs]
    return value
