"""Batches without input on Spark: a streaming source that has a new offset only when spate needs a batch.

To Spark, spate's query is a stateless ``foreachBatch``, and Spark plans a micro-batch only when a source has
new data (no-data batches are for its own stateful operators). So :class:`~spate.spark.stream.StatefulStream`
unions its input with this source ("ticks", a pyspark Python data source). After every batch the driver
writes when the next batch is due without input (:mod:`spate.runtime.idle`: a processing-time timer, the
watermark moving) to a small driver-local :class:`WakeFile`. At each trigger Spark asks the source for its
latest offset: the source answers with a new offset (the checkpoint the wake-up follows) only once that time
has come, so Spark runs a real micro-batch, with a batch id, an offset logged in Spark's checkpoint and
exactly-once recovery like any other; its one row (the tick) is dropped before routing. When nothing is due
the offset stays where it was and Spark runs nothing: an idle query costs one small file read per trigger.
With ``Trigger.AvailableNow`` the due wake-ups are part of what is available. Before pyspark 4.2 a Python
source cannot take part in ``Trigger.AvailableNow`` and Spark then runs the whole query as one batch, so there
the source is only added when asked for (:data:`AVAILABLE_NOW`).

Offsets are ``{"after": n}``, n the spate checkpoint after which the wake-up was due (-1 at first). From
pyspark 4.2 on Spark passes the source its committed offset; on 4.0 and 4.1 the source remembers the last offset
it answered in a file beside the wake file (a driver that moves to another machine without it may run one
batch without input at its first trigger).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

from spate.runtime.batch import uses_timers

try:  # pyspark 4.2 on: a Python source may take part in Trigger.AvailableNow
    from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

    AVAILABLE_NOW = True
except ImportError:  # pyspark 4.0 and 4.1: a query with such a source runs Trigger.AvailableNow as one batch
    AVAILABLE_NOW = False

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        """Not in this pyspark."""

log = logging.getLogger(__name__)
SOURCE_NAME = "spate_ticks"
TICK_COLUMN = "__spate_tick"
_INITIAL = {"after": -1}


class WakeFile:
    """When the next batch is due without input, as the driver last decided: ``{"after": n, "due_at_ms": t}``
    (t None: not before input arrives). Written atomically (a temporary file renamed over it)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def write(self, after: int, due_at_ms: int | None) -> None:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        temporary = f"{self.path}.{os.getpid()}.tmp"
        with open(temporary, "w") as f:
            json.dump({"after": after, "due_at_ms": due_at_ms}, f)
        os.replace(temporary, self.path)

    def remove(self) -> None:
        """Delete the file, and its folder if that is left empty (the query stopped; a restart writes it again)."""
        with contextlib.suppress(FileNotFoundError):
            os.remove(self.path)
        with contextlib.suppress(OSError):
            os.rmdir(os.path.dirname(self.path))

    def read(self) -> dict[str, Any] | None:
        try:
            with open(self.path) as f:
                return json.load(f)
        except (FileNotFoundError, ValueError):
            return None


class TickSource(DataSource):
    """The ``spate_ticks`` source: option ``wake`` is the :class:`WakeFile`'s path."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        return f"{TICK_COLUMN} long"

    def streamReader(self, schema: Any) -> DataSourceStreamReader:  # noqa: N802 - pyspark's API
        return TickReader(self.options["wake"])


class TickReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offers ``{"after": n}`` once the wake file says the batch after checkpoint n is due. With
    ``Trigger.AvailableNow`` (pyspark 4.2 on) the wake-ups due while the run lasts are its available data, so
    the run ends once nothing is due, as Spark's own stateful operators end theirs."""

    def __init__(self, wake_path: str) -> None:
        self.wake = WakeFile(wake_path)
        self._answered = f"{wake_path}.answered"
        self._last: dict[str, int] | None = None

    def initialOffset(self) -> dict[str, int]:  # noqa: N802
        return dict(_INITIAL)

    def latestOffset(self, start: dict[str, int] | None = None, limit: Any = None) -> dict[str, int]:  # noqa: N802
        """``start``: the committed offset (pyspark 4.2 on); without it, the last answer of this source."""
        base = start if start is not None else self._last or self._read_answered() or dict(_INITIAL)
        offset = base
        wake = self.wake.read()
        if wake is not None and wake.get("due_at_ms") is not None and wake["after"] > base["after"] \
                and time.time() * 1000 >= wake["due_at_ms"]:
            offset = {"after": int(wake["after"])}
        if start is None and offset != self._last:
            self._write_answered(offset)
        self._last = offset
        return offset

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802
        """Every wake-up that is due by the time its batch could start is available (see the class)."""

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
        return [InputPartition(end["after"] if end["after"] > start["after"] else None)]

    def read(self, partition: InputPartition) -> Iterator[tuple[int]]:
        if partition.value is not None:
            yield (partition.value,)

    def commit(self, end: dict[str, int]) -> None:
        """Nothing to clean up: a tick is made from its offset."""

    def _read_answered(self) -> dict[str, int] | None:
        try:
            with open(self._answered) as f:
                return {"after": int(json.load(f)["after"])}
        except (FileNotFoundError, ValueError, KeyError):
            return None

    def _write_answered(self, offset: dict[str, int]) -> None:
        temporary = f"{self._answered}.tmp"
        with open(temporary, "w") as f:
            json.dump(offset, f)
        os.replace(temporary, self._answered)


def logs_ticks(offsets: list[str] | None) -> bool:
    """Whether a Spark checkpoint whose newest batch logged the source offsets ``offsets`` ran with the tick
    source: it is the query's last source, its offset ``{"after": n}``. Such a root keeps it (Spark refuses a
    checkpoint whose sources changed), whether or not its processor still needs batches without input."""
    try:
        last = json.loads(offsets[-1]) if offsets else None
    except ValueError:
        return False
    return isinstance(last, dict) and set(last) == {"after"} and isinstance(last["after"], int)


def tick_stream(spark: Any, wake_path: str) -> Any:
    """The ticks as a streaming DataFrame (the source registered with the session first)."""
    spark.dataSource.register(TickSource)
    return spark.readStream.format(SOURCE_NAME).option("wake", wake_path).load()


def with_ticks(source: Any, wake: WakeFile, trigger: dict[str, Any] | None) -> Any:
    """The streaming DataFrame ``source`` with the ticks of ``wake`` added (always its last source)."""
    if trigger and "availableNow" in trigger and not AVAILABLE_NOW:
        log.warning("batches without input with Trigger.AvailableNow before pyspark 4.2: Spark runs the query as "
                    "one batch (a Python source cannot take part); use idle_batches=False for this root, or another "
                    "trigger")
    return source.unionByName(tick_stream(source.sparkSession, wake.path), allowMissingColumns=True)


TICKS_DIR = "_ticks"  # on Spark Connect, the wake file's folder in a local checkpoint root


def root_wake_path(root: str) -> str | None:
    """On Spark Connect, where the wake file goes: ``<root>/_ticks/wake.json`` for a root on a local (or mounted)
    file system, which the client, the server's ``foreachBatch`` process and the tick source all open by path;
    None for any other root."""
    from spate.fs import LocalStorage, storage_for

    storage = storage_for(root)
    return os.path.join(storage.root, TICKS_DIR, "wake.json") if isinstance(storage, LocalStorage) else None


def without_ticks(batch_df: Any) -> Any:
    """A micro-batch's DataFrame without the tick source's rows and column."""
    from pyspark.sql import functions as F

    return batch_df.where(F.col(TICK_COLUMN).isNull()).drop(TICK_COLUMN)


def ticks_by_default(processor: Any, spark: Any) -> bool:
    """Whether a stream of ``processor`` runs batches without input unless told: when the processor may have
    timers (:func:`~spate.runtime.batch.uses_timers`; a ``StatefulProcessor`` in time mode ``None`` has none),
    from pyspark 4.2 on, and unless the session turned Spark's own off."""
    return uses_timers(processor) and AVAILABLE_NOW and no_data_batches_enabled(spark)


__all__ = ["AVAILABLE_NOW", "SOURCE_NAME", "TICK_COLUMN", "TickReader", "TickSource", "WakeFile", "logs_ticks",
           "root_wake_path", "tick_stream", "ticks_by_default", "with_ticks", "without_ticks"]


def no_data_batches_enabled(spark: Any) -> bool:
    """Whether the session lets Spark run batches without input for its own stateful operators
    (``spark.sql.streaming.noDataMicroBatches.enabled``, on unless set to false); spate's default follows it."""
    return str(spark.conf.get("spark.sql.streaming.noDataMicroBatches.enabled", "true")).strip().lower() != "false"
