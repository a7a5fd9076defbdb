"""What a :class:`~spate.spark.stream.StatefulStream` is, fixed when it is built (:class:`StreamDefinition`), the
form of its sink, and how each run's query starts (:class:`StartOptions`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from spate.runtime.autoscale import AutoscalePolicy
from spate.runtime.idle import IdleBatches
from spate.runtime.subtask import ProcessorFactory
from spate.spark.subtask_job import InitialState

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

Sink = Callable[[Any, int], None]  # the sink's function: (a batch's outputs as a DataFrame, its batch id)


@dataclass(frozen=True)
class StreamDefinition:
    """What a stream is, fixed when it is built (:class:`~spate.spark.stream.StatefulStream`'s arguments, checked):
    its streaming DataFrame, key columns, the factory of its processor, the schema of its outputs (a
    ``StructType``, and as Arrow: what the outputs are checked against), the initial state of a new query,
    when a batch without input is due (``idle``) and whether the query runs such batches (``idle_batches``),
    whether batches that recover state say so on standard error (``progress``; None: on a terminal) and its
    autoscaling policy."""

    df: Any
    key_columns: tuple[str, ...]
    factory: ProcessorFactory
    output_schema: StructType
    arrow_output_schema: pa.Schema
    initial_state: InitialState | None
    idle: IdleBatches
    idle_batches: bool
    progress: bool | None
    autoscale: AutoscalePolicy | None

    @property
    def spark(self) -> Any:
        return self.df.sparkSession


@dataclass(frozen=True)
class StartOptions:
    """How a run's ``StreamingQuery`` starts (:meth:`StatefulStream.start`'s keyword arguments): Spark's trigger,
    the query's name, and where Spark's own checkpoint is (a location given, or a driver-local cache directory
    spate mirrors into the root)."""

    trigger: dict[str, Any] | None = None
    query_name: str | None = None
    spark_checkpoint: str | None = None
    spark_checkpoint_cache: str | None = None
