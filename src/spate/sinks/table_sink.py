"""Exactly-once table sinks: a batch's outputs written as data files in the batch's own job, committed to the
table after the batch's checkpoint completed (two-phase commit, as Flink's ``TwoPhaseCommitSinkFunction``).

1. **Pre-commit** (each subtask, in the batch's job, before it acknowledges): the subtask's outputs of the
   batch become one Parquet file in the sink's staging directory (``_spate_staging/`` under the table's data
   directory, which table readers ignore), named after the query, batch, subtask and attempt. The ack names the
   file (:class:`SinkFile`), and the checkpoint's metadata keeps it.
2. **Commit** (the driver, once the checkpoint is complete): each staged file is moved to its final name, then
   the table format records them with the batch id as the idempotence token (a Delta app transaction, an
   Iceberg snapshot property; a Parquet directory has no log: its files are the table). A crash at any step
   re-runs the commit from the checkpoint's metadata after the restart: a move already done is skipped, a
   batch the table already holds is not added again.

Staged files of attempts that never completed (a failed batch, a retried Spark task, a crash) are deleted by
:meth:`TableSink.clean_staging`, which only ever deletes files in the staging directory named for this query.
"""

from __future__ import annotations

import io
import posixpath
import re
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from spate.errors import MissingFileError, SpateError, TableSinkError
from spate.fs import CheckpointStorage, storage_for

STAGING_DIR = "_spate_staging"
_STAGED = re.compile(r"(?P<app>[0-9a-zA-Z]+)-(?P<batch>\d{12})-(?P<subtask>\d{5})-(?P<attempt>[0-9a-f]{12})\.parquet")


@dataclass(frozen=True)
class SinkFile:
    """A data file one subtask wrote for a table sink in one batch: ``path`` relative to the table's data
    directory (in :data:`STAGING_DIR` until the commit moves it to :meth:`final_name`), its ``size`` in bytes
    and its ``rows``."""

    path: str
    size: int
    rows: int

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @staticmethod
    def from_dict(data: dict[str, Any]) -> SinkFile:
        return SinkFile(**data)

    @property
    def final_name(self) -> str:
        """Where the commit puts it: ``part-<batch>-<subtask>-<query>.parquet`` (one per batch and subtask)."""
        m = _STAGED.fullmatch(posixpath.basename(self.path))
        if m is None:
            raise SpateError(f"{self.path}: not the name of a file a spate table sink staged")
        return f"part-{m['batch']}-{m['subtask']}-{m['app']}.parquet"


def app_id_of(query_id: str) -> str:
    """The query's name in data file names and in the table's idempotence token: its id, letters and digits."""
    return re.sub(r"[^0-9a-zA-Z]", "", query_id)[:32]


class TableSink(ABC):
    """A table the query's outputs are appended to, exactly once per batch (module doc).

    The driver opens it (:meth:`open`: creates the table or checks its schema) and commits; subtasks, in-process
    or on Spark executors, write the data files: the sink is pickled into their tasks, with the table's data
    directory resolved on the driver. Its outputs need an output schema (the table's).

    Raises:
        TableSinkError: (a ``ValueError``) no ``location``; :meth:`open` without an output schema or of a table
            whose columns differ from it; :meth:`write` of a sink the query's driver did not open.
        MissingFileError: :meth:`commit` of a batch whose staged data file was deleted outside spate.
        MissingPackageError: the table format's package (deltalake, pyiceberg) is not installed.
    """

    format: str = ""

    def __init__(self, location: str) -> None:
        if not isinstance(location, str) or not location:
            raise TableSinkError(f"{type(self).__name__} needs the table's location (a path or URI), got "
                                 f"{location!r}: pass the table's directory, e.g. {type(self).__name__}('/data/t')")
        self.location = location.rstrip("/")
        self.data_uri = self.location  # where its data files go; a table format may resolve another
        self.app_id: str | None = None
        self.schema: pa.Schema | None = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.location!r})"

    # -- the driver --------------------------------------------------------------------------------------------
    def open(self, query_id: str, schema: pa.Schema | None) -> None:
        """Bind the sink to the query (``query_id``) and its output ``schema``: the table is created if it does
        not exist, else its schema must agree.

        Raises:
            TableSinkError: no ``schema`` (a table sink needs the query's output schema)."""
        if not isinstance(schema, pa.Schema):
            raise TableSinkError(f"{self!r}: a table sink needs the query's output schema (output_schema=...)")
        self.app_id, self.schema = app_id_of(query_id), schema
        self._open_table(schema)

    def commit(self, batch_id: int, files: list[SinkFile]) -> None:
        """Make batch ``batch_id``'s staged ``files`` part of the table, once: idempotent, so it may be re-run
        after a crash at any point of it."""
        if self._committed(batch_id):
            return
        storage = self._storage()
        for f in files:
            if storage.exists(f.path):
                storage.move(f.path, f.final_name)
            elif not storage.exists(f.final_name):
                raise MissingFileError(f"{storage.path(f.path)}: a staged data file of batch {batch_id} is missing, "
                                       f"and so is {f.final_name}: it was deleted outside spate")
        self._commit_files(batch_id, files)

    def clean_staging(self, delivered_upto: int, latest_completed: int | None) -> list[str]:
        """Delete this query's staged files of attempts that never completed: every file of a batch up to
        ``delivered_upto`` (the commits moved the good ones out) or after ``latest_completed`` (no checkpoint
        names them; None: keep those, a batch may be running). Files of batches in between wait for their
        commit. Returns what it deleted."""
        storage, deleted = self._storage(), []
        for path, _size in storage.list_files(STAGING_DIR):
            m = _STAGED.fullmatch(posixpath.basename(path))
            if m is None or m["app"] != self.app_id or posixpath.dirname(path) != STAGING_DIR:
                continue
            batch = int(m["batch"])
            unnamed = latest_completed is not None and batch > latest_completed
            if (batch <= delivered_upto or unnamed) and storage.delete(path):
                deleted.append(path)
        return deleted

    # -- the subtasks ------------------------------------------------------------------------------------------
    def write(self, table: pa.Table, batch_id: int, subtask: int) -> SinkFile | None:
        """Pre-commit: stage ``table`` (one subtask's outputs of batch ``batch_id``) as a Parquet file; None
        without rows."""
        if self.app_id is None or self.schema is None:
            raise TableSinkError(f"{self!r} was not opened by the query's driver (TableSink.open): give the sink to "
                                 "LocalRunner or StatefulStream, which open it")
        if table.num_rows == 0:
            return None
        if table.schema != self.schema:
            table = table.cast(self.schema)
        buf = io.BytesIO()
        pq.write_table(table, buf)
        name = f"{STAGING_DIR}/{self.app_id}-{batch_id:012d}-{subtask:05d}-{uuid.uuid4().hex[:12]}.parquet"
        self._storage().write(name, buf.getvalue())
        return SinkFile(name, buf.tell(), table.num_rows)

    def _storage(self) -> CheckpointStorage:
        return storage_for(self.data_uri)

    # -- what a table format adds ------------------------------------------------------------------------------
    @abstractmethod
    def _open_table(self, schema: pa.Schema) -> None:
        """Create the table, or check that the existing one has ``schema``; resolve ``data_uri``."""

    @abstractmethod
    def _committed(self, batch_id: int) -> bool:
        """Whether the table already holds batch ``batch_id`` of this query (and every earlier one)."""

    @abstractmethod
    def _commit_files(self, batch_id: int, files: list[SinkFile]) -> None:
        """Record ``files`` (at their final names) in the table, with ``batch_id`` as the idempotence token."""


def check_columns(sink: TableSink, existing: pa.Schema, schema: pa.Schema) -> None:
    """The existing table must have the output schema's columns, in order, of the same types (string and binary
    types of any width agree)."""
    def kind(t: pa.DataType) -> str:
        if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
            return "string"
        if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
            return "binary"
        return str(t)

    have = [(f.name, kind(f.type)) for f in existing]
    want = [(f.name, kind(f.type)) for f in schema]
    if have != want:
        raise TableSinkError(f"{sink!r}: the table exists with columns {have}, the query's output schema has "
                             f"{want}; write to a new table, or change the output schema to the table's")
