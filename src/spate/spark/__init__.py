"""PySpark transport: a stateful stream over a streaming DataFrame, run through ``foreachBatch`` with exactly
one ``mapInArrow`` task per subtask per micro-batch (:mod:`spate.spark.routing`). Spark moves the data;
spate's runtime owns the state, its checkpoints and its parallelism."""

from spate.spark.state_frame import read_state, write_savepoint
from spate.spark.stream import StatefulStream, transform_with_state

__all__ = ["StatefulStream", "read_state", "transform_with_state", "write_savepoint"]
