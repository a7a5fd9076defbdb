"""Change files: one logical file per upload, holding the change sets of one or more logs (subtasks of one
worker process). One frame per (log, sequence number, key group), so a reader fetches only the key groups it
owns."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

import msgpack

from spate.changelog.changeset import ChangeSet
from spate.frames import Frame, FrameKind, RangeReader, frame, read_span_frames
from spate.segments import FileRef
from spate.snapshot.handles import ChangeSetHandle

Offsets = dict[int, tuple[int, int]]


def encode_change_file(change_sets: list[tuple[str, int, ChangeSet]],
                       compress: bool = False) -> tuple[bytes, dict[tuple[str, int], Offsets]]:
    """The bytes of a change file and, per (log id, sqn), the key groups' (offset, length) in it."""
    frames: list[bytes] = []
    located: dict[tuple[str, int], Offsets] = {}
    pos = 0
    for log_id, sqn, cs in sorted(change_sets, key=lambda x: (x[0], x[1])):
        offsets = {}
        for kg in cs.key_groups():
            fr = frame(FrameKind.CHANGE_SET, msgpack.packb([log_id, sqn, kg, cs.records(kg)], use_bin_type=True),
                       compress)
            frames.append(fr)
            offsets[kg] = (pos, len(fr))
            pos += len(fr)
        if offsets:
            located[(log_id, sqn)] = offsets
    return b"".join(frames), located


def change_set_handles(ref: FileRef, located: dict[tuple[str, int], Offsets]) -> dict[tuple[str, int],
                                                                                       ChangeSetHandle]:
    """Handles of the change sets of a change file written to ``ref``."""
    return {(log_id, sqn): ChangeSetHandle(ref.path, log_id, sqn, offsets, (), ref.offset, ref.length)
            for (log_id, sqn), offsets in located.items()}


def read_change_set(storage: RangeReader, handle: ChangeSetHandle, context: str = "",
                    only: Mapping[int, tuple[int, int]] | None = None, *, read_now: bool = False,
                    ) -> Iterator[tuple[int, list]]:
    """(key group, records) of every key group of ``handle`` (or only those of ``only``, a part of its
    offsets), checksums verified, one ranged read. Read and decoded as consumed; with ``read_now`` read and
    verified before this returns, decoded as consumed (as
    :func:`~spate.snapshot.keyed.read_key_group_frames`)."""
    offsets = handle.offsets if only is None else only
    if not offsets:
        return iter(())
    _where, frames = read_span_frames(storage, handle.path, offsets, FrameKind.CHANGE_SET, context,
                                      handle.file_offset)
    return _change_set_records(handle, list(frames) if read_now else frames, only)


def _change_set_records(handle: ChangeSetHandle, frames: Iterable[Frame],
                        only: Mapping[int, tuple[int, int]] | None) -> Iterator[tuple[int, list]]:
    for fr in frames:
        log_id, sqn, kg, records = msgpack.unpackb(fr.payload, raw=False)
        if (log_id, sqn) != (handle.log_id, handle.sqn):
            continue  # another log's change set between ours (never the case for a contiguous span)
        if handle.offsets.get(kg, (None,))[0] != fr.offset:
            continue  # a key group outside the (intersected) handle
        if only is None or kg in only:
            yield kg, records
