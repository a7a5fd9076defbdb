"""Local copies of subtasks' lmdb state on a worker's disk: where they live, and when they go.

A copy is ``<local_dir>/<query id>/subtask-<i>-<P>``. It may be reused by the next batch of its subtask on
this machine (by any process), so it is deleted only when no process holds it open (see
:func:`spate.state.lmdb_table.remove_if_unused`): at once when its parallelism is no longer the query's, and
after a grace period without use otherwise (the subtask now runs on another machine, or the query is gone).
"""

from __future__ import annotations

import os

from spate.state.lmdb_table import remove_if_unused

_PREFIX = "subtask-"


def local_state_dir(local_dir: str, query_id: str, index: int, parallelism: int) -> str:
    """The lmdb directory of subtask ``index`` of ``parallelism`` of a query under ``local_dir``."""
    return os.path.join(local_dir, query_id, f"{_PREFIX}{index}-{parallelism}")


def _copies(local_dir: str, query_id: str) -> list[str]:
    """The names of the query's local copies under ``local_dir`` (real directories only: a link is never
    followed, so nothing outside ``local_dir`` is ever removed)."""
    base = os.path.join(local_dir, query_id)
    if not _real_dir(base):
        return []
    return [n for n in os.listdir(base) if n.startswith(_PREFIX) and _real_dir(os.path.join(base, n))]


def _real_dir(path: str) -> bool:
    return os.path.isdir(path) and not os.path.islink(path)


def remove_other_parallelisms(local_dir: str, query_id: str, parallelism: int, keep: int | None = None) -> list[str]:
    """Delete the query's local lmdb directories of another parallelism than ``parallelism`` (and ``keep``: the
    base's during a rescale) that no process holds open: their state can never be reused (a restore at that
    parallelism finds a newer base). Returns those deleted."""
    base = os.path.join(local_dir, query_id)
    kept = [parallelism] if keep is None else [parallelism, keep]
    mine = {os.path.basename(local_state_dir(local_dir, query_id, i, p)) for p in kept for i in range(p)}
    return [name for name in _copies(local_dir, query_id)
            if name not in mine and remove_if_unused(os.path.join(base, name))]


def remove_idle_copies(local_dir: str, query_id: str, idle_since: float) -> list[str]:
    """Delete the query's local lmdb directories that no process holds open and no process used after
    ``idle_since`` (seconds since the epoch). Returns those deleted."""
    base = os.path.join(local_dir, query_id)
    return [name for name in _copies(local_dir, query_id)
            if remove_if_unused(os.path.join(base, name), idle_since)]
