"""Local data files start their write-back as they grow: the bytes are the same, and the OS is asked to write
back every few megabytes as they are written (Linux), not all at once later."""

from __future__ import annotations

import sys

import pytest

from spate import write_behind
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
        assert isinstance(out, WriteBehindFile)
