"""Checking the checkpoint files that reused local state references.

Local recovery reuses a subtask's local state instead of downloading it, but the handles it carries on
(materialized snapshots, change sets) stay in every later checkpoint until the next materialization. So the
first time a worker reuses state that references a segment, it reads the segment and checks every frame's
checksum. Segments are immutable, so a :class:`VerifiedSpans` remembers what was checked, and each segment
is checked once as long as it is remembered (the cache is bounded: the least recently used are forgotten
first, and checked again if they come back).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable

from spate.errors import SpateError
from spate.frames import FrameKind, RangeReader, read_span_frames
from spate.fs import CheckpointStorage
from spate.open_files import OpenFiles
from spate.snapshot.handles import ChangeSetHandle, KeyedHandle, KeyGroupsHandle, NativeSnapshotHandle
from spate.snapshot.native import verify_native

Span = tuple[str, int, int, int]  # path, file offset, offset, length
DEFAULT_CAPACITY = 65536  # spans remembered per storage


class VerifiedSpans:
    """The spans of one storage's files whose frames were verified, at most ``capacity`` of them (least
    recently used forgotten first). Thread-safe: the subtasks of a worker share one."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._spans: OrderedDict[Span, None] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._spans)

    def __contains__(self, span: object) -> bool:
        with self._lock:
            if span not in self._spans:
                return False
            self._spans.move_to_end(span)  # type: ignore[arg-type]
            return True

    def add(self, span: Span) -> None:
        with self._lock:
            self._spans[span] = None
            self._spans.move_to_end(span)
            while len(self._spans) > self.capacity:
                self._spans.popitem(last=False)


def span_of(handle: KeyedHandle | ChangeSetHandle) -> Span:
    """What :class:`VerifiedSpans` remembers of a handle: its file, and where in it the handle's bytes lie."""
    return (handle.path, handle.file_offset, *handle.span())


def verify_native_once(storage: RangeReader, handle: NativeSnapshotHandle, verified: VerifiedSpans,
                       context: str = "") -> None:
    """:func:`~spate.snapshot.native.verify_native`, unless this worker checked the same file already: the
    subtasks of a rescaled restart on one machine take one native snapshot as their base, and each read the whole
    file for its CRC-32 (raises what ``verify_native`` raises)."""
    span = span_of(handle)
    if span in verified:
        return
    verify_native(storage, handle, context)
    verified.add(span)


def verify_handles(storage: CheckpointStorage, handles: Iterable[KeyedHandle | ChangeSetHandle],
                   verified: VerifiedSpans, context: str = "") -> list[str]:
    """Read every frame of each handle's span not in ``verified`` (the spans of ``storage`` checked before, kept
    by the worker's services) and check its checksum and kind; returns the problems found (empty: every
    referenced byte is intact). The intact spans are added to ``verified``. Each file is opened once
    (:class:`~spate.open_files.OpenFiles`): handles share a few segment files."""
    problems = []
    with OpenFiles(storage) as files:
        for handle in handles:
            if not handle.state_bytes:
                continue
            span = span_of(handle)
            if span in verified:
                continue
            problem = _check(files, handle, context)
            if problem is not None:
                problems.append(problem)
                continue
            verified.add(span)
    return problems


def _check(storage: RangeReader, handle: KeyedHandle | ChangeSetHandle, context: str) -> str | None:
    try:
        if isinstance(handle, NativeSnapshotHandle):
            verify_native(storage, handle, context)
            return None
        kind = FrameKind.KEY_GROUP if isinstance(handle, KeyGroupsHandle) else FrameKind.CHANGE_SET
        _where, frames = read_span_frames(storage, handle.path, handle.offsets, kind, context, handle.file_offset)
        for _ in frames:
            pass
    except SpateError as e:
        return str(e)
    return None
