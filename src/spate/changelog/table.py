"""``ChangelogTable``: wraps any state table; every mutation is applied to it and logged to the writer."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager

from spate.changelog.writer import ChangelogWriter
from spate.state.table import StateTable, TableView


class ChangelogTable(StateTable):
    """A state table whose changes are also appended to a :class:`ChangelogWriter`."""

    def __init__(self, inner: StateTable, writer: ChangelogWriter) -> None:
        self.inner = inner
        self.writer = writer
        self.kind = inner.kind

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

    # -- reads and everything else: the inner table -----------------------------------------------------
    def get(self, kg: int, primary: bytes) -> bytes | None:
        return self.inner.get(kg, primary)

    def get_many(self, kgs: Sequence[int], primaries: Sequence[bytes]) -> list[bytes | None]:
        return self.inner.get_many(kgs, primaries)

    def map_get(self, kg: int, primary: bytes, user_key: bytes) -> bytes | None:
        return self.inner.map_get(kg, primary, user_key)

    def map_items(self, kg: int, primary: bytes) -> list[tuple[bytes, bytes]]:
        return self.inner.map_items(kg, primary)

    def state_entries(self, kg: int, sid_prefix: bytes) -> Iterator[tuple[bytes, bytes, bytes]]:
        return self.inner.state_entries(kg, sid_prefix)

    def key_group_flat(self, kg: int) -> list[bytes]:
        return self.inner.key_group_flat(kg)

    def consistent_view(self) -> AbstractContextManager[TableView]:
        return self.inner.consistent_view()

    def restore_key_group(self, kg: int, flat: list[bytes], map_sids: frozenset[bytes]) -> None:
        self.inner.restore_key_group(kg, flat, map_sids)  # restored state is in the base, not a change

    def get_meta(self, name: str) -> bytes | None:
        return self.inner.get_meta(name)

    def put_meta(self, name: str, value: bytes) -> None:
        self.inner.put_meta(name, value)

    def commit(self) -> None:
        self.inner.commit()

    def approx_bytes(self) -> int:
        return self.inner.approx_bytes()

    def close(self) -> None:
        self.inner.close()

    def destroy(self) -> None:
        self.inner.destroy()
