"""PySpark transport: a stateful stream over a streaming DataFrame, run through ``foreachBatch`` with exactly
one ``mapInArrow`` task per subtask per micro-batch (:mod:`spate.spark.routing`). Spark moves the data;
spate's runtime owns the state, its checkpoints and its parallelism."""
