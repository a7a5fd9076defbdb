"""An Apache Iceberg table as an exactly-once table sink (:mod:`spate.sinks.table_sink`), through
``pyiceberg``; its SQLite catalog is the embedded default."""

from __future__ import annotations

import os
from typing import Any

import pyarrow as pa

from spate.errors import MissingPackageError, TableSinkError
from spate.sinks.table_sink import SinkFile, TableSink, check_columns

APP_PROPERTY = "spate.app-id"
BATCH_PROPERTY = "spate.batch-id"


def _catalogs() -> Any:
    try:
        import pyiceberg.catalog
    except ImportError as e:
        raise MissingPackageError("IcebergSink needs pyiceberg: pip install 'spate[tables]'") from e
    return pyiceberg.catalog


class IcebergSink(TableSink):
    """Appends each batch's outputs to the Iceberg table ``table`` (``"namespace.name"``; created with the
    output schema if it does not exist), one snapshot per batch holding every subtask's file, with the query
    and batch id as snapshot properties (``spate.app-id``, ``spate.batch-id``): a batch is committed once,
    whatever crashes, and readers see all of it or none.

    The catalog is pyiceberg's ``load_catalog(**catalog)`` when ``catalog`` (its properties) is given, else an
    embedded SQLite catalog in ``warehouse`` (``<warehouse>/catalog.db``, data under ``<warehouse>``).

    Raises:
        TableSinkError: ``table`` is not ``"namespace.name"``, or not exactly one of ``warehouse`` and
            ``catalog`` is given; as :class:`~spate.sinks.table_sink.TableSink`.
        MissingPackageError: pyiceberg is not installed (when the table is opened).
    """

    format = "iceberg"

    def __init__(self, table: str, *, warehouse: str | None = None, catalog: dict[str, str] | None = None) -> None:
        if not isinstance(table, str) or "." not in table:
            raise TableSinkError(f"IcebergSink needs a table identifier 'namespace.name', got {table!r}")
        if (warehouse is None) == (catalog is None):
            raise TableSinkError("IcebergSink needs either warehouse= (a directory for an embedded SQLite catalog) or "
                                 "catalog= (pyiceberg catalog properties), not both")
        super().__init__(warehouse or catalog.get("warehouse", table))  # type: ignore[union-attr]
        self.table, self.warehouse, self.catalog_properties = table, warehouse, catalog
        self._upto: int | None = None  # the newest batch of this query the table holds, once looked up

    def __repr__(self) -> str:
        return f"IcebergSink({self.table!r})"

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_upto": None}

    def _catalog(self) -> Any:
        cats = _catalogs()
        if self.catalog_properties is not None:
            return cats.load_catalog(self.catalog_properties.get("name", "default"), **self.catalog_properties)
        from pyiceberg.catalog.sql import SqlCatalog

        assert self.warehouse is not None  # __init__ takes either catalog or warehouse
        root = os.path.abspath(self.warehouse)
        os.makedirs(root, exist_ok=True)
        return SqlCatalog("spate", uri=f"sqlite:///{root}/catalog.db", warehouse=f"file://{root}")

    def load_table(self) -> Any:
        """The table (a ``pyiceberg`` ``Table``), loaded from its catalog."""
        return self._catalog().load_table(self.table)

    def _open_table(self, schema: pa.Schema) -> None:
        catalog = self._catalog()
        catalog.create_namespace_if_not_exists(self.table.rsplit(".", 1)[0])
        table = catalog.create_table_if_not_exists(self.table, schema=schema)
        check_columns(self, table.schema().as_arrow(), schema)
        self.data_uri = f"{table.location().rstrip('/')}/data"

    def _committed(self, batch_id: int) -> bool:
        if self._upto is None:
            self._upto = self._newest_batch(self.load_table())
        return self._upto >= batch_id

    def _newest_batch(self, table: Any) -> int:
        """The batch id of the newest snapshot of this query in the main branch's history (-1: none)."""
        snapshot = table.current_snapshot()
        while snapshot is not None:
            props = snapshot.summary.additional_properties if snapshot.summary else {}
            if props.get(APP_PROPERTY) == self.app_id:
                return int(props[BATCH_PROPERTY])
            parent = snapshot.parent_snapshot_id
            snapshot = table.snapshot_by_id(parent) if parent is not None else None
        return -1

    def _commit_files(self, batch_id: int, files: list[SinkFile]) -> None:
        table = self.load_table()
        if files:
            table.add_files([f"{self.data_uri}/{f.final_name}" for f in files],
                            snapshot_properties={APP_PROPERTY: self.app_id or "", BATCH_PROPERTY: str(batch_id)})
        self._upto = batch_id
