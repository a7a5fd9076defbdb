"""PySpark transport: a stateful stream over a streaming DataFrame, run through ``foreachBatch`` with exactly
one ``mapInArrow`` task per subtask per micro-batch (:mod:`spate.spark.routing`). Spark moves the data;
spate's runtime owns the state, its checkpoints and its parallelism.

Importing it sets ``JAVA_HOME``, when unset, to the Java ``make`` recorded for this virtual environment
(:func:`spate.spark.java.ensure_java_home`), so a script that builds its ``SparkSession`` after importing spate
finds the Java ``make`` installed, as ``spate demo`` does."""

from spate.spark.java import ensure_java_home
from spate.spark.state_frame import read_state, write_savepoint
from spate.spark.stream import StatefulStream, transform_with_state

ensure_java_home()  # no JVM starts on import: the user's SparkSession, built afterwards, launches it

__all__ = ["StatefulStream", "read_state", "transform_with_state", "write_savepoint"]
