"""Checkpoints on S3 paths, against a real S3-compatible server on loopback (moto_server: the ``s3_uri``
fixture of helpers.s3)."""

from __future__ import annotations

import pytest

from helpers.counting import COUNT, Count, batches, expected_counts
from helpers.s3 import s3_requests
from spate import CheckpointStorage, LocalRunner, keyed_state_entries, load_checkpoint, verify_checkpoint
from spate.changelog import restore
from spate.changelog.state import ChangelogConfig
from spate.changelog.upload import UploadConfig
from spate.checkpoint.coordinator import list_complete_checkpoints
from spate.errors import MissingFileError
from spate.open_files import OpenFiles
from spate.snapshot.handles import NativeSnapshotHandle
from spate.snapshot.verify import VerifiedSpans, verify_handles
from spate.state.heap import HeapTable
from spate.state.keyed import KeyedStateBackend
from spate_tools.cli import main


def test_checkpoints_restore_rescale_and_savepoint_on_s3(s3_uri, tmp_path):
    root = s3_uri("query-1")
    src = batches(6)
    with LocalRunner(Count, key="k", checkpoint_root=root, parallelism=2, retained=2) as r:
        r.run(src, until=3)
        savepoint = r.savepoint()
    with LocalRunner(Count, key="k", checkpoint_root=root, parallelism=3, retained=2) as r:
        assert r.next_batch_id == 3
        r.run(src)
    storage = CheckpointStorage(root)
    assert list_complete_checkpoints(storage) == [4, 5]
    meta = load_checkpoint(storage)
    assert verify_checkpoint(storage, meta) == []
    assert {e.key: e.value for e in keyed_state_entries(storage, meta, "count")} == expected_counts(src)
    assert main(["checkpoints", "verify", root]) == 0

    restored_root = s3_uri("query-2")
    with LocalRunner(Count, key="k", checkpoint_root=restored_root, parallelism=1, restore_from=savepoint) as r:
        r.run(src)
    s2 = CheckpointStorage(restored_root)
    got = {e.key: e.value for e in keyed_state_entries(s2, load_checkpoint(s2), "count")}
    assert got == expected_counts(src)


@pytest.mark.parametrize("mode", ["within", "across"])
def test_file_merging_on_s3(s3_uri, mode):
    """On an object store a physical file is readable once closed, so files close at every acknowledgement;
    merging still turns each checkpoint's many files into a few, and restores and rescales work."""
    root = s3_uri(f"merged-{mode}")
    src = batches(6)
    with LocalRunner(Count, key="k", checkpoint_root=root, parallelism=3, file_merging=mode, changelog=True,
                     sink=lambda rows, b: None) as r:
        r.run(src, until=3)
    with LocalRunner(Count, key="k", checkpoint_root=root, parallelism=2, file_merging=mode) as r:
        r.run(src)
    storage = CheckpointStorage(root)
    meta = load_checkpoint(storage)
    assert verify_checkpoint(storage, meta) == []
    assert {e.key: e.value for e in keyed_state_entries(storage, meta, "count")} == expected_counts(src)
    assert len(meta.files()) < len(meta.segments()), "segments share physical files"


@pytest.mark.parametrize("mode", [False, "across"])
def test_native_materializations_on_s3(s3_uri, tmp_path, mode):
    """With an object store a native snapshot is downloaded to become a restored table's base (there is no file
    to link), its CRC-32 checked as it comes; verify reads it, a restart at another parallelism reads it key group
    by key group, and a savepoint re-writes it as key-group frames."""
    root = s3_uri(f"native-{mode}")
    src = batches(10)
    config = ChangelogConfig(materialize_after_change_sets=2, materialize_in_process_from_bytes=0,
                             upload=UploadConfig(persist_delay_s=0.0))

    def run(parallelism: int, local: str, until: int) -> None:
        with LocalRunner(Count, key="k", checkpoint_root=root, parallelism=parallelism, table="lmdb",
                         local_dir=str(tmp_path / local), file_merging=mode, changelog=config) as r:
            for n in range(r.next_batch_id, until):
                r.run_batch(n, src[n])
                for sub in r.subtasks:
                    sub.clog.wait_for_materialization()

    run(2, "l1", 4)
    storage = CheckpointStorage(root)
    keyed = [h for st in load_checkpoint(storage).subtasks for h in st.keyed]
    assert keyed and all(isinstance(h, NativeSnapshotHandle) for h in keyed)
    run(2, "l2", 6)  # the same key groups: each file downloaded as a base
    run(3, "l3", 8)  # a rescale
    run(1, "l4", 10)
    meta = load_checkpoint(storage)
    assert verify_checkpoint(storage, meta) == []
    assert main(["checkpoints", "verify", root]) == 0
    assert {e.key: e.value for e in keyed_state_entries(storage, meta, "count")} == expected_counts(src)
    with LocalRunner(Count, key="k", checkpoint_root=root, parallelism=1) as r:
        savepoint = r.savepoint()
    saved = load_checkpoint(CheckpointStorage(savepoint))
    assert all(not isinstance(h, NativeSnapshotHandle) for st in saved.subtasks for h in st.keyed)


def test_a_restore_opens_each_file_it_reads_once_on_s3(s3_uri, monkeypatch):
    """Opening an S3 object for ranged reads is a HEAD request of its own; a restore reads many ranges of a few
    files (a long log is restored in parts, each reading its key groups of every change set), so it opens each
    file once and makes one GET per read."""
    root = s3_uri("open-once")
    src = batches(8)
    with LocalRunner(Count, key="k", checkpoint_root=root, parallelism=2, changelog=True) as r:
        r.run(src)
    storage = CheckpointStorage(root)
    meta = load_checkpoint(storage)
    keyed = [h for st in meta.subtasks for h in st.keyed]
    changelog = [h for st in meta.subtasks for h in st.changelog]
    files = {h.path for h in keyed + changelog}
    monkeypatch.setattr(restore, "PART_LOG_BYTES", 1)  # this small log restored in parts, as a long one is
    monkeypatch.setattr(restore, "MIN_READ_BYTES", 1)
    backend = KeyedStateBackend(HeapTable(), meta.max_parallelism, range(meta.max_parallelism))
    with s3_requests() as requests:
        restore.restore_keyed_state(backend, storage, keyed, changelog, "the test")
    assert requests["GET"] > len(files), "the restore reads several ranges of one file"
    assert requests["HEAD"] == len(files)
    count, restored = backend.get_state(COUNT), {}
    for key in expected_counts(src):
        backend.set_current_key(key)
        restored[key] = count.value()
    assert restored == expected_counts(src)


def test_verifying_a_checkpoint_opens_each_file_once_on_s3(s3_uri):
    """`spate checkpoints verify` and a worker's check of the segments reused local state references read every
    handle's frames; the handles share a few files, each opened (a HEAD) once."""
    root = s3_uri("verify-once")
    with LocalRunner(Count, key="k", checkpoint_root=root, parallelism=3, changelog=True,
                     file_merging="across") as r:
        r.run(batches(6))
    storage = CheckpointStorage(root)
    meta = load_checkpoint(storage)
    handles = [h for st in meta.subtasks for h in [*st.keyed, *st.changelog]]
    files = {h.path for h in handles}
    assert len(handles) > len(files), "handles share files"
    with s3_requests() as requests:
        assert verify_handles(storage, handles, VerifiedSpans()) == []
    assert requests["HEAD"] == len(files)
    with s3_requests() as requests:
        assert verify_checkpoint(storage, meta) == []
    assert requests["HEAD"] == len(meta.files()), "one open per file, which also tells its size"
    gone = sorted(files)[0]
    assert storage.delete(gone)
    problems = verify_checkpoint(storage, meta)
    assert problems and all(gone in p for p in problems), "a missing file is reported, by name"
    assert "missing" in problems[0].lower() or "not found" in problems[0].lower(), problems[0]


def test_a_file_removed_after_a_restore_opened_it_is_reported_missing_on_s3(s3_uri):
    storage = CheckpointStorage(s3_uri("gone"))
    storage.write("shared/0123456789abcdef0123456789abcdef.seg", b"x" * 100)
    with OpenFiles(storage) as files:
        assert files.read_range("shared/0123456789abcdef0123456789abcdef.seg", 10, 5) == b"xxxxx"
        assert storage.delete("shared/0123456789abcdef0123456789abcdef.seg")
        with pytest.raises(MissingFileError, match="the test"):
            files.read_range("shared/0123456789abcdef0123456789abcdef.seg", 10, 5, "the test")


def test_take_over_and_metadata_are_conditional_writes_on_s3(s3_uri):
    """Put-if-absent on S3 is a conditional PUT (If-None-Match), so two drivers that read the same epoch
    cannot both claim it, and a checkpoint's metadata cannot be written twice."""
    from spate import Coordinator, FencedError
    from spate.checkpoint.epochs import EpochLog
    from spate.checkpoint.metadata import QueryInfo

    root = s3_uri("race")
    with LocalRunner(Count, key="k", checkpoint_root=root, parallelism=2) as r:
        r.run(batches(2))
    storage = CheckpointStorage(root)
    stale, stale_query = EpochLog(storage).read(), QueryInfo.read(storage)
    first, second = Coordinator(root), Coordinator(root)
    first.start(2)
    second.epochs.read = lambda: stale
    second.take_over._query_file = lambda savepoint, *settings: stale_query
    with pytest.raises(FencedError, match="same time"):
        second.start(2)
    with pytest.raises(FileExistsError):
        storage.create_exclusive("chk-1/_metadata", b"a second commit")
    assert list_complete_checkpoints(storage) == [0, 1] and load_checkpoint(storage).checkpoint_id == 1


def test_conditional_writes_use_the_uris_credentials_and_options():
    from spate.objectstore import _client_options

    opts = dict(_client_options("s3://AK%2F1:S%40K@bkt/q?endpoint_override=127.0.0.1:9&scheme=http&region=r"))
    assert opts == {"access_key": "AK/1", "secret_key": "S@K", "endpoint_override": "127.0.0.1:9", "scheme": "http",
                    "region": "r"}
