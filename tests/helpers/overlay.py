"""An overlay table (:mod:`spate.state.overlay`) over a base built for the test: an lmdb table of ``entries``,
hard-linked in as the new table's base owning key groups ``[start, stop)``."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from spate.state.lmdb_table import LmdbTable
from spate.state.overlay import Base, OverlayTable, SharedReaders


def table_over_base(tmp: Path, entries: Iterable[tuple[int, bytes, bytes]], owned: range,
                    whole: bool = False) -> tuple[OverlayTable, SharedReaders]:
    """The new table in ``tmp / "new"`` (the base's file written in ``tmp / "old"``), and the readers it opened the
    base with; ``whole``: the base holds only the key groups it owns, so its entries are counted (``served``)."""
    old = LmdbTable(str(tmp / "old"))
    for kg, key, value in entries:
        old.put(kg, key, value)
    old.commit()
    old.close()
    os.makedirs(tmp / "new")
    os.link(tmp / "old" / "data.mdb", tmp / "new" / "base-0.mdb")
    readers = SharedReaders()
    table = OverlayTable(LmdbTable(str(tmp / "new")), [], readers)
    base = readers.open(str(tmp / "new" / "base-0.mdb"), file=True)
    table.add_base(Base("base-0.mdb", owned.start, owned.stop, base, served=base.entry_count() if whole else None),
                   b"\x90")
    return table, readers
