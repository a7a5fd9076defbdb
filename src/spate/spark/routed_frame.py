"""A batch's routed DataFrame (:mod:`spate.spark.subtask_job`), built with few calls into the JVM.

Every py4j call is a round trip (0.2–2 ms, more on a loaded driver), and a DataFrame built with the Column API
costs several per column and literal: routing a batch that way took about 400 calls. Here the per-row columns
are SQL expressions in one ``selectExpr``, and the heartbeat rows, which depend only on the session, the
batch's schema and the parallelism, are built once per run and reused by every batch.
"""

from __future__ import annotations

from typing import Any

from spate.spark.routing import routing_values
from spate.spark.sessions import session_identity
from spate.spark.task import HEARTBEAT_COLUMN, KG_COLUMN, ROUTE_COLUMN, SUBTASK_COLUMN


def quoted(name: str) -> str:
    """``name`` as a SQL identifier."""
    return "`" + name.replace("`", "``") + "`"


def key_group_expr(key_columns: tuple[str, ...], max_p: int) -> str:
    """A row's key group: Spark's ``hash()`` of its key columns, mod the number of key groups."""
    return f"pmod(hash({', '.join(map(quoted, key_columns))}), {max_p})"


def subtask_expr(key_group: str, p: int, max_p: int) -> str:
    """The subtask of key group ``key_group`` (spate's key-group ranges, :func:`key_group_range`)."""
    return f"CAST(FLOOR({key_group} * {p} / {max_p}) AS INT)"


def route_expr(subtask: str, p: int) -> str:
    """The routing value that sends subtask ``subtask``'s rows to partition ``subtask`` (:mod:`routing`)."""
    return f"CAST(element_at(array({', '.join(map(str, routing_values(p)))}), {subtask} + 1) AS INT)"


class RoutedFrames:
    """Builds each batch's rows with their key group and subtask, and the heartbeat rows (one per subtask, so
    every subtask runs), for a stream keyed by ``key_columns``."""

    def __init__(self, key_columns: tuple[str, ...]) -> None:
        self.key_columns = key_columns
        self._heartbeats: dict[tuple[str, str, int], Any] = {}

    def rows(self, batch_df: Any, p: int, max_p: int) -> Any:
        """``batch_df`` with the key group, subtask and heartbeat (false) columns."""
        kg = key_group_expr(self.key_columns, max_p)
        return batch_df.selectExpr("*", f"CAST({kg} AS INT) AS {KG_COLUMN}",
                                   f"{subtask_expr(kg, p, max_p)} AS {SUBTASK_COLUMN}",
                                   f"false AS {HEARTBEAT_COLUMN}")

    def heartbeat(self, session: Any, schema: Any, p: int) -> Any:
        """One row per subtask, null but for its subtask, in ``schema``'s columns and the routing columns."""
        key = (session_identity(session), schema.json(), p)
        frame = self._heartbeats.get(key)
        if frame is None:
            from pyspark.sql import functions as F
            from pyspark.sql.types import BooleanType, IntegerType

            frame = session.range(p).select(
                *[F.lit(None).cast(f.dataType).alias(f.name) for f in schema.fields],
                F.lit(None).cast(IntegerType()).alias(KG_COLUMN), F.col("id").cast(IntegerType()).alias(SUBTASK_COLUMN),
                F.lit(True).cast(BooleanType()).alias(HEARTBEAT_COLUMN))
            self._heartbeats = {key: frame}  # one session and schema at a time: a new run drops the old one
        return frame

    @staticmethod
    def routed(rows: Any, heartbeat: Any, p: int) -> Any:
        """The batch's rows and heartbeat rows, subtask i's in partition i of ``p``."""
        return rows.unionByName(heartbeat).selectExpr("*", f"{route_expr(SUBTASK_COLUMN, p)} AS {ROUTE_COLUMN}") \
            .repartition(p, ROUTE_COLUMN)
