"""Re-writing a handle's bytes into a new logical file: how a subtask takes ownership of state it restored
from another subtask's directory, and how live segments leave a physical file that wastes too much space."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TypeVar

from spate.frames import contiguous_reads, iter_frames
from spate.fs import CheckpointStorage
from spate.segments import SegmentWriter
from spate.snapshot.handles import ChangeSetHandle, KeyGroupsHandle, NativeSnapshotHandle
from spate.snapshot.native import native_chunks, write_as_key_groups
from spate.state.overlay import SharedReaders

H = TypeVar("H", KeyGroupsHandle, NativeSnapshotHandle, ChangeSetHandle)


def relocate(storage: CheckpointStorage, handle: H, out: SegmentWriter, readers: SharedReaders | None = None) -> H:
    """Copy the span of ``handle`` (its key groups' frames and any between them, checksums verified; a native
    snapshot's whole file, its CRC-32 verified) to a new logical file written with ``out``, read and written in
    parts (never whole in memory); returns the handle of the copy."""
    if isinstance(handle, NativeSnapshotHandle):
        if not handle.whole:  # part of another subtask's table (a rescale): its key groups, as frames
            return write_as_key_groups(storage, handle, out, "re-writing a segment", readers)  # type: ignore[return-value]
        return handle.relocated(out.write_parts(native_chunks(storage, handle, "re-writing a segment")))
    offset, length = handle.span()
    where = f"{storage.path(handle.path)} segment at {handle.file_offset}"

    def parts() -> Iterator[bytes]:
        for start, size in contiguous_reads((o for o, _n in handle.offsets.values()), offset + length):
            data = storage.read_range(handle.path, handle.file_offset + start, size, "re-writing a segment")
            for _ in iter_frames(data, where, start):
                pass
            yield data

    return handle.relocated(out.write_parts(parts()), offset)
