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
        # reads are not logged: bound straight to the inner table, a Python call less per state read
        self.get = inner.get  # type: ignore[method-assign]
        self.map_get = inner.map_get  # type: ignore[method-assign]

    # -- writes: look up (an entry's first change in the change set), apply, then log -----------------------
    # The look-up tells the change set whether the entry existed when the change set opened, so that deleting
    # an entry it created drops the record instead of logging a tombstone (see spate.changelog.changeset).
    def put(self, kg: int, primary: bytes, value: bytes) -> None:
        cs = self.writer.active
        group = cs.pending.get(kg)  # inlined: this is the hottest path
        if cs.coalesce and (group is None or primary not in group):
            new = not self.inner.put_existed(kg, primary, value)  # lmdb knows it from the put itself
        else:
            new = False
            self.inner.put(kg, primary, value)
        cs.put(kg, primary, value, new)
        self.writer.after_append()

    def put_many(self, entries: Sequence[tuple[int, bytes, bytes]]) -> None:
        """Apply, then log. If the change set touches any entry first, the table's put says which entries existed
        (lmdb from the put itself, the other tables by a lookup first); the change set keeps the flag of a first
        touch only, so the flags of entries it already holds records of do not matter."""
        cs = self.writer.active
        new: list[bool] | None = None
        if cs.untouched_indices(entries):
            new = [not e for e in self.inner.put_many_existed(entries)]
        else:
            self.inner.put_many(entries)
        cs.put_many(entries, new)
        self.writer.after_append()

    def append(self, kg: int, primary: bytes, data: bytes) -> None:
        cs = self.writer.active
        group = cs.pending.get(kg)
        old = self.inner.get(kg, primary)  # read once: both the append and the change set need it
        new = cs.coalesce and (group is None or primary not in group) and old is None
        self.inner.put(kg, primary, old + data if old else data)
        cs.append(kg, primary, data, new)
        self.writer.after_append()

    def delete(self, kg: int, primary: bytes) -> None:
        cs = self.writer.active
        n = cs.new_map_entries(kg, primary)  # clearing a map whose entries this change set created?
        fresh = n > 0 and len(self.inner.map_items(kg, primary)) == n
        self.inner.delete(kg, primary)
        cs.delete(kg, primary, fresh)
        self.writer.after_append()

    def map_put(self, kg: int, primary: bytes, user_key: bytes, value: bytes) -> None:
        cs = self.writer.active
        group = cs.pending.get(kg)
        if cs.coalesce and (group is None or primary + user_key not in group):
            new = not self.inner.map_put_existed(kg, primary, user_key, value)
        else:
            new = False
            self.inner.map_put(kg, primary, user_key, value)
        cs.map_put(kg, primary, user_key, value, new)
        self.writer.after_append()

    def map_delete(self, kg: int, primary: bytes, user_key: bytes) -> None:
        self.inner.map_delete(kg, primary, user_key)
        self.writer.active.map_delete(kg, primary, user_key)
        self.writer.after_append()

    def restore_key_group(self, kg: int, flat: list[bytes], map_sids: frozenset[bytes],
                          digest: int | None = None) -> None:
        self.inner.restore_key_group(kg, flat, map_sids, digest)  # restored state is in the base, not a change
