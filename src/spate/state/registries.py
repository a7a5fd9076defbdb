"""State registries of tables read as one: a table over bases (:mod:`spate.state.overlay`) reads entries written
under each file's own registry (``[{"name", "sid", "kind", ...}, ...]``, msgpack, the table's ``states``
metadata), so the registries must number every state alike."""

from __future__ import annotations

import msgpack


def registry(raw: bytes | None) -> list[dict]:
    """The registry a table's ``states`` metadata holds (empty: none)."""
    return list(msgpack.unpackb(raw)) if raw else []


def compatible(mine: list[dict], theirs: list[dict]) -> bool:
    """Whether entries written with state registry ``theirs`` read right under ``mine``: every state has the
    same id and kind in both, or is unknown to ``mine`` under an id ``mine`` does not use."""
    by_name = {m["name"]: m for m in mine}
    used = {m["sid"] for m in mine}
    for m in theirs:
        known = by_name.get(m["name"])
        if known is None and m["sid"] in used or known is not None and (known["sid"], known["kind"]) != (
                m["sid"], m["kind"]):
            return False
    return True


def union(mine: list[dict], theirs: list[dict]) -> bytes:
    """``mine`` with the states of ``theirs`` it does not know (of :func:`compatible` registries), packed."""
    names = {m["name"] for m in mine}
    return msgpack.packb([*mine, *(m for m in theirs if m["name"] not in names)])  # type: ignore[no-any-return]
