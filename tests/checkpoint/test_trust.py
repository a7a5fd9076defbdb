"""Trust boundaries (issue 9, items 5 and 6): nothing is unpickled unless the reader opted in with
``allow_pickle=True``, and local state is reused only after checking it and the checkpoint files it references."""

from __future__ import annotations

import glob
import logging
import os

import pytest

from spate import LocalRunner, Processor, ValueStateDescriptor, load_checkpoint
from spate.changelog.state import ChangelogConfig
from spate.changelog.upload import UploadConfig
from spate.checkpoint.coordinator import list_complete_checkpoints
from spate.checkpoint.inspect import verify_checkpoint
from spate.errors import SerializationError
from spate.fs import CheckpointStorage
from spate.snapshot.handles import NativeSnapshotHandle
from spate.state.lmdb_table import LmdbTable

NOW = UploadConfig(persist_delay_s=0.0, timeout_s=5.0)


# -- item 5: pickle only with the reader's consent ------------------------------------------------------------
class Bomb:
    """Unpickling it creates the file ``path``: stands for code a crafted checkpoint would run."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return open, (self.path, "w")


class KeyedBlob(Processor):
    """Keeps a pickled value per key; writes a Bomb when the row says so, else reads the value."""

    def open(self, ctx):
        self.blob = ctx.state(ValueStateDescriptor("blob", serializer="pickle"))

    def process(self, key, rows, ctx):
        if rows[0].get("bomb"):
            self.blob.update(Bomb(rows[0]["bomb"]))
            return None
        old = self.blob.value()
        self.blob.update(frozenset([key, len(rows)]))
        return [{"k": key, "old": sorted(old, key=str) if isinstance(old, frozenset) else None}]


class OperatorBlob(Processor):
    def open(self, ctx):
        self.items = ctx.get_list_state("items", serializer="pickle")

    def process(self, key, rows, ctx):
        if rows[0].get("bomb"):
            self.items.add(Bomb(rows[0]["bomb"]))


def bomb_batch(marker: str) -> list[dict]:
    return [{"k": k, "bomb": marker} for k in "abcdef"]


@pytest.mark.parametrize(("parallelism", "changelog", "table"), [
    (2, False, "heap"), (3, False, "heap"), (2, True, "heap"), (3, True, "heap"), (2, False, "lmdb"),
    (2, True, "lmdb")])
def test_keyed_pickle_state_is_not_unpickled_without_opt_in(tmp_path, parallelism, changelog, table):
    root, local, marker = str(tmp_path / "c"), str(tmp_path / "local"), str(tmp_path / "pwned")
    opts = {"key": "k", "checkpoint_root": root, "changelog": changelog, "table": table, "local_dir": local}
    with LocalRunner(KeyedBlob, parallelism=2, allow_pickle=True, **opts) as r:
        r.run([bomb_batch(marker)])
    assert not os.path.exists(marker), "writing pickled state never unpickles it"
    with LocalRunner(KeyedBlob, parallelism=parallelism, **opts) as r, \
            pytest.raises(SerializationError, match=r"state 'blob'.*allow_pickle=True"):
        r.run([[], [{"k": "a"}]])
    assert not os.path.exists(marker), "restoring without allow_pickle ran code from the checkpoint"


def test_operator_pickle_state_is_not_unpickled_without_opt_in(tmp_path):
    root, marker = str(tmp_path / "c"), str(tmp_path / "pwned")
    with LocalRunner(OperatorBlob, key="k", checkpoint_root=root, parallelism=2, allow_pickle=True) as r:
        r.run([bomb_batch(marker)])
    for parallelism in (2, 3):
        with LocalRunner(OperatorBlob, key="k", checkpoint_root=root, parallelism=parallelism) as r, \
                pytest.raises(SerializationError, match=r"operator state 'items'.*allow_pickle=True"):
            r.run([[], [{"k": "a"}]])
    assert not os.path.exists(marker)


def test_staged_pickle_outputs_are_not_unpickled_without_opt_in(tmp_path):
    root, marker = str(tmp_path / "c"), str(tmp_path / "pwned")

    class Emit(Processor):
        def process(self, key, rows, ctx):
            yield {"k": key, "payload": Bomb(marker)}

    def failing_sink(rows, batch_id):
        raise OSError("sink down")

    with LocalRunner(Emit, key="k", checkpoint_root=root, sink=failing_sink, output_serializer="pickle",
                     allow_pickle=True) as r, pytest.raises(OSError, match="sink down"):
        r.run([[{"k": "a"}]])
    with pytest.raises(SerializationError, match=r"staged outputs.*allow_pickle=True"):
        LocalRunner(Emit, key="k", checkpoint_root=root, sink=lambda rows, batch_id: None)
    assert not os.path.exists(marker)


def test_pickle_output_serializer_needs_opt_in(tmp_path):
    with pytest.raises(SerializationError, match="output_serializer.*allow_pickle=True"):
        LocalRunner(KeyedBlob, key="k", checkpoint_root=str(tmp_path), sink=lambda rows, batch_id: None,
                    output_serializer="pickle")


@pytest.mark.parametrize("changelog", [False, True])
def test_pickle_state_works_when_the_reader_opts_in(tmp_path, changelog):
    root = str(tmp_path / "c")
    src = [[{"k": "a"}, {"k": "b"}], [{"k": "a"}, {"k": "a"}], [{"k": "a"}]]
    with LocalRunner(KeyedBlob, key="k", checkpoint_root=root, parallelism=2, allow_pickle=True,
                     changelog=changelog) as r:
        r.run(src, until=2)
    with LocalRunner(KeyedBlob, key="k", checkpoint_root=root, parallelism=3, allow_pickle=True,
                     changelog=changelog) as r:
        (res,) = r.run(src)
    assert res.outputs == [{"k": "a", "old": [2, "a"]}]


# -- item 6: verified local state reuse ------------------------------------------------------------------------
class TaggedCount(Processor):
    """Counts rows per key in a string value ``cnt-<key>-<count>`` (easy to find in the lmdb file)."""

    def open(self, ctx):
        self.tag = ctx.state(ValueStateDescriptor("tag", default=None))

    def process(self, key, rows, ctx):
        old = self.tag.value()
        n = (int(old.rsplit("-", 1)[1]) if old else 0) + len(rows)
        self.tag.update(f"cnt-{key}-{n:06d}")
        yield {"k": key, "n": n}


SOURCE = [[{"k": k} for k in "abcdefgh" * (b + 1)] for b in range(12)]


def expected_outputs(batch: int) -> list[dict]:
    """A crash-free model: key k's count after ``batch`` is the sum of its rows so far."""
    n = sum(b + 1 for b in range(batch + 1))
    return [{"k": k, "n": n} for k in "abcdefgh"]


def by_key(rows: list[dict]) -> list[dict]:
    return sorted(rows, key=lambda r: r["k"])


def run_checked(runner: LocalRunner, until: int, after_batch=lambda: None) -> None:
    for n in range(runner.next_batch_id, until):
        res = runner.run_batch(n, SOURCE[n])
        assert by_key(res.outputs) == expected_outputs(n), f"batch {n}"
        after_batch()


def corrupt_byte(path: str, offset: int, mask: int = 0xFF) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ mask]))


def materialized_handle(root: str):
    meta = load_checkpoint(CheckpointStorage(root))
    return next(h for st in meta.subtasks for h in st.keyed)


@pytest.mark.parametrize(("merging", "native"), [(False, False), (True, False), (False, True), (True, True)])
def test_damaged_materialization_is_not_carried_forward(tmp_path, caplog, merging, native):
    root, local = str(tmp_path / "c"), str(tmp_path / "local")
    clock = [0]
    opts = {"key": "k", "checkpoint_root": root, "parallelism": 2, "table": "lmdb", "local_dir": local,
            "file_merging": merging, "clock": lambda: clock[0]}
    reads = {"materialize_in_process_from_bytes": 0} if native else {}  # a small table: frames unless the process
    with LocalRunner(TaggedCount, changelog=ChangelogConfig(materialization_interval_ms=1000, upload=NOW, **reads),
                     **opts) as r:
        def tick():
            clock[0] += 1000
            for s in r.subtasks:
                s.clog.wait_for_materialization()

        run_checked(r, 5, tick)
    handle = materialized_handle(root)
    if native:
        assert isinstance(handle, NativeSnapshotHandle), "the reader process writes the table's own file"
        corrupt_byte(os.path.join(root, handle.path), handle.file_offset + handle.size // 2)
    else:
        kg, (offset, length) = next(iter(handle.offsets.items()))
        corrupt_byte(os.path.join(root, handle.path), handle.file_offset + offset + length - 1)
    # the local state is intact and its tag says it equals the latest checkpoint: it is reused, and no
    # materialization is due for a long time, so without the check every later checkpoint would keep
    # referencing the damaged file
    with caplog.at_level(logging.WARNING), LocalRunner(
            TaggedCount, changelog=ChangelogConfig(materialization_interval_ms=10**9, upload=NOW), **opts) as r:
        run_checked(r, 9)
    storage = CheckpointStorage(root)
    for cid in list_complete_checkpoints(storage):
        assert verify_checkpoint(storage, load_checkpoint(storage, cid)) == [], f"checkpoint {cid}"
    with LocalRunner(TaggedCount, key="k", checkpoint_root=root, parallelism=3, changelog=True) as r:
        run_checked(r, 10)
    assert "damaged" in caplog.text and handle.path in caplog.text


@pytest.mark.parametrize("changelog", [False, True])
def test_flipped_byte_in_local_lmdb_is_detected_and_restored(tmp_path, caplog, changelog):
    root, local = str(tmp_path / "c"), str(tmp_path / "local")
    opts = {"key": "k", "checkpoint_root": root, "parallelism": 2, "table": "lmdb", "local_dir": local,
            "changelog": changelog}
    with LocalRunner(TaggedCount, **opts) as r:
        run_checked(r, 3)
    flipped = 0
    for path in glob.glob(os.path.join(local, "**", "data.mdb"), recursive=True):
        with open(path, "rb") as f:
            data = f.read()
        at = data.find(b"cnt-c-")
        while at >= 0:
            corrupt_byte(path, at + len("cnt-c-000001") - 1, 0x01)  # key c's count, still a valid digit
            flipped += 1
            at = data.find(b"cnt-c-", at + 1)
    assert flipped
    with caplog.at_level(logging.WARNING), LocalRunner(TaggedCount, **opts) as r:
        (res,) = r.run(SOURCE, until=4)
        assert by_key(res.outputs) == expected_outputs(3)
        assert res.restored_subtasks, "the damaged local state was discarded and restored from storage"
        run_checked(r, 6)
    assert "integrity check" in caplog.text


def test_lmdb_digest_follows_every_kind_of_write(tmp_path):
    """The digest kept write by write equals a full re-read after puts, overwrites, deletes, map entries, bulk
    restores and map growth (which replays the open transaction), also after reopening."""
    table = LmdbTable(str(tmp_path / "t"), map_size=1 << 20, commit_every=10**9)
    table.env.set_mapsize(1 << 20)
    table.restore_key_group(1, [b"\x00\x00\x00\x01r\x00\x00", b"restored"], frozenset())
    for i in range(3000):  # several MB: the map grows while the transaction is open
        table.put(2, b"\x00\x00\x00\x02" + i.to_bytes(2, "big") + b"\x00\x00", b"v" * 1000)
    for i in range(0, 3000, 3):
        table.delete(2, b"\x00\x00\x00\x02" + i.to_bytes(2, "big") + b"\x00\x00")
    table.map_put(3, b"\x00\x01\x00\x01m\x00\x00", b"uk", b"1")
    table.map_put(3, b"\x00\x01\x00\x01m\x00\x00", b"uk", b"2")
    table.put_meta("checkpoint", b"7")
    table.commit()
    assert table.env.info()["map_size"] > 1 << 20, "the map grew"
    assert table.verify() is None
    table.close()
    reopened = LmdbTable(str(tmp_path / "t"))
    assert reopened.verify() is None
    reopened.put(2, b"\x00\x00\x00\x02\x00\x01\x00\x00", b"changed")
    reopened.commit()
    assert reopened.verify() is None
    reopened.close()
