"""Full snapshots of a subtask's keyed state, written key group by key group, and their readers."""

from __future__ import annotations

from collections.abc import Iterator

import msgpack

from spate.errors import CorruptFileError
from spate.fs import CheckpointStorage, FrameKind, frame, iter_frames
from spate.snapshot.handles import KeyGroupsHandle
from spate.state.keyed import KeyedStateBackend, StateMeta
from spate.state.layout import U16


def write_keyed_snapshot(backend: KeyedStateBackend, storage: CheckpointStorage, path: str,
                         compress: bool = False) -> KeyGroupsHandle | None:
    """Write every live entry of ``backend`` to ``path``; None if there is no keyed state at all."""
    table = backend.table
    table.commit()
    filters = {U16.pack(m.sid): f for m in backend.state_metas if (f := backend.expiry_filter(m.sid))}
    frames: list[bytes] = []
    offsets: dict[int, tuple[int, int]] = {}
    pos = 0
    for kg in backend.key_groups:
        flat: list[bytes] = []
        if filters:
            for key, value in table.key_group_entries(kg):
                f = filters.get(key[:2])
                if f is not None and (value := f(value)) is None:  # type: ignore[assignment]
                    continue
                flat += (key, value)
        else:
            for key, value in table.key_group_entries(kg):
                flat += (key, value)
        if flat:
            fr = frame(FrameKind.KEY_GROUP, msgpack.packb([kg, flat], use_bin_type=True), compress)
            frames.append(fr)
            offsets[kg] = (pos, len(fr))
            pos += len(fr)
    if not frames:
        return None
    storage.write(path, b"".join(frames))
    kgs = backend.key_groups
    return KeyGroupsHandle(path, kgs.start, kgs.stop - 1, offsets, pos,
                           tuple(m.to_dict() for m in backend.state_metas))


def read_key_groups(storage: CheckpointStorage, handle: KeyGroupsHandle,
                    context: str = "") -> Iterator[tuple[int, list[bytes]]]:
    """Yield (key group, [flat key, value, flat key, value, ...]) for every key group of ``handle``,
    verifying each frame's checksum. One ranged read fetches the handle's span of the file."""
    if not handle.offsets:
        return
    offset, length = handle.span()
    data = storage.read_range(handle.path, offset, length, context)
    where = f"{storage.path(handle.path)}{f' ({context})' if context else ''}"
    for fr in iter_frames(data, where, offset):
        if fr.kind != FrameKind.KEY_GROUP:
            raise CorruptFileError(f"{where}: frame at offset {fr.offset} is not keyed state (kind {fr.kind})")
        kg, flat = msgpack.unpackb(fr.payload, raw=False)
        if handle.offsets.get(kg, (None,))[0] != fr.offset:
            if handle.start <= kg <= handle.end:
                raise CorruptFileError(f"{where}: key group {kg} found at offset {fr.offset}, where the "
                                       "checkpoint metadata does not expect it")
            continue
        yield kg, flat


def restore_keyed_snapshot(backend: KeyedStateBackend, storage: CheckpointStorage,
                           handle: KeyGroupsHandle, context: str = "") -> int:
    """Insert the entries of ``handle`` that fall in the backend's key groups; returns entries restored."""
    remap = {}
    for m in handle.states:
        meta = StateMeta.from_dict(m)
        local = backend.adopt(meta)
        if local != meta.sid:
            remap[U16.pack(meta.sid)] = U16.pack(local)
    table, owned, count = backend.table, backend.key_groups, 0
    for kg, flat in read_key_groups(storage, handle, context):
        if kg not in owned:
            continue
        for i in range(0, len(flat), 2):
            key = flat[i]
            if remap and (new_sid := remap.get(key[:2])) is not None:
                key = new_sid + key[2:]
            table.restore_entry(kg, key, flat[i + 1])
        count += len(flat) // 2
    return count
