"""Re-writing a handle's bytes into a new logical file: how a subtask takes ownership of state it restored
from another subtask's directory, and how live segments leave a physical file that wastes too much space."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TypeVar

from spate.frames import contiguous_reads, iter_frames
from spate.fs import CheckpointStorage
from spate.segments import SegmentWriter
from spate.snapshot.handles import ChangeSetHandle, KeyGroupsHandle

H = TypeVar("H", KeyGroupsHandle, ChangeSetHandle)


def relocate(storage: CheckpointStorage, handle: H, out: SegmentWriter) -> H:
    """Copy the span of ``handle`` (its key groups' frames and any between them, checksums verified) to a new
    logical file written with ``out``, read and written in parts (never whole in memory); returns the handle of
    the copy."""
    offset, length = handle.span()
    where = f"{storage.path(handle.path)} segment at {handle.file_offset}"

    def parts() -> Iterator[bytes]:
        for start, size in contiguous_reads((o for o, _n in handle.offsets.values()), offset + length):
            data = storage.read_range(handle.path, handle.file_offset + start, size, "re-writing a segment")
            for _ in iter_frames(data, where, start):
                pass
            yield data

    return handle.relocated(out.write_parts(parts()), offset)
