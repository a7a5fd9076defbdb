"""Checking the checkpoint files that reused local state references.

Local recovery reuses a subtask's local state instead of downloading it, but the handles it carries on
(materialized snapshots, change sets) stay in every later checkpoint until the next materialization. So the
first time a process reuses state that references a segment, it reads the segment and checks every frame's
checksum; segments are immutable, so each is checked once per process and storage.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from spate.errors import SpateError
from spate.fs import CheckpointStorage, FrameKind, read_span_frames
from spate.snapshot.handles import ChangeSetHandle, KeyGroupsHandle

_Span = tuple[str, int, int, int]  # path, file offset, offset, length
_verified: dict[str, set[_Span]] = {}  # storage URI -> spans whose frames this process verified
_lock = threading.Lock()


def verify_handles(storage: CheckpointStorage, handles: Iterable[KeyGroupsHandle | ChangeSetHandle],
                   context: str = "") -> list[str]:
    """Read every frame of each handle's span not verified yet by this process and check its checksum and
    kind; returns the problems found (empty: every referenced byte is intact)."""
    problems = []
    for handle in handles:
        if not handle.offsets:
            continue
        span = (handle.path, handle.file_offset, *handle.span())
        with _lock:
            if span in _verified.get(storage.uri, ()):
                continue
        problem = _check(storage, handle, context)
        if problem is not None:
            problems.append(problem)
            continue
        with _lock:
            _verified.setdefault(storage.uri, set()).add(span)
    return problems


def _check(storage: CheckpointStorage, handle: KeyGroupsHandle | ChangeSetHandle, context: str) -> str | None:
    kind = FrameKind.KEY_GROUP if isinstance(handle, KeyGroupsHandle) else FrameKind.CHANGE_SET
    try:
        _where, frames = read_span_frames(storage, handle.path, handle.offsets, kind, context, handle.file_offset)
        for _ in frames:
            pass
    except SpateError as e:
        return str(e)
    return None
