"""Checksummed framing, storage paths, atomic creation, and value serialization."""

from __future__ import annotations

import datetime as dt
import decimal

import pytest

import spate.frames as frames_module
from spate.errors import CorruptFileError, MissingFileError, SerializationError
from spate.frames import FrameKind, frame, iter_frames, read_single_frame, read_span_frames
from spate.fs import CheckpointStorage, validate_relative_path
from spate.serde import MSGPACK, decode_key, encode_key, serializer_by_name


@pytest.mark.parametrize("compress", [False, True])
def test_frames_round_trip(compress):
    data = frame(FrameKind.KEY_GROUP, b"abc" * 100, compress) + frame(FrameKind.METADATA, b"")
    frames = list(iter_frames(data, "f"))
    assert [(f.kind, f.payload) for f in frames] == [(FrameKind.KEY_GROUP, b"abc" * 100), (FrameKind.METADATA, b"")]
    assert frames[1].offset == frames[0].length


def test_corruption_and_truncation_are_named():
    data = bytearray(frame(FrameKind.METADATA, b"payload-bytes"))
    data[-3] ^= 0xFF
    with pytest.raises(CorruptFileError, match=r"chk-7/_metadata.*checksum mismatch"):
        read_single_frame(bytes(data), "chk-7/_metadata")
    with pytest.raises(CorruptFileError, match="truncated"):
        read_single_frame(frame(FrameKind.METADATA, b"payload")[:-2], "x")
    with pytest.raises(CorruptFileError, match="not a spate frame"):
        read_single_frame(b"garbage" * 10, "x")
    newer = bytearray(frame(FrameKind.METADATA, b"p"))
    newer[5] = 99  # format version
    with pytest.raises(CorruptFileError, match="newer than this spate"):
        read_single_frame(bytes(newer), "x")


@pytest.mark.parametrize("bad", ["/etc/passwd", "../x", "a/../../x", "", "s3://bucket/x", "a\\b", ".."])
def test_paths_cannot_escape_the_root(bad):
    with pytest.raises(ValueError):
        validate_relative_path(bad)


def test_storage_operations(tmp_path):
    s = CheckpointStorage(str(tmp_path / "root"))
    s.write("a/b/c.bin", b"0123456789")
    assert s.read_range("a/b/c.bin", 2, 3) == b"234" and s.size("a/b/c.bin") == 10
    assert s.list_files() == [("a/b/c.bin", 10)]
    s.create_exclusive("m", b"1")
    with pytest.raises(FileExistsError):
        s.create_exclusive("m", b"2")
    assert s.read("m") == b"1"
    s.replace("m", b"3")
    assert s.read("m") == b"3"
    with pytest.raises(MissingFileError, match=r"gone.*missing"):
        s.read("gone", "checkpoint 4")
    with pytest.raises(CorruptFileError, match="truncated"):
        s.read_range("a/b/c.bin", 8, 5)
    assert s.delete("a/b/c.bin") and not s.delete("a/b/c.bin")
    assert CheckpointStorage(f"file://{tmp_path}/root").read("m") == b"3"


@pytest.mark.parametrize("value", [None, True, 0, -1, 2**63 - 1, -2**63, 2**80, 1.5, "ü日本", b"\x00", [1, [2]],
                                   {"a": (1, 2)}, (1, ("x", None)), dt.date(2024, 2, 29),
                                   dt.datetime(2024, 1, 1, 12, 0, 0, 5), dt.datetime(2024, 1, 1, tzinfo=dt.UTC),
                                   decimal.Decimal("-1.250")])
def test_msgpack_round_trips_plain_data_exactly(value):
    back = MSGPACK.loads(MSGPACK.dumps(value))
    assert back == value and type(back) is type(value)
    assert decode_key(encode_key(value)) == value


def test_numpy_scalars_encode_as_python_numbers():
    import numpy as np

    assert MSGPACK.loads(MSGPACK.dumps(np.int64(5))) == 5
    assert MSGPACK.loads(MSGPACK.dumps(np.float32(0.5))) == 0.5


def test_pickle_needs_opt_in():
    with pytest.raises(SerializationError, match="allow_pickle=True"):
        serializer_by_name("pickle", allow_pickle=False, what="state 'x'")
    assert serializer_by_name("pickle", allow_pickle=True, what="state 'x'").name == "pickle"
    with pytest.raises(SerializationError, match="does not know"):
        serializer_by_name("avro", allow_pickle=True, what="state 'x'")


def test_unsupported_key_is_a_type_error():
    with pytest.raises(TypeError, match="unsupported key"):
        encode_key(object())


def test_a_span_of_frames_is_read_in_bounded_ranged_reads(tmp_path, monkeypatch):
    """A large logical file (a big keyed snapshot) is never read whole: its frames come from ranged reads of
    about SPAN_READ_BYTES, one frame at least, made as the frames are consumed."""
    storage = CheckpointStorage(str(tmp_path))
    payloads = [bytes([i]) * (100 + 37 * i) for i in range(40)]
    data, offsets, pos = b"", {}, 0
    for i, p in enumerate(payloads):
        fr = frame(FrameKind.KEY_GROUP, p)
        offsets[i] = (pos, len(fr))
        data, pos = data + fr, pos + len(fr)
    storage.write("f.kg", b"x" * 7 + data)
    monkeypatch.setattr(frames_module, "SPAN_READ_BYTES", 1000)
    reads: list[int] = []
    read_range = storage.read_range
    monkeypatch.setattr(storage, "read_range", lambda rel, o, n, c="": reads.append(n) or read_range(rel, o, n, c))
    wanted = {k: v for k, v in offsets.items() if k % 3}  # frames between those wanted are read, not returned
    _where, got = read_span_frames(storage, "f.kg", wanted, FrameKind.KEY_GROUP, file_offset=7)
    assert not reads, "nothing is read before the frames are consumed"
    got_payloads = [f.payload for f in got]
    assert set(got_payloads) >= {payloads[k] for k in wanted}
    assert len(reads) > 3 and max(reads) <= max(1000, max(n for _o, n in offsets.values()))


def test_a_failed_whole_file_write_deletes_its_part_but_never_a_file_it_did_not_create(tmp_path, monkeypatch):
    """A write whose parts fail part-way leaves nothing (its file has a new name of its own); a write that finds
    its name taken leaves the file that was there."""
    import spate.segments as segments

    storage = CheckpointStorage(str(tmp_path))
    writer = segments.WholeFileWriter(storage, "shared", ".kg")

    def parts():
        yield frame(FrameKind.KEY_GROUP, b"written")
        raise OSError("the reading side failed")

    with pytest.raises(OSError, match="reading side"):
        writer.write_parts(parts())
    assert list(tmp_path.rglob("*.kg")) == []

    (tmp_path / "shared" / "taken.kg").write_bytes(b"someone else's")
    monkeypatch.setattr(segments, "data_file", lambda directory, suffix: f"{directory}/taken{suffix}")
    with pytest.raises(FileExistsError):
        writer.write_parts([frame(FrameKind.KEY_GROUP, b"mine")])
    assert (tmp_path / "shared" / "taken.kg").read_bytes() == b"someone else's"
