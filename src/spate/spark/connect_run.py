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
import logging
from typing import Any

from spate.checkpoint.metadata import CheckpointMetadata
from spate.errors import SettingError, SpateError
from spate.fs import CheckpointStorage, join_uri, storage_for
from spate.keygroups import MAX_MAX_PARALLELISM, check_parallelism
from spate.runtime.query import QueryDriver
from spate.sinks.table_sink import TableSink
from spate.spark.connect_figures import ProgressPoller, RootBatches, latest_checkpoint
from spate.spark.connect_job import ArrowSubtaskJob
from spate.spark.connect_query import ConnectQuery
from spate.spark.micro_batches import MicroBatches, NoJobCount
from spate.spark.rescale_requests import RescaleRequest, RescaleRequests
from spate.spark.settings import SpateSettings
from spate.spark.spark_checkpoint import (
    SPARK_CHECKPOINT_DIR,
    SparkCheckpoint,
    check_locations,
    hadoop_opens,
    open_spark_checkpoint,
)
from spate.spark.staged_initial_state import StagedInitialState, remove_staged_initial_states
from spate.spark.stream_definition import Sink, StartOptions, StreamDefinition
from spate.spark.stream_metrics import StreamFigures
from spate.spark.ticks import WakeFile, logs_ticks, root_wake_path, with_ticks, without_ticks
from spate.spark.worker_errors import BatchFailedError, failed_on_driver

log = logging.getLogger(__name__)


class ConnectBatchFunction:
    """``foreachBatch``'s function of one run on a Connect session (pickled to the server): the run's driver side,
    built on the first batch in the server's ``foreachBatch`` process and kept there for the run's later batches.
    ``spark_checkpoint``: the location given to ``start()``, None for ``<root>/_spark``."""

    def __init__(self, stream: StreamDefinition, settings: SpateSettings, sink: Sink | TableSink | None,
                 spark_checkpoint: str | None, *, wake_path: str | None = None,
                 initial: StagedInitialState | None = None) -> None:
        # the client's DataFrames stay on the client: the initial state comes staged in the root
        self.stream = dataclasses.replace(stream, df=None, initial_state=None)
        self.settings, self.sink, self.spark_checkpoint = settings, sink, spark_checkpoint
        self.wake_path = wake_path  # with the tick source: where the driver says when a batch without input is due
        self.initial = initial
        self._batches: MicroBatches | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_batches": None}

    def __call__(self, batch_df: Any, batch_id: int) -> None:
        try:
            batches = self._batches_for(batch_df)
            _take_rescale(batches.driver)
            metrics = batches.run(without_ticks(batch_df) if self.wake_path else batch_df, batch_id, NoJobCount())
            if metrics is not None:  # the backlog (Spark's progress of the query) is not visible from here
                batches.driver.autoscale(metrics.batch_id, metrics.batch_ms, metrics.rows)
            if self.wake_path is not None:
                _write_wake(WakeFile(self.wake_path), batches.driver.latest, batches.driver.idle_batch_due_at)
        except BatchFailedError as e:  # Spark's error and the client get spate's message, not these frames
            raise e.with_traceback(None) from None
        except Exception as e:  # the driver side's own (the sink's, say): told last, its frames above in the log
            raise BatchFailedError(failed_on_driver(e, batch_id), batch_id=batch_id, error=e) from e

    def _batches_for(self, batch_df: Any) -> MicroBatches:
        batches = self._batches
        if batches is None:
            initial = self.initial.read(batch_df.sparkSession) if self.initial is not None else None
            batches = MicroBatches(self.stream, self.settings, self.sink, StreamFigures(),
                                   lambda spec: ArrowSubtaskJob(spec, initial))
            # refuses a Spark checkpoint behind spate's (Spark has logged this batch's offsets by now)
            open_spark_checkpoint(batch_df.sparkSession, batches.driver.coordinator, self.spark_checkpoint)
            self._batches = batches
        batches.session = batch_df.sparkSession  # the batch's session: the sink's DataFrame is read with it
        return batches


def _write_wake(wake: WakeFile, latest: CheckpointMetadata | None, due_at_ms: int | None) -> None:
    """Tell the tick source when the batch after ``latest`` is due without input."""
    wake.write(latest.checkpoint_id if latest is not None else -1, due_at_ms)


def _take_rescale(driver: QueryDriver) -> None:
    """Apply the newest rescale request the client sent through the root (a bad one is logged, never fatal)."""
    request = RescaleRequests(driver.coordinator.storage).take()
    if request is None:
        return
    try:
        driver.request_rescale(request.parallelism, request.reason)
    except SpateError as e:
        log.warning("rescale request to %d subtasks not applied: %s", request.parallelism, e)


class ConnectRun:
    """One ``start()`` of ``stream`` on a Connect session: the settings checked on the client (nothing is written
    there), and the query started with a :class:`ConnectBatchFunction`.

    Raises:
        SettingError: what Connect cannot do (autoscaling on the backlog, a driver-local Spark checkpoint;
            batches without input, or an initial state, on a root that is not on a local file system), or a
            location Spark or spate cannot use.
    """

    def __init__(self, stream: StreamDefinition, settings: SpateSettings, sink: Sink | TableSink | None,
                 options: StartOptions, *, figures: StreamFigures) -> None:
        _check_connect(stream, settings, options)
        self.stream, self.settings, self.options, self.figures = stream, settings, options, figures
        root = settings.checkpoint_root
        self.spark_checkpoint = options.spark_checkpoint or join_uri(root, SPARK_CHECKPOINT_DIR)
        self.storage = _client_storage(root)
        self.wake = self._wake_file()
        self.sink = sink
        self.query: ConnectQuery | None = None
        self._batches: RootBatches | None = None  # the run's batches as the client reads them from the root
        self._poller: ProgressPoller | None = None  # brings Spark's progress to the stream's listener

    @property
    def rescales(self) -> list[dict[str, Any]]:
        """The latest online rescales, as the latest checkpoint the client read records them."""
        latest = self._batches.latest if self._batches is not None else None
        return list(latest.rescales) if latest is not None else []

    def _wake_file(self) -> WakeFile | None:
        """The tick source's wake file, when the query runs batches without input (asked for, or logged in the
        root's Spark checkpoint, which then keeps them).

        Raises:
            SettingError: batches without input on a root that is not on a local or mounted file system."""
        logged = (self.storage is not None and self.options.spark_checkpoint is None
                  and logs_ticks(SparkCheckpoint(self.spark_checkpoint,
                                                 readable=self.storage.sub(SPARK_CHECKPOINT_DIR)).newest_offsets()))
        if not (self.stream.idle_batches or logged):
            return None
        path = root_wake_path(self.settings.checkpoint_root)
        if path is None:
            raise SettingError("batches without input (idle_batches) on a Spark Connect session need a checkpoint "
                               "root on a local or mounted file system (the tick source's wake file lives there): "
                               "use such a root, or idle_batches=False")
        return WakeFile(path)

    def start(self) -> ConnectQuery:
        """Start the query; its progress events bring each batch's figures from the root to the stream."""
        options, listener = self.options, self.figures.listener
        latest = latest_checkpoint(self.storage) if self.storage is not None else None
        source = self.stream.df
        if self.wake is not None:  # what a batch without input is due for, from the latest checkpoint on
            _write_wake(self.wake, latest, self.stream.idle.due_at(latest))
            source = with_ticks(source, self.wake, options.trigger)
        function = ConnectBatchFunction(self.stream, self.settings, self.sink, options.spark_checkpoint,
                                        wake_path=self.wake.path if self.wake is not None else None,
                                        initial=self._staged_initial_state(latest))
        writer = source.writeStream.foreachBatch(function).option("checkpointLocation", self.spark_checkpoint)
        if options.trigger:
            writer = writer.trigger(**options.trigger)
        if options.query_name:
            writer = writer.queryName(options.query_name)
        self.figures.batches.start_from(latest)
        self._batches = (RootBatches(self.storage, self.figures, latest.checkpoint_id if latest else None)
                         if self.storage is not None else None)
        listener.on_progress = self._batches
        query = writer.start()
        self.query = ConnectQuery(query)
        self._poller = ProgressPoller(query, listener)
        self._poller.start()
        return self.query

    def _staged_initial_state(self, latest: CheckpointMetadata | None) -> StagedInitialState | None:
        """A new query's initial state, staged for the server's driver; None when there is none or the query
        has a checkpoint (which holds its state; an earlier start's staged copy is deleted then)."""
        initial = self.stream.initial_state
        if initial is None:
            return None
        assert self.storage is not None  # checked by _check_connect
        remove_staged_initial_states(self.storage)
        return StagedInitialState.stage(initial, self.settings.checkpoint_root) if latest is None else None

    def rescale(self, request: RescaleRequest) -> None:
        """Ask the driver (in the server's process) to run at ``request.parallelism`` from its next batch on.

        Raises:
            SettingError: the client cannot reach the checkpoint root.
            InvalidParallelismError / IncompatibleStateError: a parallelism the query cannot run at."""
        if self.storage is None:
            raise SettingError(f"rescale on a Spark Connect session writes a request into the checkpoint root, which "
                               f"this client cannot open ({self.settings.checkpoint_root!r}): stop the query and "
                               "start it again at the new parallelism")
        latest = latest_checkpoint(self.storage)  # before the first checkpoint the driver checks it (and logs)
        check_parallelism(request.parallelism,
                          latest.max_parallelism if latest is not None else MAX_MAX_PARALLELISM)
        RescaleRequests(self.storage).send(request)

    def close(self) -> None:
        """Stop polling the query's progress, after passing on what it reported (the run's driver side lives in
        the server's process: nothing else to release here)."""
        if self._poller is not None:
            self._poller.stop()
        if self.stream.initial_state is not None and self.storage is not None \
                and latest_checkpoint(self.storage) is not None:  # the state is in the checkpoints now
            remove_staged_initial_states(self.storage)


def _client_storage(root: str) -> CheckpointStorage | None:
    """The checkpoint root as this client reads it, None if it cannot (a location only the server reaches)."""
    try:
        return storage_for(root)
    except Exception as e:  # noqa: BLE001 - no file system for the scheme here, missing credentials, ...
        log.info("the checkpoint root %s is not readable from this client (%s): no figures per batch here", root, e)
        return None


def _check_connect(stream: StreamDefinition, settings: SpateSettings, options: StartOptions) -> None:
    """Refuse, with the fix, what a stream on a Connect session cannot do (before anything is written)."""
    check_locations(stream.spark, settings.checkpoint_root, options.spark_checkpoint, options.spark_checkpoint_cache)
    if stream.initial_state is not None and not (hadoop_opens(settings.checkpoint_root)
                                                  and _client_storage(settings.checkpoint_root) is not None):
        raise SettingError("an initial_state on a Spark Connect session is staged in the checkpoint root, where "
                           "Spark writes it and this client deletes it after the first checkpoint: use a local, "
                           "file:// or hdfs:// root this client opens too, or bootstrap the state with "
                           "write_savepoint and start with restore_from=")
    if stream.autoscale is not None and stream.autoscale.max_backlog_rows is not None:
        raise SettingError("autoscale's max_backlog_rows is not available on a Spark Connect session: the backlog is "
                           "Spark's progress of the query, which the server's foreachBatch process (where the "
                           "autoscaler runs) cannot read; scale on target_batch_ms there, or use a classic session")
    if options.spark_checkpoint_cache is not None:  # a driver-local mirror: on Connect Spark's driver is the server
        raise SettingError("spark_checkpoint_cache is not available on a Spark Connect session: use a classic "
                           "session (SparkSession.builder.master(...)) for it, or leave it out")
    if options.spark_checkpoint is None and not hadoop_opens(settings.checkpoint_root):
        raise SettingError(f"on a Spark Connect session Spark's own checkpoint must be a location Spark opens: "
                           f"the checkpoint root {settings.checkpoint_root!r} is not one (spate keeps no driver-local "
                           "copy there); pass start(spark_checkpoint=\"s3a://...\") with the Hadoop settings on the "
                           "server, or use a local, file:// or hdfs:// root")
