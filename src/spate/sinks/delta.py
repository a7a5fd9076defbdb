"""A Delta Lake table as an exactly-once table sink (:mod:`spate.sinks.table_sink`), through the ``deltalake``
package (delta-rs: no JVM)."""

from __future__ import annotations

import json
import time
from typing import Any

import pyarrow as pa

from spate.errors import MissingPackageError
from spate.sinks.table_sink import SinkFile, TableSink, check_columns


def _deltalake() -> Any:
    try:
        import deltalake
    except ImportError as e:
        raise MissingPackageError("DeltaSink needs the deltalake package: pip install 'spate[tables]'") from e
    return deltalake


class DeltaSink(TableSink):
    """Appends each batch's outputs to the Delta table at ``location`` (created with the output schema if it does
    not exist), one commit per batch holding every subtask's file and an app transaction
    (``spate-<query>``, version = the batch id): a batch is committed once, whatever crashes, and readers see
    all of it or none. ``location`` is a path or a ``pyarrow.fs`` URI; ``storage_options`` are deltalake's
    (credentials, endpoint) for an object store.

    Raises:
        As :class:`~spate.sinks.table_sink.TableSink`; MissingPackageError: deltalake is not installed (when the
        table is opened).
    """

    format = "delta"

    def __init__(self, location: str, storage_options: dict[str, str] | None = None) -> None:
        super().__init__(location)
        self.storage_options = storage_options

    @property
    def _table_uri(self) -> str:
        return self.location.partition("?")[0]  # a pyarrow.fs query string is not deltalake's

    @property
    def _txn_app(self) -> str:
        return f"spate-{self.app_id}"

    def _table(self) -> Any:
        return _deltalake().DeltaTable(self._table_uri, storage_options=self.storage_options)

    def _open_table(self, schema: pa.Schema) -> None:
        dl = _deltalake()
        if dl.DeltaTable.is_deltatable(self._table_uri, storage_options=self.storage_options):
            check_columns(self, pa.schema(self._table().schema().to_arrow()), schema)
        else:
            dl.DeltaTable.create(self._table_uri, schema, mode="ignore", storage_options=self.storage_options)

    def _committed(self, batch_id: int) -> bool:
        version = self._table().transaction_version(self._txn_app)
        return version is not None and version >= batch_id

    def _commit_files(self, batch_id: int, files: list[SinkFile]) -> None:
        if not files:
            return  # a batch without outputs leaves no empty commit: nothing to do again after a crash either
        dl = _deltalake()
        from deltalake.transaction import AddAction

        now = int(time.time() * 1000)
        actions = [AddAction(f.final_name, f.size, {}, now, True, json.dumps({"numRecords": f.rows}))
                   for f in files]
        table = self._table()
        table.create_write_transaction(
            actions, mode="append", schema=table.schema(),
            commit_properties=dl.CommitProperties(app_transactions=[dl.Transaction(self._txn_app, batch_id)]))
