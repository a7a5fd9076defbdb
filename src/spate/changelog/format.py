"""Change files: one file per upload, holding the change sets of one or more logs (subtasks of one worker
process). One frame per (log, sequence number, key group), so a reader fetches only the key groups it owns."""

from __future__ import annotations

from collections.abc import Iterator

import msgpack

from spate.changelog.changeset import ChangeSet
from spate.fs import CheckpointStorage, FrameKind, frame, read_span_frames
from spate.snapshot.handles import ChangeSetHandle


def encode_change_file(path: str, change_sets: list[tuple[str, int, ChangeSet]],
                       compress: bool = False) -> tuple[bytes, dict[tuple[str, int], ChangeSetHandle]]:
    """The bytes of a change file at ``path`` and a handle per (log id, sqn)."""
    frames: list[bytes] = []
    handles: dict[tuple[str, int], ChangeSetHandle] = {}
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
            handles[(log_id, sqn)] = ChangeSetHandle(path, log_id, sqn, offsets)
    return b"".join(frames), handles


def read_change_set(storage: CheckpointStorage, handle: ChangeSetHandle,
                    context: str = "") -> Iterator[tuple[int, list]]:
    """(key group, records) of every key group of ``handle``, checksums verified, one ranged read."""
    _where, frames = read_span_frames(storage, handle.path, handle.offsets, FrameKind.CHANGE_SET, context)
    for fr in frames:
        log_id, sqn, kg, records = msgpack.unpackb(fr.payload, raw=False)
        if (log_id, sqn) != (handle.log_id, handle.sqn):
            continue  # another log's change set between ours (never the case for a contiguous span)
        if handle.offsets.get(kg, (None,))[0] != fr.offset:
            continue  # a key group outside the (intersected) handle
        yield kg, records
