"""PySpark transport: a stateful stream over a streaming DataFrame, run through ``foreachBatch`` with one
``groupBy(subtask).applyInArrow`` task per subtask per micro-batch. Spark moves the data; spate's runtime
owns the state, its checkpoints and its parallelism."""
