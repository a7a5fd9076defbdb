"""Keys are grouped as their state is keyed and as Spark groups them (issue 9, item 7); checkpoint files are
checked end to end and their failures are named (item 8)."""

from __future__ import annotations

import datetime
import decimal
import errno
import json
import math
import os
import re
import struct
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import msgpack
import pytest
import zstandard

from spate import LocalRunner, Processor, ValueStateDescriptor
from spate.changelog.state import ChangelogConfig
from spate.changelog.upload import UploadConfig
from spate.checkpoint.inspect import load_checkpoint
from spate.checkpoint.metadata import METADATA_FORMAT_VERSION
from spate.errors import CorruptFileError, DiskFullError, InvalidKeyError
from spate.filemerging.manager import PhysicalFile
from spate.frames import FRAME_FORMAT_VERSION, FRAME_HEADER_SIZE, FrameKind, frame, iter_frames, read_single_frame
from spate.fs import CheckpointStorage
from spate.state.heap import HeapTable
from spate.state.keyed import KeyedStateBackend
from spate_tools.cli import main


def double(bits: int) -> float:
    """The float64 with exactly these bits (NaNs with other payloads than Python's own)."""
    return struct.unpack("<d", struct.pack("<Q", bits))[0]


NAN_PAYLOADS = [float("nan"), double(0x7FF8000000000001), double(0xFFF8000000000000), double(0x7FF80000DEADBEEF)]


class Count(Processor):
    """Counts rows per key; every call outputs the key, its count so far and how many rows the call got."""

    def open(self, ctx):
        self.count = ctx.state(ValueStateDescriptor("count", default=0))

    def process(self, key, rows, ctx):
        self.count.update(self.count.value() + len(rows))
        yield {"key": key, "count": self.count.value(), "rows": len(rows)}


def spark_group(value: float) -> Any:
    """The model: Spark's NormalizeFloatingNumbers (-0.0 is 0.0, every NaN is one NaN)."""
    return "NaN" if math.isnan(value) else value + 0.0


def model_outputs(batches: list[list[float]]) -> list[list[tuple[Any, int, int]]]:
    counts: dict[Any, int] = {}
    out = []
    for batch in batches:
        per_key: dict[Any, int] = {}
        for v in batch:
            per_key[spark_group(v)] = per_key.get(spark_group(v), 0) + 1
        for k, n in per_key.items():
            counts[k] = counts.get(k, 0) + n
        out.append(sorted(((k, counts[k], n) for k, n in per_key.items()), key=repr))
    return out


def observed(result: Any) -> list[tuple[Any, int, int]]:
    rows = [(spark_group(r["key"]), r["count"], r["rows"]) for r in result.outputs]
    for r in result.outputs:  # the processor sees the normalized key itself
        assert math.copysign(1.0, r["key"]) == 1.0 or math.isnan(r["key"])
    return sorted(rows, key=repr)


@pytest.mark.parametrize("table", ["heap", "lmdb"])
def test_negative_zero_and_nan_payloads_count_as_spark_groups_them(tmp_path, table):
    """-0.0 and 0.0 are one key and every NaN is one key, in one batch, across batches and across a restart,
    as a model normalizing the way Spark does counts them."""
    batches = [[0.0, -0.0, *NAN_PAYLOADS, 1.5],
               [-0.0, NAN_PAYLOADS[1], NAN_PAYLOADS[2], NAN_PAYLOADS[1]],
               [0.0, NAN_PAYLOADS[3], -0.0, 1.5]]
    source = [[{"k": v} for v in batch] for batch in batches]
    root, local = str(tmp_path / "ckpt"), str(tmp_path / "local")
    got = []
    for until, parallelism in ((2, 2), (3, 3)):  # a restart (at another parallelism) after batch 1
        with LocalRunner(Count, key="k", checkpoint_root=root, parallelism=parallelism, max_parallelism=8,
                         table=table, local_dir=local) as runner:
            got += [observed(r) for r in runner.run(source, until=until)]
    assert got == model_outputs(batches)


def test_negative_zero_and_nan_in_a_tuple_key_are_normalized(tmp_path):
    batches = [[("a", 0.0), ("a", -0.0), ("a", NAN_PAYLOADS[0]), ("a", NAN_PAYLOADS[1])],
               [("a", -0.0), ("a", NAN_PAYLOADS[2])]]
    source = [[{"s": s, "d": d} for s, d in batch] for batch in batches]
    with LocalRunner(Count, key=["s", "d"], checkpoint_root=str(tmp_path / "c")) as runner:
        results = runner.run(source)
    counts = [sorted(((spark_group(r["key"][1]), r["count"]) for r in res.outputs), key=repr) for res in results]
    assert counts == [[("NaN", 2), (0.0, 2)], [("NaN", 3), (0.0, 3)]]


def test_state_backend_keys_negative_zero_and_nans_as_one():
    """Keyed state itself (the Spark path sets keys directly) stores -0.0 under 0.0 and every NaN under one."""
    backend = KeyedStateBackend(HeapTable(), 1, range(1))
    count = backend.get_state(ValueStateDescriptor("n", default=0))
    for key in [0.0, -0.0, *NAN_PAYLOADS, (1, -0.0), (1, 0.0)]:
        backend.set_current_key(key)
        count.update(count.value() + 1)
    values = {}
    for key in [0.0, float("nan"), (1, 0.0)]:
        backend.set_current_key(key)
        values[repr(key)] = count.value()
    assert values == {"0.0": 2, "nan": 4, "(1, 0.0)": 2}


@pytest.mark.parametrize("values", [[1, True], [1, 1.0], [True, 1.0], [1.0, decimal.Decimal(1)]])
def test_mixed_key_types_in_one_batch_are_refused(tmp_path, values):
    with LocalRunner(Count, key="k", checkpoint_root=str(tmp_path / "c")) as runner:
        with pytest.raises(InvalidKeyError, match=r"key column 'k' mixes key types") as err:
            runner.run_batch(0, [{"k": v} for v in values])
        assert type(values[0]).__name__ in str(err.value) and type(values[1]).__name__ in str(err.value)
        assert runner.next_batch_id == 0  # nothing was checkpointed; the runner keeps working
        assert runner.run_batch(0, [{"k": values[0]}]).outputs[0]["count"] == 1


def test_mixed_key_types_across_batches_are_refused(tmp_path):
    """Batch 0 counts key 1 (an int); True in batch 1 would be another state key although 1 == True."""
    with LocalRunner(Count, key=["a", "b"], checkpoint_root=str(tmp_path / "c")) as runner:
        runner.run_batch(0, [{"a": "x", "b": 1}, {"a": "x", "b": None}])
        with pytest.raises(InvalidKeyError, match=r"key column 'b' mixes key types int and bool"):
            runner.run_batch(1, [{"a": "x", "b": True}])


@pytest.mark.parametrize("values", [[1, "1"], ["1", 1], [b"1", "1"], [datetime.date(2024, 1, 1), "2024-01-01"]])
def test_types_that_never_compare_equal_are_refused_too(tmp_path, values):
    """1 and "1" in one key column is a parsing slip that would count two keys: refused, naming both types;
    nulls may sit beside any type, as in a Spark column."""
    with LocalRunner(Count, key="k", checkpoint_root=str(tmp_path / "c")) as runner:
        with pytest.raises(InvalidKeyError, match=r"key column 'k' mixes key types \w+ and \w+ .*never group "
                                                  r"together .*convert every value") as err:
            runner.run_batch(0, [{"k": None}, {"k": values[0]}, {"k": values[1]}])
        named = re.search(r"mixes key types (\w+) and (\w+)", str(err.value))
        assert named is not None and named.groups() == (type(values[0]).__name__, type(values[1]).__name__)
        assert runner.next_batch_id == 0
        outputs = runner.run_batch(0, [{"k": values[0]}, {"k": None}, {"k": values[0]}]).outputs
    assert sorted((repr(r["key"]), r["count"]) for r in outputs) == sorted([(repr(values[0]), 2), ("None", 1)])


def test_a_refused_batch_fixes_no_column_type(tmp_path):
    """The user's fix for [1, "1"] may be to make every key a string: the corrected batch is accepted."""
    with LocalRunner(Count, key="k", checkpoint_root=str(tmp_path / "c")) as runner:
        with pytest.raises(InvalidKeyError, match="mixes key types int and str"):
            runner.run_batch(0, [{"k": 1}, {"k": "1"}])
        outputs = runner.run_batch(0, [{"k": "1"}, {"k": "1"}]).outputs
        assert [(r["key"], r["count"]) for r in outputs] == [("1", 2)]
        with pytest.raises(InvalidKeyError, match="mixes key types str and int"):
            runner.run_batch(1, [{"k": 2}])


def test_mixed_key_types_from_a_key_function_name_the_position(tmp_path):
    with (LocalRunner(Count, key=lambda row: (row["a"], row["b"]), checkpoint_root=str(tmp_path / "c")) as runner,
          pytest.raises(InvalidKeyError, match=r"the key's column 1 mixes key types float and int")):
        runner.run_batch(0, [{"a": 1, "b": 2.0}, {"a": 1, "b": 2}])


def test_bytearray_key_gets_spate_error(tmp_path):
    with (LocalRunner(Count, key="k", checkpoint_root=str(tmp_path / "c")) as runner,
          pytest.raises(InvalidKeyError, match=r"key column 'k' holds a bytearray .*bytes\(value\)")):
        runner.run_batch(0, [{"k": bytearray(b"abc")}])


def test_lone_surrogate_key_gets_spate_error(tmp_path):
    with (LocalRunner(Count, key=["a", "s"], checkpoint_root=str(tmp_path / "c")) as runner,
          pytest.raises(InvalidKeyError, match=r"key column 's' holds .*lone surrogates.*surrogatepass")):
        runner.run_batch(0, [{"a": 1, "s": "ok\ud800"}])
    backend = KeyedStateBackend(HeapTable(), 1, range(1))
    with pytest.raises(InvalidKeyError, match="not valid Unicode"):
        backend.set_current_key("\udfff", 0)


def test_huge_key_is_truncated_in_error_messages(tmp_path):
    huge = "x" * 100_000
    with LocalRunner(Count, key="k", checkpoint_root=str(tmp_path / "c")) as runner:
        with pytest.raises(InvalidKeyError) as mixed:
            runner.run_batch(0, [{"k": 1}, {"k": huge}])
        with pytest.raises(InvalidKeyError) as surrogate:
            runner.run_batch(0, [{"k": huge + "\ud800"}])
    backend = KeyedStateBackend(HeapTable(), 2, range(1))
    with pytest.raises(InvalidKeyError) as too_long:
        backend.set_current_key(huge, 0)
    with pytest.raises(ValueError, match="does not own") as not_owned:
        backend.set_current_key(huge, 1)
    for err in (mixed, surrogate, too_long, not_owned):
        message = str(err.value)
        assert "xxxxxxxx…" in message and len(message) < 600, message[:200]


# -- item 8: files ------------------------------------------------------------------------------------------

def v2_frame(kind: int, stored: bytes, flags: int = 0) -> bytes:
    """A version-2 frame built by hand from the documented layout (crc32 over header bytes 0-15 + payload)."""
    fields = struct.pack(">4sHBBQ", b"SPTF", 2, kind, flags, len(stored))
    return fields + struct.pack(">I", zlib.crc32(stored, zlib.crc32(fields))) + stored


def v1_frame(kind: int, stored: bytes, flags: int = 0) -> bytes:
    """A version-1 frame, as spate wrote before frames version 2 (crc32 of the payload only)."""
    return struct.pack(">4sHBBQI", b"SPTF", 1, kind, flags, len(stored), zlib.crc32(stored)) + stored


@pytest.mark.parametrize("compress", [False, True])
def test_every_header_bit_flip_is_detected(compress):
    """A flipped bit anywhere in the 20-byte header (kind, flags, length and version included) is a corrupt
    file, never a frame read with a wrong kind, flags or length."""
    data = frame(FrameKind.METADATA, b'{"checkpoint_id": 7}' * 3, compress=compress)
    assert data == v2_frame(FrameKind.METADATA, data[FRAME_HEADER_SIZE:], flags=int(compress))
    for bit in range(FRAME_HEADER_SIZE * 8):
        damaged = bytearray(data)
        damaged[bit // 8] ^= 1 << (bit % 8)
        with pytest.raises(CorruptFileError, match=r"/x at offset 0"):
            list(iter_frames(bytes(damaged), "/x"))
        with pytest.raises(CorruptFileError):
            read_single_frame(bytes(damaged), "/x")


def test_version_1_frames_still_read():
    payload = b'{"old": "checkpoint"}'
    assert read_single_frame(v1_frame(FrameKind.METADATA, payload), "/old", FrameKind.METADATA) == payload
    compressed = zstandard.ZstdCompressor(level=1).compress(payload * 10)
    frames = list(iter_frames(v1_frame(3, compressed, flags=1) + v1_frame(3, b"x"), "/old.kg"))
    assert [f.payload for f in frames] == [payload * 10, b"x"]
    with pytest.raises(CorruptFileError, match="checksum mismatch"):
        read_single_frame(v1_frame(FrameKind.METADATA, payload)[:-1] + b"?", "/old")


class _DocumentedJob(Processor):
    """The job of docs/formats.md's layout and metadata examples."""

    def open(self, ctx):
        self.count = ctx.state(ValueStateDescriptor("count", default=0))
        self.offsets = ctx.get_list_state("offsets")

    def process(self, key, rows, ctx):
        self.count.update(self.count.value() + len(rows))
        yield {"k": key, "count": self.count.value()}

    def end_batch(self, ctx):
        self.offsets.update([0, 1])


def _anonymous(obj: Any, key: str = "") -> Any:
    """Random names and timings replaced: what a run of the documented job always writes."""
    if isinstance(obj, dict):
        return {k: _anonymous(v, k) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_anonymous(v) for v in obj]
    if isinstance(obj, str):
        return re.sub(r"[0-9a-f]{32}", "<hex32>", obj)
    return None if key.endswith("_ms") and key != "timestamp_ms" and obj else obj


def test_documented_metadata_example_is_what_a_checkpoint_writes(tmp_path):
    root = str(tmp_path / "c")
    with LocalRunner(_DocumentedJob, key="k", checkpoint_root=root, parallelism=2, sink=lambda rows, n: None,
                     clock=lambda: 1732147200000) as r:
        r.run([[{"k": "d"}, {"k": "c"}, {"k": "a"}, {"k": "b"}], [{"k": "d"}, {"k": "a"}]])
    doc = (Path(__file__).resolve().parents[2] / "docs" / "formats.md").read_text()
    example = re.search(r"Real example \(`chk-1/_metadata`.*?```json\n(.*?)\n```", doc, re.S).group(1)  # type: ignore[union-attr]
    documented = json.loads(example.replace(",\n  ...]}", "]}"))
    real = json.loads(read_single_frame(CheckpointStorage(root).read("chk-1/_metadata"), "m", FrameKind.METADATA))
    real["subtasks"] = real["subtasks"][:1]  # the example omits the second subtask
    assert json.dumps(_anonymous(documented)) == json.dumps(_anonymous(real))


def test_documented_change_set_list_example_is_what_a_checkpoint_writes(tmp_path):
    """docs/formats.md's change-set list example: the metadata's inline handles and list reference, and the list's
    first handle, as a run of the documented job writes them."""
    root = str(tmp_path / "c")
    cfg = ChangelogConfig(materialization_interval_ms=10**9, materialize_after_change_sets=1000,
                          upload=UploadConfig(persist_delay_s=0.0))
    with LocalRunner(_DocumentedJob, key="k", checkpoint_root=root, parallelism=1, changelog=cfg,
                     clock=lambda: 1732147200000) as r:
        r.run([[{"k": "a"}]] * 18)
    doc = (Path(__file__).resolve().parents[2] / "docs" / "formats.md").read_text()
    section = doc[doc.index("## Change-set lists"):doc.index("## Staged outputs")]
    meta_doc, list_doc = re.findall(r"```json\n(.*?)\n```", section, re.S)
    storage = CheckpointStorage(root)
    sub = json.loads(read_single_frame(storage.read("chk-17/_metadata"), "m", FrameKind.METADATA))["subtasks"][0]
    real = {"changelog": sub["changelog"], "changelog_lists": sub["changelog_lists"]}
    assert _hidden_ids(json.loads(meta_doc)) == _hidden_ids(real)
    (ref,) = real["changelog_lists"]
    listed = json.loads(read_single_frame(storage.read(ref["path"]), "l", FrameKind.CHANGE_LIST))
    assert len(listed) == ref["count"] == 16 and ref["size"] == len(storage.read(ref["path"]))
    assert _hidden_ids(json.loads(list_doc.replace(",\n ...]", "]"))) == _hidden_ids(listed[:1])
    assert [h["sqn"] for h in listed] == list(range(16))


def _hidden_ids(obj: Any) -> str:
    text = re.sub(r"[0-9a-f]{32}", "<hex32>", json.dumps(obj))
    return re.sub(r'"0-1-[0-9a-f]{12}"', '"0-1-<hex12>"', text)


def test_metadata_of_version_2_is_read_with_the_typed_fields_from_its_stats(tmp_path):
    """Before format 3 the ack's facts were statistics: they move out of ``stats`` when read."""
    subtask = {"keyed": [], "operator": None, "outputs": None}
    old = {"format_version": 2, "checkpoint_id": 4, "query_id": "q", "epoch": 1, "parallelism": 2,
           "max_parallelism": 128, "timestamp_ms": 0, "subtasks": [
               {**subtask, "stats": {"rows": 3, "snapshot_ms": 0.5, "reused": False, "restored_from": None,
                                     "staged": True}},
               {**subtask, "stats": {"rows": 2, "restored_from": 3, "restore_ms": 12.5}}]}
    storage = CheckpointStorage(str(tmp_path))
    storage.write("chk-4/_metadata", frame(FrameKind.METADATA, json.dumps(old).encode()))
    first, second = load_checkpoint(storage, 4).subtasks
    assert (first.rows, first.staged, first.recovery, first.restored_from) == (3, True, "unknown", None)
    assert first.stats == {"snapshot_ms": 0.5, "reused": False}
    assert (second.rows, second.staged, second.recovery, second.restored_from, second.restore_ms,
            second.restore_bytes, second.executor) == (2, False, "restored", 3, 12.5, 0, None)
    assert second.stats == {}
    again = json.loads(json.dumps(load_checkpoint(storage, 4).to_dict()))
    assert again["format_version"] == METADATA_FORMAT_VERSION and again["subtasks"][1]["recovery"] == "restored"


def documented_frames() -> list[bytes]:
    """The hex examples of docs/formats.md's Frames section."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "formats.md").read_text()
    section = text[text.index("## Frames"):text.index("## Versioning")]
    blocks = re.findall(r"```\n([0-9a-f ]+)\n```", section)
    assert len(blocks) == 3, blocks
    return [bytes.fromhex(b.replace(" ", "")) for b in blocks]


def test_documented_frame_examples_are_real_bytes():
    examples = documented_frames()
    for data in examples:
        assert read_single_frame(data, "doc", FrameKind.DELIVERED) in (b"", b"12")
    current = [d for d in examples if struct.unpack_from(">H", d, 4)[0] == FRAME_FORMAT_VERSION]
    assert [frame(FrameKind.DELIVERED, read_single_frame(d, "doc")) for d in current] == current == [
        frame(FrameKind.DELIVERED, b""), frame(FrameKind.DELIVERED, b"12")]
    assert "| 4 | 2 | format version | u16, currently `2`" in (Path(__file__).resolve().parents[2] / "docs" /
                                                               "formats.md").read_text()


def test_zstd_error_is_corrupt_file_error_naming_file_and_offset():
    bad = v2_frame(FrameKind.KEY_GROUP, b"\x28\xb5\x2f\xfd this is not zstd", flags=1)
    with pytest.raises(CorruptFileError, match=r"^/root/a\.kg \(checkpoint 3\) at offset 120: .*zstd"):
        list(iter_frames(bad, "/root/a.kg (checkpoint 3)", base_offset=120))


def test_zstd_error_in_a_checkpoint_names_file_offset_and_checkpoint(tmp_path, capsys):
    root = str(tmp_path / "c")
    source = [[{"k": f"key-{i}"} for i in range(50)]] * 3
    with LocalRunner(Count, key="k", checkpoint_root=root, compress=True) as runner:
        runner.run(source, until=2)
    storage = CheckpointStorage(root)
    handle = load_checkpoint(storage, 1).subtasks[0].keyed[0]
    kg, (offset, length) = next(iter(handle.offsets.items()))
    at = handle.file_offset + offset
    with open(storage.path(handle.path), "r+b") as f:  # a well-formed frame whose payload is not zstd
        f.seek(at)
        f.write(v2_frame(FrameKind.KEY_GROUP, b"\x28\xb5\x2f\xfd" + b"\0" * (length - 24), flags=1))
    assert main(["checkpoints", "verify", root]) == 1
    out = capsys.readouterr().out
    assert f"{handle.path}" in out and f"at offset {offset}" in out and "checkpoint 1" in out and "zstd" in out
    with (pytest.raises(CorruptFileError, match=rf"{handle.path}.*checkpoint 1.* at offset {offset}: .*zstd"),
          LocalRunner(Count, key="k", checkpoint_root=root, compress=True) as runner):
        runner.run(source)


@pytest.fixture
def delivered_root(tmp_path):
    root = str(tmp_path / "root")
    with LocalRunner(Count, key="k", checkpoint_root=root, sink=lambda rows, batch_id: None) as runner:
        runner.run([[{"k": "a"}], [{"k": "b"}]])
    assert main(["checkpoints", "verify", root]) == 0
    return root


@pytest.mark.parametrize("damage, problem", [
    (lambda root: flip_byte(root, "_delivered", 6), r"_delivered at offset 0: checksum mismatch"),
    (lambda root: write(root, "_delivered", frame(FrameKind.DELIVERED, b"one")), r"_delivered: .*not a checkpoint"),
    (lambda root: write(root, "_delivered", frame(FrameKind.QUERY, b"1")), r"_delivered: frame kind 1, expected 6"),
    (lambda root: flip_byte(root, "_query", 25), r"_query at offset 0: checksum mismatch"),
    (lambda root: write(root, "_query", frame(FrameKind.QUERY, b"{}")), r"_query: query file is malformed"),
    (lambda root: os.remove(os.path.join(root, "_query")), r"_query is missing but checkpoints exist"),
])
def test_verify_checks_query_and_delivered(delivered_root, capsys, damage, problem):
    damage(delivered_root)
    assert main(["checkpoints", "verify", delivered_root]) == 1
    captured = capsys.readouterr()
    assert re.search(r"root files \(_query, _delivered\): .*" + problem, captured.out), captured.out
    assert main(["checkpoints", "verify", delivered_root, "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert not report["ok"] and report["root_problems"] and all(c["ok"] for c in report["checkpoints"])


def flip_byte(root: str, name: str, at: int) -> None:
    path = os.path.join(root, name)
    data = bytearray(Path(path).read_bytes())
    data[at] ^= 0x40
    Path(path).write_bytes(bytes(data))


def write(root: str, name: str, data: bytes) -> None:
    Path(root, name).write_bytes(data)


def test_verify_turns_any_exception_into_an_error_line(delivered_root, capsys, monkeypatch):
    """Fault injection: the verification steps raise errors that are not spate's own."""
    def fault_injection(*args: Any) -> Any:
        raise RuntimeError("injected fault")

    monkeypatch.setattr("spate_tools.cli.verify_checkpoint", fault_injection)
    assert main(["checkpoints", "verify", delivered_root]) == 1
    assert "checkpoint 0: RuntimeError: injected fault" in capsys.readouterr().out
    monkeypatch.setattr("spate_tools.cli.list_complete_checkpoints", fault_injection)
    assert main(["checkpoints", "verify", delivered_root]) == 1
    assert capsys.readouterr().err.strip() == "spate: error: RuntimeError: injected fault"


def test_verify_in_a_subprocess_never_prints_a_traceback(delivered_root):
    """A well-formed (version 1) key-group frame whose payload is a msgpack map, not [kg, entries]: reading
    it fails with a CorruptFileError naming the file, which verify reports as a line."""
    storage = CheckpointStorage(delivered_root)
    handle = next(h for st in load_checkpoint(storage, 1).subtasks for h in st.keyed)
    offset, length = next(iter(handle.offsets.values()))
    payload = next(p for n in range(length) if len(p := msgpack.packb({"a": "x" * n, "b": 0})) >= length - 20)
    assert len(payload) == length - 20
    with open(storage.path(handle.path), "r+b") as f:
        f.seek(handle.file_offset + offset)
        f.write(v1_frame(FrameKind.KEY_GROUP, payload))
    done = subprocess.run([sys.executable, "-m", "spate_tools.cli", "checkpoints", "verify", delivered_root],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "Traceback" not in done.stdout + done.stderr
    assert "checkpoint 1:" in done.stdout and "a key-group frame that is not [key group, entries]" in done.stdout, done


@pytest.mark.parametrize("command", ["list", "verify", "show"])
def test_commands_on_a_missing_root_fail_with_a_message(tmp_path, capsys, command):
    missing = str(tmp_path / "no-such-root")
    assert main(["checkpoints", command, missing]) != 0
    captured = capsys.readouterr()
    assert f"checkpoint root {missing} does not exist" in captured.err and "complete checkpoints" not in captured.out


def fail_with_enospc(*args: Any, **kwargs: Any) -> Any:
    """Fault injection: the storage is full."""
    raise OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.parametrize("merging", [False, True])
@pytest.mark.parametrize("changelog", [False, True])
def test_disk_full_names_the_file_and_the_checkpoint(tmp_path, monkeypatch, merging, changelog):
    root = str(tmp_path / "c")
    source = [[{"k": "a"}, {"k": "b"}], [{"k": "a"}], [{"k": "c"}]]
    config = ChangelogConfig(upload=UploadConfig(max_attempts=1)) if changelog else False
    with LocalRunner(Count, key="k", checkpoint_root=root, file_merging=merging, changelog=config) as runner:
        runner.run(source, until=1)
        with monkeypatch.context() as fault:
            fault.setattr(PhysicalFile if merging else CheckpointStorage, "append" if merging else "write_parts",
                          fail_with_enospc)
            with pytest.raises(DiskFullError) as err:
                runner.run_batch(1, source[1])
        assert isinstance(err.value, OSError) and err.value.errno == errno.ENOSPC
        message = str(err.value)
        assert re.search(rf"{re.escape(root)}/\S+\.(kg|op|out|chg|seg): no space left", message), message
        assert "of checkpoint 1" in message and "free space" in message
        assert [r.batch_id for r in runner.run(source)] == [1, 2]  # space is back: the query goes on


@pytest.mark.parametrize("method, file", [("create_exclusive", "chk-1/_metadata"), ("replace", "_delivered")])
def test_disk_full_on_metadata_and_delivery_marker_names_them(tmp_path, monkeypatch, method, file):
    root = str(tmp_path / "c")
    with LocalRunner(Count, key="k", checkpoint_root=root, sink=lambda rows, batch_id: None) as runner:
        runner.run_batch(0, [{"k": "a"}])
        with monkeypatch.context() as fault, pytest.raises(DiskFullError, match="of checkpoint 1") as err:
            fault.setattr(CheckpointStorage, method, fail_with_enospc)
            runner.run_batch(1, [{"k": "b"}])
        assert f"{root}/{file}: no space left" in str(err.value)


def test_key_not_matching_key_types_gets_spate_error(tmp_path):
    with (LocalRunner(Count, key="k", key_types=["int"], checkpoint_root=str(tmp_path / "c")) as runner,
          pytest.raises(InvalidKeyError, match=r"key 1099511627776 of key column 'k' cannot be hashed .*'int'")):
        runner.run_batch(0, [{"k": 2**40}])
