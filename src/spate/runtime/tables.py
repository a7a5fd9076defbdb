"""Finding a subtask's state table of one kind under the wrappers around it (changelog, profiling, overlay)."""

from __future__ import annotations

from typing import TypeVar

from spate.state.table import StateTable

T = TypeVar("T")


def table_under(table: StateTable | None, kind: type[T]) -> T | None:
    """``table`` or the first table of ``kind`` under it (following ``inner``), None if there is none."""
    while table is not None and not isinstance(table, kind):
        table = getattr(table, "inner", None)
    return table
