"""``ChangelogTable``: wraps any state table; every mutation is applied to it and logged to the writer."""

from __future__ import annotations

from collections.abc import Sequence

from spate.changelog.writer import ChangelogWriter
from spate.state.table import StateTable, WrappedTable


class ChangelogTable(WrappedTable):
    """A state table whose changes are also appended to a :class:`ChangelogWriter` (reads and everything else
    go to the inner table)."""

    def __init__(self, inner: StateTable, writer: ChangelogWriter) -> None:
        super().__init__(inner)
        self.writer = writer

    # -- writes: apply, then log -------------------------------------------------------------------------
    def put(self, kg: int, primary: bytes, value: bytes) -> None:
        self.inner.put(kg, primary, value)
        self.writer.active.put(kg, primary, value)
        self.writer.after_append()

    def put_many(self, entries: Sequence[tuple[int, bytes, bytes]]) -> None:
        self.inner.put_many(entries)
        self.writer.active.put_many(entries)
        self.writer.after_append()

    def append(self, kg: int, primary: bytes, data: bytes) -> None:
        self.inner.append(kg, primary, data)
        self.writer.active.append(kg, primary, data)
        self.writer.after_append()

    def delete(self, kg: int, primary: bytes) -> None:
        self.inner.delete(kg, primary)
        self.writer.active.delete(kg, primary)
        self.writer.after_append()

    def map_put(self, kg: int, primary: bytes, user_key: bytes, value: bytes) -> None:
        self.inner.map_put(kg, primary, user_key, value)
        self.writer.active.map_put(kg, primary, user_key, value)
        self.writer.after_append()

    def map_delete(self, kg: int, primary: bytes, user_key: bytes) -> None:
        self.inner.map_delete(kg, primary, user_key)
        self.writer.active.map_delete(kg, primary, user_key)
        self.writer.after_append()

    def restore_key_group(self, kg: int, flat: list[bytes], map_sids: frozenset[bytes]) -> None:
        self.inner.restore_key_group(kg, flat, map_sids)  # restored state is in the base, not a change
