"""Which kind of Spark session a stream was given: a classic one (a py4j gateway to the JVM in this process) or a
Spark Connect one (``SparkSession.builder.remote(...)``: a gRPC client of a Spark Connect server).

The choice is made by the session object's type, not by pyspark's process-wide ``is_remote()``: one process may
hold both kinds (the Connect server's ``foreachBatch`` process does), and the type is what decides which calls
the session answers.
"""

from __future__ import annotations

from typing import Any


def is_connect(spark: Any) -> bool:
    """Whether ``spark`` (a session) is a Spark Connect client session. Read from its type's module, so that the
    Connect client (which needs gRPC) is never imported here."""
    return type(spark).__module__.startswith("pyspark.sql.connect.")


def session_identity(spark: Any) -> str:
    """An id of the session, stable while it lives: Connect's session id, or the JVM session's hash (one py4j
    call)."""
    if is_connect(spark):
        return str(spark.session_id)
    return str(spark._jsparkSession.hashCode())  # noqa: SLF001


def session_conf(spark: Any) -> dict[str, str]:
    """The settings a stream reads from its session: on a classic session the context's conf with the session's
    ``spark.spate.*`` over it, on a Connect session the session's conf (there is no context on the client)."""
    session = {k: v for k, v in spark.conf.getAll.items()}
    if is_connect(spark):
        return session
    return dict(spark.sparkContext.getConf().getAll()) | {k: v for k, v in session.items()
                                                         if k.startswith("spark.spate.")}
