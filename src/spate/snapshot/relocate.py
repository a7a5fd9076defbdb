"""Re-writing a handle's bytes into a new logical file: how a subtask takes ownership of state it restored
from another subtask's directory, and how live segments leave a physical file that wastes too much space."""

from __future__ import annotations

from typing import TypeVar

from spate.frames import iter_frames
from spate.fs import CheckpointStorage
from spate.segments import SegmentWriter
from spate.snapshot.handles import ChangeSetHandle, KeyGroupsHandle

H = TypeVar("H", KeyGroupsHandle, ChangeSetHandle)


def relocate(storage: CheckpointStorage, handle: H, out: SegmentWriter) -> H:
    """Copy the key groups of ``handle`` (one ranged read, checksums verified) to a new logical file written
    with ``out``; returns the handle of the copy."""
    offset, length = handle.span()
    data = storage.read_range(handle.path, handle.file_offset + offset, length, "re-writing a segment")
    for _ in iter_frames(data, f"{storage.path(handle.path)} segment at {handle.file_offset}", offset):
        pass
    return handle.relocated(out.write(data), offset)
