"""The application tests/cluster/test_spark_submit_recipe.py submits with ``spark-submit`` (copied to ``app.py`` in
the directory the recipe runs in), with Python and spate shipped to the executors as an archive.

It first runs one small job of 8 tasks that reports, from each executor, the Python running it and where each
package came from; then a ``StatefulStream`` counts page views per user over the JSON files in ``incoming/`` (one
file per micro-batch), with the checkpoint root ``checkpoints/`` and lmdb state on the executors' local disks.
Everything it saw goes to ``result.json`` for the test to check."""

from __future__ import annotations

import json
import os
import sys

from pyspark.sql import SparkSession

from spate import Processor, ValueStateDescriptor
from spate.spark.stream import StatefulStream


class Views(Processor):
    def open(self, ctx):
        self.views = ctx.state(ValueStateDescriptor("views", default=0))

    def process(self, user, rows, ctx):
        self.views.update(self.views.value() + len(rows))
        yield {"user": user, "views": self.views.value()}


def python_here(_: object) -> dict:
    """Runs on an executor: the Python that runs the task and the files its packages were imported from."""
    import isal
    import lmdb
    import msgpack
    import numpy
    import pyarrow
    import pyspark
    import zstandard

    import spate

    return {"executable": sys.executable, "prefix": sys.prefix, "cwd": os.getcwd(), "path": sys.path,
            "modules": {m.__name__: m.__file__
                        for m in (spate, pyarrow, lmdb, msgpack, zstandard, isal, numpy, pyspark)}}


def main() -> None:
    spark = SparkSession.builder.appName("spate-submit-recipe").getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    executors = spark.sparkContext.parallelize(range(8), 8).map(python_here).collect()
    clicks = spark.readStream.schema("user string, page string").option("maxFilesPerTrigger", 1).json(
        os.path.abspath("incoming"))
    stream = StatefulStream(clicks, "user", Views, "user string, views long",
                            checkpoint_root=os.path.abspath("checkpoints"), parallelism=2, table="lmdb")
    outputs: dict[int, list] = {}

    def sink(df, batch_id):
        outputs[batch_id] = sorted([r.user, r.views] for r in df.collect())

    query = stream.start(sink, trigger={"availableNow": True})
    try:
        finished = query.awaitTermination(600)
        error = query.exception()
    finally:
        query.stop()
        stream.close()
    result = {"driver": {"executable": sys.executable, "prefix": sys.prefix}, "executors": executors,
              "outputs": outputs, "finished": finished, "error": str(error) if error else None,
              "ran_on": [[st.executor for st in m.subtasks] for m in stream.metrics],
              "app_id": spark.sparkContext.applicationId}
    with open("result.json", "w") as f:
        json.dump(result, f)
    print("spate on the cluster:", {b: rows for b, rows in sorted(outputs.items())})
    spark.stop()


if __name__ == "__main__":
    main()
