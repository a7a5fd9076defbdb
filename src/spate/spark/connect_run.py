"""One run of a :class:`~spate.spark.stream.StatefulStream` on a Spark Connect session.

On Connect the client holds no JVM and no driver loop: ``foreachBatch``'s function is cloudpickled to the server
and runs there, in one long-lived Python process per query run on the server's driver host. So the run's
driver side lives in that process: :class:`ConnectBatchFunction` is a small picklable object (the stream's
definition without its DataFrame, the settings, the sink) that builds the :class:`~spate.runtime.query.QueryDriver`
(the take-over of the checkpoint root) and the batch's job (:class:`~spate.spark.connect_job.ArrowSubtaskJob`) on
its first batch and keeps them for the run's later batches. The client (:class:`ConnectRun`) only checks the
settings, starts the query and tells a failed batch with spate's message
(:class:`~spate.spark.connect_query.ConnectQuery`).

What Connect cannot do, and what it costs: no preferred locations, so a subtask may run on another executor
than its state and then catches up from checkpoint storage (``local_reuse`` shows it); Spark's checkpoint must be
a location Spark opens itself (``<root>/_spark`` for a local, ``file://`` or ``hdfs://`` root, else
``start(spark_checkpoint=...)``): there is no driver-local mirror; the user's sink runs on the server.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from spate.errors import SettingError
from spate.fs import join_uri
from spate.sinks.table_sink import TableSink
from spate.spark.connect_job import ArrowSubtaskJob
from spate.spark.connect_query import ConnectQuery
from spate.spark.micro_batches import MicroBatches, NoJobCount
from spate.spark.settings import SpateSettings
from spate.spark.spark_checkpoint import SPARK_CHECKPOINT_DIR, check_locations, hadoop_opens, open_spark_checkpoint
from spate.spark.stream_definition import Sink, StreamDefinition
from spate.spark.stream_metrics import StreamFigures
from spate.spark.worker_errors import BatchFailedError, failed_on_driver


class ConnectBatchFunction:
    """``foreachBatch``'s function of one run on a Connect session (pickled to the server): the run's driver side,
    built on the first batch in the server's ``foreachBatch`` process and kept there for the run's later batches.
    ``spark_checkpoint``: the location given to ``start()``, None for ``<root>/_spark``."""

    def __init__(self, stream: StreamDefinition, settings: SpateSettings, sink: Sink | TableSink | None,
                 spark_checkpoint: str | None) -> None:
        self.stream = dataclasses.replace(stream, df=None)  # the client's DataFrame stays on the client
        self.settings, self.sink, self.spark_checkpoint = settings, sink, spark_checkpoint
        self._batches: MicroBatches | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_batches": None}

    def __call__(self, batch_df: Any, batch_id: int) -> None:
        try:
            batches = self._batches_for(batch_df)
            batches.run(batch_df, batch_id, NoJobCount())
        except BatchFailedError as e:  # Spark's error and the client get spate's message, not these frames
            raise e.with_traceback(None) from None
        except Exception as e:  # the driver side's own (the sink's, say): told last, its frames above in the log
            raise BatchFailedError(failed_on_driver(e, batch_id), batch_id=batch_id, error=e) from e

    def _batches_for(self, batch_df: Any) -> MicroBatches:
        batches = self._batches
        if batches is None:
            batches = MicroBatches(self.stream, self.settings, self.sink, StreamFigures(),
                                   lambda spec: ArrowSubtaskJob(spec, None))
            # refuses a Spark checkpoint behind spate's (Spark has logged this batch's offsets by now)
            open_spark_checkpoint(batch_df.sparkSession, batches.driver.coordinator, self.spark_checkpoint)
            self._batches = batches
        batches.session = batch_df.sparkSession  # the batch's session: the sink's DataFrame is read with it
        return batches


class ConnectRun:
    """One ``start()`` of ``stream`` on a Connect session: the settings checked on the client (nothing is written
    there), and the query started with a :class:`ConnectBatchFunction`.

    Raises:
        SettingError: what Connect cannot do (an initial state, autoscaling, batches without input, a driver-local
            Spark checkpoint), or a location Spark or spate cannot use.
    """

    def __init__(self, stream: StreamDefinition, settings: SpateSettings, sink: Sink | TableSink | None,
                 options: Any) -> None:
        _check_connect(stream, settings, options)
        self.stream, self.options = stream, options
        self.function = ConnectBatchFunction(stream, settings, sink, options.spark_checkpoint)
        root = settings.checkpoint_root
        self.spark_checkpoint = options.spark_checkpoint or join_uri(root, SPARK_CHECKPOINT_DIR)
        self.query: ConnectQuery | None = None

    def start(self) -> ConnectQuery:
        options = self.options
        writer = self.stream.df.writeStream.foreachBatch(self.function).option("checkpointLocation",
                                                                               self.spark_checkpoint)
        if options.trigger:
            writer = writer.trigger(**options.trigger)
        if options.query_name:
            writer = writer.queryName(options.query_name)
        self.query = ConnectQuery(writer.start())
        return self.query

    def close(self) -> None:
        """Nothing to release on the client: the run's driver side lives in the server's process."""


def _check_connect(stream: StreamDefinition, settings: SpateSettings, options: Any) -> None:
    """Refuse, with the fix, what a stream on a Connect session cannot do (before anything is written)."""
    check_locations(stream.spark, settings.checkpoint_root, options.spark_checkpoint, options.spark_checkpoint_cache)
    refused = [(stream.initial_state is not None, "an initial_state"),
               (stream.autoscale is not None, "autoscale"),
               (stream.idle_batches, "idle_batches (batches without input for timers)"),
               (options.spark_checkpoint_cache is not None, "spark_checkpoint_cache")]
    for refused_here, what in refused:
        if refused_here:
            raise SettingError(f"{what} is not available on a Spark Connect session yet: use a classic session "
                               "(SparkSession.builder.master(...)) for it, or leave it out")
    if options.spark_checkpoint is None and not hadoop_opens(settings.checkpoint_root):
        raise SettingError(f"on a Spark Connect session Spark's own checkpoint must be a location Spark opens: "
                           f"the checkpoint root {settings.checkpoint_root!r} is not one (spate keeps no driver-local "
                           "copy there); pass start(spark_checkpoint=\"s3a://...\") with the Hadoop settings on the "
                           "server, or use a local, file:// or hdfs:// root")
