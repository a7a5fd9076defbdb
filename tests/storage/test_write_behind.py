"""Local data files start their write-back as they grow: the bytes are the same, and the OS is asked to write
back every few megabytes as they are written (Linux), not all at once later. A checkpoint file leaves the page cache
a step behind its write-back, and a range read of one leaves it after the read; a table's file is read into it
ahead of a scan of the whole table."""

from __future__ import annotations

import os
import sys
import time

import pytest

from spate import page_cache, write_behind
from spate.fs import LocalStorage
from spate.write_behind import WriteBehindFile


def test_a_file_written_behind_holds_what_was_written_and_asks_for_write_back_as_it_grows(tmp_path):
    path = tmp_path / "f"
    parts = [bytes([i]) * 300_000 for i in range(10)]
    with WriteBehindFile(open(path, "xb", buffering=0), every=1 << 20) as out:
        for p in parts:
            out.write(p)
        assert out.written == 3_000_000 and out.started_up_to == 2_400_000  # after the 4th and the 8th part
    assert path.read_bytes() == b"".join(parts)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sync_file_range is Linux's")
def test_linux_has_the_call_and_local_storage_writes_through_it(tmp_path):
    assert write_behind.SYNC_FILE_RANGE is not None
    storage = LocalStorage(str(tmp_path))
    size = storage.write_parts("d/x.kg", (b"y" * (5 << 20) for _ in range(3)))
    assert size == 15 << 20 and (tmp_path / "d" / "x.kg").read_bytes() == b"y" * (15 << 20)
    with storage.open_new("d/z.kg") as out:
        assert isinstance(out, WriteBehindFile) and out._drop_behind, "a checkpoint file leaves the page cache"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sync_file_range is Linux's")
def test_a_checkpoint_file_leaves_the_page_cache_a_step_behind_its_write_back(tmp_path, monkeypatch):
    """A range is let go a step after its write-back was asked for, and again at the close (the OS keeps what is
    still being written back); what was never asked to be written back is not; without ``drop_behind`` (a table's
    own file) nothing is let go."""
    dropped: list[tuple[int, int]] = []
    monkeypatch.setattr(write_behind, "drop_cached", lambda fd, offset, length: dropped.append((offset, length)))
    for drop in (False, True):
        with WriteBehindFile(open(tmp_path / f"f{drop}", "xb", buffering=0), every=1 << 20, drop_behind=drop) as out:
            for _ in range(10):
                out.write(b"z" * 300_000)
        assert (tmp_path / f"f{drop}").read_bytes() == b"z" * 3_000_000
    # write-back asked for at 1.2 MB and 2.4 MB; at 2.4 MB the first 1.2 MB (asked for a step earlier) let go, and at
    # the close all whose write-back was asked for (a range still being written back at its step stayed then)
    assert dropped == [(0, 1_200_000), (0, 2_400_000)]


def test_a_file_is_read_ahead_into_the_page_cache_only_where_it_fits(tmp_path, monkeypatch):
    path = tmp_path / "data.mdb"
    path.write_bytes(b"q" * (page_cache.READ_AHEAD_CHUNK * 2 + 5))
    reads: list[int] = []
    preadv = page_cache.os.preadv

    def counted(fd, buffers, offset):
        n = preadv(fd, buffers, offset)
        reads.append(n)
        return n

    monkeypatch.setattr(page_cache.os, "preadv", counted)
    with page_cache.reading_ahead(str(path)) as reading:
        assert reading
        deadline = time.monotonic() + 30
        while sum(reads) < path.stat().st_size and time.monotonic() < deadline:
            time.sleep(0.01)
    assert sum(reads) == path.stat().st_size, "read to its end, once"
    monkeypatch.setattr(page_cache, "available_memory", lambda: path.stat().st_size - 1)
    with page_cache.reading_ahead(str(path)) as reading:
        assert not reading, "larger than the memory available: its first pages would be gone before the scan"
    with page_cache.reading_ahead(str(tmp_path / "missing")) as reading:
        assert not reading


def test_a_ranged_read_of_a_local_checkpoint_file_lets_go_of_the_pages_it_read(tmp_path, monkeypatch):
    """A checkpoint file is read once (a restore, a verification, the check of the state a restart carries on
    from): the range read leaves the page cache, where the table's pages are wanted; the bytes are the file's, and a
    read past the end or of a missing file fails as before."""
    from spate import local_file_io
    from spate.errors import CorruptFileError, MissingFileError

    dropped: list[tuple[int, int]] = []
    monkeypatch.setattr(local_file_io, "drop_cached", lambda fd, offset, length: dropped.append((offset, length)))
    storage = LocalStorage(str(tmp_path))
    data = bytes(range(256)) * 40_000
    storage.write("d/x.kg", data)
    assert storage.read_range("d/x.kg", 4096, 1_000_000) == data[4096:1_004_096]
    assert storage.read_range("d/x.kg", 0, 0) == b""
    assert dropped == [(4096, 1_000_000), (0, 0)]
    with pytest.raises(CorruptFileError, match="truncated"):
        storage.read_range("d/x.kg", len(data) - 10, 20)
    with pytest.raises(MissingFileError):
        storage.read_range("d/y.kg", 0, 10)
    assert storage.read("d/x.kg") == data
    dropped.clear()
    assert local_file_io.read_kept(storage.path("d/x.kg"), 4096, 1_000) == data[4096:5096]
    assert dropped == [], "a file read again soon (a restored table's base) keeps its pages"


def test_waiting_for_a_files_write_back_asks_the_os_to_write_the_range_and_wait_for_it(tmp_path, monkeypatch):
    """A background writer (a materialization's native file) waits for what it wrote a step earlier: the call
    writes the range back and waits before and after (sync_file_range's three flags), and a range of nothing is
    not asked for. The bytes are as written."""
    calls: list[tuple[int, int, int, int]] = []
    monkeypatch.setattr(write_behind, "SYNC_FILE_RANGE", lambda *args: calls.append(args) or 0)
    path = tmp_path / "f"
    path.write_bytes(b"w" * 100_000)
    fd = os.open(path, os.O_RDONLY)
    try:
        write_behind.wait_written_back(fd, 0)
        write_behind.wait_written_back(fd, 65_536)
    finally:
        os.close(fd)
    assert calls == [(fd, 0, 65_536, 1 | 2 | 4)]
    assert path.read_bytes() == b"w" * 100_000

