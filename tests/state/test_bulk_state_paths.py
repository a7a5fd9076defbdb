"""The bulk state paths move whole key groups without touching each entry in Python.

A key group's digest travels with it in a keyed snapshot: a restore into an lmdb table adds it instead of
hashing every entry, and the table's recorded digest must still be exactly what re-reading every entry gives,
whatever the path (a frame restored whole, merged with a changelog, with state ids mapped, from a frame written
before digests were carried, over entries already there). A relocated snapshot is copied in bounded parts. The
documented ``.kg`` example is real bytes."""

from __future__ import annotations

import random
import re
import tracemalloc
import zlib
from pathlib import Path

import msgpack
import pytest

from spate.changelog.changeset import DELETE, PUT
from spate.changelog.restore import MaterializedFrame, apply_logged
from spate.errors import CorruptFileError
from spate.frames import FrameKind, frame, iter_frames
from spate.fs import CheckpointStorage, storage_for
from spate.segments import WholeFileWriter
from spate.snapshot.keyed import (
    SnapshotScope,
    read_key_group_frames,
    restore_keyed_snapshot,
    write_key_groups,
    write_keyed_snapshot,
)
from spate.state.descriptors import MapStateDescriptor, ValueStateDescriptor
from spate.state.keyed import KeyedStateBackend
from spate.state.layout import U16
from spate.state.lmdb_digest import key_group_digest
from spate.state.lmdb_table import LmdbTable


def _filled(path: str, keys: int, seed: int = 5) -> KeyedStateBackend:
    backend = KeyedStateBackend(LmdbTable(path), 16, range(16))
    value, m = backend.get_state(ValueStateDescriptor("v")), backend.get_state(MapStateDescriptor("m"))
    rng = random.Random(seed)
    for k in range(keys):
        backend.set_current_key(k)
        value.update(rng.randbytes(rng.randrange(1, 40)))
        if k % 3 == 0:
            m.put(k % 5, f"x{k}")
    backend.table.commit()
    return backend


def _snapshot(tmp_path, backend: KeyedStateBackend):
    storage = CheckpointStorage(str(tmp_path / "root"))
    handle = write_keyed_snapshot(backend, WholeFileWriter(storage, "shared", ".kg"))
    assert handle is not None
    return storage, handle


def test_frames_carry_the_digest_of_their_entries_as_the_table_stores_them(tmp_path):
    backend = _filled(str(tmp_path / "a"), 200)
    storage, handle = _snapshot(tmp_path, backend)
    frames = list(read_key_group_frames(storage, handle))
    assert len(frames) == len(handle.offsets) > 1
    for kg, flat, digest in frames:
        table_keys = [U16.pack(kg) + k for k in flat[0::2]]
        expected = sum(zlib.crc32(v, zlib.crc32(k)) + 1 for k, v in zip(table_keys, flat[1::2], strict=True)) % 2**64
        assert digest == expected


def test_frames_read_now_are_fetched_and_verified_before_the_call_returns(tmp_path):
    backend = _filled(str(tmp_path / "a"), 200)
    storage, handle = _snapshot(tmp_path, backend)
    path = Path(storage.path(handle.path))
    whole = path.read_bytes()
    fetched = read_key_group_frames(storage, handle, read_now=True)
    path.unlink()  # nothing is read from storage any more: the frames are in memory, only to be decoded
    entries = list(fetched)
    path.write_bytes(whole)
    assert entries == list(read_key_group_frames(storage, handle)) and len(entries) == len(handle.offsets)
    at = min(offset for offset, _n in handle.offsets.values())
    path.write_bytes(whole[:at + 20] + bytes([whole[at + 20] ^ 1]) + whole[at + 21:])
    with pytest.raises(CorruptFileError):  # a damaged frame is found by the call, not by whoever decodes later
        read_key_group_frames(storage, handle, read_now=True)


@pytest.mark.parametrize("reorder_states", [False, True], ids=["same-state-ids", "state-ids-mapped"])
def test_a_restore_that_adds_carried_digests_verifies(tmp_path, reorder_states):
    """The restored table's recorded digest equals the full re-read; with state ids mapped (the restoring
    backend registered its states in another order) the carried digest no longer holds and is not used."""
    source = _filled(str(tmp_path / "a"), 300)
    storage, handle = _snapshot(tmp_path, source)
    target = KeyedStateBackend(LmdbTable(str(tmp_path / "b")), 16, range(16))
    if reorder_states:
        target.get_state(MapStateDescriptor("m"))
        target.get_state(ValueStateDescriptor("v"))
    assert restore_keyed_snapshot(target, storage, handle) > 300
    target.table.commit()
    assert target.table.verify() is None
    assert target.table.entry_count() == source.table.entry_count()


def test_a_frame_without_digest_from_before_version_7_is_read_and_hashed(tmp_path):
    source = _filled(str(tmp_path / "a"), 100)
    storage, handle = _snapshot(tmp_path, source)
    raw = storage.read(handle.path)
    old = b"".join(frame(FrameKind.KEY_GROUP, msgpack.packb(msgpack.unpackb(f.payload)[:2], use_bin_type=True))
                   for f in iter_frames(raw, "kg"))
    offsets, pos = {}, 0
    for f in iter_frames(old, "old"):
        kg = msgpack.unpackb(f.payload)[0]
        offsets[kg] = (pos, f.length)
        pos += f.length
    storage.write("shared/old.kg", old)
    old_handle = type(handle)("shared/old.kg", handle.start, handle.end, offsets, pos, handle.states)
    assert {d for _kg, _flat, d in read_key_group_frames(storage, old_handle)} == {None}
    target = KeyedStateBackend(LmdbTable(str(tmp_path / "b")), 16, range(16))
    restore_keyed_snapshot(target, storage, old_handle)
    target.table.commit()
    assert target.table.verify() is None


@pytest.mark.parametrize("with_deletes", [False, True])
def test_a_frame_merged_with_its_log_keeps_an_exact_digest(tmp_path, with_deletes):
    """The log's puts replace some entries and add others; the digest is the carried one adjusted by the
    replaced and the put entries only, and must equal a full re-read."""
    table = LmdbTable(str(tmp_path / "t"))
    kg, rng = 3, random.Random(7)
    entries = {U16.pack(0) + bytes([i, i]): rng.randbytes(20) for i in range(50)}
    flat = [x for kv in sorted(entries.items()) for x in kv]
    digest = key_group_digest(U16.pack(kg), flat[0::2], flat[1::2])
    records: list = []
    for i in range(40, 70):  # 10 replaced, 20 new
        records += [PUT, U16.pack(0) + bytes([i, i]), rng.randbytes(9)]
    if with_deletes:
        records += [DELETE, U16.pack(0) + bytes([1, 1]), b""]
    apply_logged(table, kg, records, MaterializedFrame(flat, frozenset(), digest))
    table.commit()
    assert table.verify() is None
    assert table.entry_count() == 70 - (1 if with_deletes else 0)


def test_a_carried_digest_is_not_trusted_over_entries_already_there(tmp_path):
    """Restoring a key group into a table that holds some of its keys hashes what it replaces."""
    table = LmdbTable(str(tmp_path / "t"))
    flat = [U16.pack(0) + b"k1", b"a", U16.pack(0) + b"k2", b"b"]
    table.restore_key_group(2, flat[:2], frozenset(), key_group_digest(U16.pack(2), flat[0:1], flat[1:2]))
    table.restore_key_group(2, [flat[0], b"changed", *flat[2:]], frozenset(),
                            key_group_digest(U16.pack(2), flat[0::2], [b"changed", b"b"]))
    table.commit()
    assert table.verify() is None and table.entry_count() == 2


def test_documented_key_group_frame_is_real_bytes():
    text = (Path(__file__).resolve().parents[2] / "docs" / "formats.md").read_text()
    section = text[text.index("## Keyed snapshot files"):text.index("## Operator state files")]
    (block,) = re.findall(r"```\n([0-9a-f |]+)\n```", section)
    data = bytes.fromhex(block.replace(" ", "").replace("|", ""))
    (only,) = iter_frames(data, "doc")
    kg, flat, digest = msgpack.unpackb(only.payload)
    assert (kg, flat) == (6, [bytes.fromhex("00000002a1640000"), b"\x01"])
    assert digest == key_group_digest(U16.pack(6), flat[0::2], flat[1::2]) == 2773845573
    assert frame(FrameKind.KEY_GROUP, msgpack.packb([kg, flat, digest], use_bin_type=True)) == data


def test_a_relocated_snapshot_is_copied_in_parts_and_reads_the_same(tmp_path, monkeypatch):
    """Re-writing a handle (a rescaled subtask taking ownership of state in another subtask's directory) copies
    its span in reads of about SPAN_READ_BYTES, key groups between its own included, and the copy reads back
    the same entries with the same digests."""
    import spate.frames as frames_module
    from spate.snapshot.relocate import relocate

    source = _filled(str(tmp_path / "a"), 400)
    storage, handle = _snapshot(tmp_path, source)
    narrowed = type(handle)(handle.path, 4, 11, {kg: at for kg, at in handle.offsets.items() if 4 <= kg <= 11},
                            handle.size, handle.states, handle.file_offset)
    monkeypatch.setattr(frames_module, "SPAN_READ_BYTES", 600)
    reads: list[int] = []
    read_range = storage.read_range
    monkeypatch.setattr(storage, "read_range", lambda rel, o, n, c="": reads.append(n) or read_range(rel, o, n, c))
    copy = relocate(storage, narrowed, WholeFileWriter(storage, "shared/b", ".kg"))
    assert len(reads) > 2, "copied in parts"
    assert list(read_key_group_frames(storage, copy)) == list(read_key_group_frames(storage, narrowed))


class _LargeKeyGroups:
    """A table view whose key groups are ``n`` entries of ``size``-byte values each."""

    def __init__(self, n: int, size: int) -> None:
        self.n, self.size = n, size

    def key_group_flat(self, kg: int) -> list[bytes]:
        flat: list[bytes] = []
        for i in range(self.n):
            flat += [b"\x00\x01" + i.to_bytes(6, "big"), bytes([kg]) * self.size]
        return flat


def test_a_snapshot_holds_one_key_group_at_a_time(tmp_path):
    """Each frame is let go once written, before the next key group is read: the snapshot's peak memory is a
    few times one key group (its entries, their msgpack payload, the header), not several key groups. It was
    5.2× one key group's bytes while each frame was copied to be framed and kept until the next was made."""
    view = _LargeKeyGroups(4000, 500)
    one = sum(map(len, view.key_group_flat(0)))
    out = WholeFileWriter(storage_for(str(tmp_path)), "shared", ".kg", 1)
    tracemalloc.start()
    try:
        handle = write_key_groups(view, SnapshotScope(range(8), (), {}), out)  # type: ignore[arg-type]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert handle is not None and sorted(handle.offsets) == list(range(8))
    assert peak < 4 * one
