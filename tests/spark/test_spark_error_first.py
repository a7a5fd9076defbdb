"""A batch that fails on Spark, as a new user met it: a processor yields a field its output schema does not have.

Before, ``query.awaitTermination()`` raised an 81-line ``StreamingQueryException`` whose first lines were Py4J's
boilerplate, spate's ``OutputError`` (which names the processor, key and field) at line 31; and the failed first
batch left a folder under ``~/.spate/spark-checkpoints/``. Now the exception starts with spate's message, once,
Spark's exception is its ``spark_error``, and the home directory is left as it was (HOME is a temporary folder
here, never the real one)."""

from __future__ import annotations

import os
import sys
import traceback

import pytest
from pyspark import cloudpickle
from pyspark.errors import StreamingQueryException

from spate import Processor, ValueStateDescriptor
from spate.spark.query import SpateQuery
from spate.spark.stream import StatefulStream
from spate.spark.worker_errors import BatchFailedError

pytestmark = pytest.mark.spark
cloudpickle.register_pickle_by_value(sys.modules[__name__])

SPATES = ("PageViews.process for key 'ann' produced field 'view', which is not in the output schema (user, views); "
          "the batch fails and its checkpoint is not taken")


class PageViews(Processor):
    def open(self, ctx):
        self.views = ctx.state(ValueStateDescriptor("views", default=0))

    def process(self, user, rows, ctx):
        self.views.update(self.views.value() + len(rows))
        yield {"user": user, "view": self.views.value()}  # the schema says "views"


def _clicks(spark, tmp_path):
    incoming = tmp_path / "in"
    incoming.mkdir()
    (incoming / "part-0.json").write_text('{"user": "ann", "page": "/"}\n{"user": "ann", "page": "/b"}\n')
    return spark.readStream.schema("user string, page string").json(str(incoming))


def _home(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    return home


def test_a_bad_output_field_fails_with_spates_message_first_and_leaves_home_as_it_was(spark, tmp_path, monkeypatch):
    home = _home(tmp_path, monkeypatch)
    stream = StatefulStream(_clicks(spark, tmp_path), "user", PageViews, "user string, views long",
                            checkpoint_root=str(tmp_path / "root"), parallelism=1, table="heap",
                            idle_batches=True)  # the wake file of batches without input goes under ~/.spate
    query = stream.start(lambda outputs, batch_id: outputs.collect(), trigger={"availableNow": True})
    assert isinstance(query, SpateQuery) and query is stream.query
    with pytest.raises(StreamingQueryException) as failure:  # what code written for Spark catches
        query.awaitTermination()
    error = failure.value
    assert isinstance(error, BatchFailedError)
    text = str(error)
    assert text.startswith(f"batch 0 failed on an executor: spate.errors.OutputError: {SPATES}\n"
                           "spate: in PageViews, batch 0, subtask 0 of 1"), text
    assert text.count("produced field 'view'") == 1
    for spark_text in ("py4j", "Traceback", "org.apache.spark", "STREAM_FAILED", "SQLSTATE"):
        assert spark_text not in text
    assert error.batch_id == 0 and error.worker_type == "spate.errors.OutputError"

    printed = "".join(traceback.format_exception(error))  # what the console shows for the uncaught error
    assert printed.count("produced field 'view'") == 1 and "py4j" not in printed
    assert printed.index(SPATES) < printed.index("Spark's own error, with its trace: this exception's spark_error"), \
        "spate's message, then where Spark's error is"

    spark_error = error.spark_error  # Spark's own exception, with its trace
    assert "[STREAM_FAILED]" in str(spark_error) and SPATES in str(spark_error)
    assert error.__context__ is spark_error

    again = query.exception()
    assert isinstance(again, BatchFailedError) and str(again) == text
    stream.close()
    assert os.listdir(home) == [], "a failed first batch leaves nothing in the home directory"


def test_a_failed_first_batch_on_an_s3_root_leaves_no_copy_of_sparks_checkpoint_in_home(
        spark, tmp_path, monkeypatch, s3_uri):
    """An object-store root: Spark's checkpoint is written to ~/.spate/spark-checkpoints/<query>/checkpoint and
    mirrored into the root; a query that failed before any batch completed removes the folder it created."""
    home = _home(tmp_path, monkeypatch)
    root = s3_uri("failed-first-batch").replace("s3://", "s3://testing:testing@")
    stream = StatefulStream(_clicks(spark, tmp_path), "user", PageViews, "user string, views long",
                            checkpoint_root=root, parallelism=1, table="heap")
    query = stream.start(lambda outputs, batch_id: outputs.collect(), trigger={"availableNow": True})
    assert stream.spark_checkpoint.mirror is not None, "Spark's checkpoint is a driver-local copy"
    with pytest.raises(BatchFailedError, match="produced field 'view'"):
        query.awaitTermination()
    assert os.listdir(home) == []
    stream.close()


def test_a_folder_that_existed_before_is_kept(spark, tmp_path, monkeypatch):
    """spate removes only what the failed run created: the user's own ~/.spate/spark-checkpoints stays."""
    home = _home(tmp_path, monkeypatch)
    mine = home / ".spate" / "spark-checkpoints"
    mine.mkdir(parents=True)
    (mine / "keep.txt").write_text("the user's\n")
    stream = StatefulStream(_clicks(spark, tmp_path), "user", PageViews, "user string, views long",
                            checkpoint_root=str(tmp_path / "root"), parallelism=1, table="heap", idle_batches=True)
    query = stream.start(lambda outputs, batch_id: outputs.collect(), trigger={"availableNow": True})
    with pytest.raises(BatchFailedError):
        query.processAllAvailable()
    assert sorted(os.listdir(mine)) == ["keep.txt"]
    stream.close()


def test_a_sinks_own_error_is_told_with_its_frames(spark, tmp_path, monkeypatch):
    """A failure on the driver (here the user's sink) is told first too, with its own exception as ``error``."""
    _home(tmp_path, monkeypatch)

    class Ok(Processor):
        def process(self, user, rows, ctx):
            yield {"user": user, "views": len(rows)}

    def sink(outputs, batch_id):
        raise KeyError("no table for batch outputs")

    stream = StatefulStream(_clicks(spark, tmp_path), "user", Ok, "user string, views long",
                            checkpoint_root=str(tmp_path / "root"), parallelism=1, table="heap")
    query = stream.start(sink, trigger={"availableNow": True})
    with pytest.raises(BatchFailedError) as failure:
        query.awaitTermination()
    assert str(failure.value).startswith("batch 0 failed on the driver: KeyError: 'no table for batch outputs'")
    assert isinstance(failure.value.error, KeyError)
    frames = [f.name for f in traceback.extract_tb(failure.value.error.__traceback__)]
    assert "sink" in frames and "_call_proxy" not in frames  # the driver's frames, not Py4J's
    stream.close()


class TtlCount:
    """A pyspark StatefulProcessor (duck-typed) declaring a value state with a TTL."""

    def __init__(self, ttl_ms=60_000):
        self.ttl_ms = ttl_ms

    def init(self, handle):
        self.count = handle.getValueState("count", "n long", self.ttl_ms)

    def handleInputRows(self, key, rows, timerValues):  # noqa: N802, N803
        return iter(())

    def close(self):
        pass


def test_a_ttl_in_time_mode_none_is_refused_with_sparks_error_class(spark, tmp_path):
    """Spark refuses it with STATEFUL_PROCESSOR_INCORRECT_TIME_MODE_TO_ASSIGN_TTL; spate did with a plain
    ValueError. Now spate's error carries that class (getCondition, getErrorClass), is still a ValueError, and
    comes when transform_with_state is called (the driver runs init once, as Spark's does), with the fix."""
    from pyspark.errors import PySparkException

    from spate.spark.stream import transform_with_state
    from spate.spark.tws_handle import TtlError

    df = _clicks(spark, tmp_path)
    with pytest.raises(ValueError) as refused:
        transform_with_state(df, "user", TtlCount(), "user string", time_mode="None",
                             checkpoint_root=str(tmp_path / "root"))
    error = refused.value
    assert isinstance(error, TtlError) and isinstance(error, PySparkException)
    assert error.getCondition() == "STATEFUL_PROCESSOR_INCORRECT_TIME_MODE_TO_ASSIGN_TTL"
    assert str(error).startswith("[STATEFUL_PROCESSOR_INCORRECT_TIME_MODE_TO_ASSIGN_TTL] Cannot use TTL for "
                                 "state=count in timeMode=NoTime, use TimeMode.ProcessingTime() instead.")
    assert 'pass time_mode="ProcessingTime" to transform_with_state' in str(error)
    assert not os.path.exists(tmp_path / "root"), "refused before anything is written"
    transform_with_state(df, "user", TtlCount(), "user string", time_mode="processingTime",  # Spark's spelling
                         checkpoint_root=str(tmp_path / "root"))
    with pytest.raises(ValueError) as not_positive:
        transform_with_state(df, "user", TtlCount(0), "user string", time_mode="ProcessingTime",
                             checkpoint_root=str(tmp_path / "root"))
    assert not_positive.value.getCondition() == "STATEFUL_PROCESSOR_TTL_DURATION_MUST_BE_POSITIVE"
    with pytest.raises(ValueError) as unknown:
        transform_with_state(df, "user", TtlCount(), "user string", time_mode="Wallclock",
                             checkpoint_root=str(tmp_path / "root"))
    assert unknown.value.getCondition() == "STATEFUL_PROCESSOR_UNKNOWN_TIME_MODE"


def test_a_ttl_in_time_mode_none_on_the_executors_carries_the_class_too(tmp_path):
    """Where spate meets it in a batch (the adapter on LocalRunner; a subtask on Spark), the same error."""
    from spate import LocalRunner
    from spate.spark.adapter import StatefulProcessorAdapter

    with pytest.raises(ValueError) as refused, LocalRunner(
            StatefulProcessorAdapter(TtlCount(), "pandas", "None"), key="user", checkpoint_root=str(tmp_path)) as r:
        r.run_batch(0, [{"user": "a"}])
    assert refused.value.getCondition() == "STATEFUL_PROCESSOR_INCORRECT_TIME_MODE_TO_ASSIGN_TTL"


def test_a_failed_batch_carries_the_error_class_spates_message_names():
    from spate.spark.worker_errors import batch_failed

    text = ("org.apache.spark.api.python.PythonException: [PYTHON_EXCEPTION] An exception was thrown from the "
            "Python worker: Traceback (most recent call last):\n  File \"x.py\", line 1, in f\n"
            "spate.spark.tws_handle.TimeModeError: Error register timer: [STATEFUL_PROCESSOR_CANNOT_PERFORM_"
            "OPERATION_WITH_INVALID_TIME_MODE] Failed to perform stateful processor operation=register_timer with "
            "invalid timeMode=NoTime SQLSTATE: 42802 (timers need timeMode 'ProcessingTime' or 'EventTime')\n"
            "spate: in StatefulProcessorAdapter, batch 3, subtask 1 of 2, key ('a',)\n SQLSTATE: 38000\n"
            "\tat org.apache.spark.api.python.BasePythonRunner.handlePythonException(PythonRunner.scala:1)\n")
    error = batch_failed(3, RuntimeError(text))
    assert error is not None
    assert error.getCondition() == "STATEFUL_PROCESSOR_CANNOT_PERFORM_OPERATION_WITH_INVALID_TIME_MODE"
    assert str(error).endswith("spate: in StatefulProcessorAdapter, batch 3, subtask 1 of 2, key ('a',)")
    assert error.worker_type == "spate.spark.tws_handle.TimeModeError" and error.batch_id == 3
