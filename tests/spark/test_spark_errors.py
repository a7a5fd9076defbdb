"""A batch that fails on an executor, as the user meets it: spate's message (the processor's exception, with the
key, batch and subtask) is the error's message, Spark's error (with its trace) its ``spark_error``; the worker's
exception is found in Spark's text."""

from __future__ import annotations

import sys

import pytest
from pyspark import cloudpickle
from pyspark.errors import StreamingQueryException

from helpers.clicks import clicks
from helpers.file_source import write_files
from spate import Processor
from spate.spark.stream import StatefulStream
from spate.spark.worker_errors import worker_error

pytestmark = pytest.mark.spark
cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Boom(Processor):
    def process(self, key, rows, ctx):
        if ctx.batch_id == 1 and key == "u3":
            raise ZeroDivisionError("the user's bug")
        yield {"user": key}


def test_the_processors_exception_comes_first_with_its_key_batch_and_subtask(spark, tmp_path):
    source = str(tmp_path / "in")
    write_files(source, clicks(2, users=8, per_batch=16))
    df = spark.readStream.schema("user string, page string, n long").option("maxFilesPerTrigger", 1).json(source)
    stream = StatefulStream(df, "user", Boom, "user string", checkpoint_root=str(tmp_path / "c"), parallelism=2,
                            table="heap")
    query = stream.start(lambda out, n: out.collect(), trigger={"availableNow": True})
    with pytest.raises(StreamingQueryException) as failure:  # a BatchFailedError, which is one
        query.awaitTermination()
    stream.close()
    text = str(failure.value)
    assert text.startswith("batch 1 failed on an executor: ZeroDivisionError: the user's bug\n"
                           "spate: in Boom, batch 1, subtask "), "spate's message first"
    assert ", key 'u3'" in text and "org.apache.spark" not in text
    spark_error = failure.value.spark_error  # Spark's own error stays available, the worker's trace in it
    assert isinstance(spark_error, StreamingQueryException) and spark_error.getCondition() == "STREAM_FAILED"
    assert "ZeroDivisionError: the user's bug" in str(spark_error) and "Traceback" in str(spark_error)


def test_the_worker_exception_is_read_out_of_sparks_text():
    text = ("py4j error: An error occurred while calling o12.collect.\n: org.apache.spark.SparkException: Job aborted"
            "\norg.apache.spark.api.python.PythonException: Traceback (most recent call last):\n"
            '  File "/x/worker.py", line 3, in main\n    process()\n'
            "spate.errors.OutputError: Totals.process for key 'bob' returned ...\n"
            "spate: in Totals, batch 1, subtask 0 of 2, key 'bob'\n"
            "\n\tat org.apache.spark.api.python.BasePythonRunner.handlePythonException(PythonRunner.scala:1)\n")
    assert worker_error(text) == ("spate.errors.OutputError: Totals.process for key 'bob' returned ...\n"
                                  "spate: in Totals, batch 1, subtask 0 of 2, key 'bob'")
    assert worker_error("org.apache.spark.SparkException: Job 3 cancelled") is None
