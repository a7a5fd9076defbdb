"""Staged outputs as Parquet files of their own (format 6): what a function sink on Spark reads in the JVM.
The file is plain Parquet a reader other than spate opens, and spate still detects a corrupt or short one."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spate.errors import CorruptFileError
from spate.fs import CheckpointStorage
from spate.layout import STAGED_PARQUET_SUFFIX, is_spate_file, staged_dir
from spate.segments import WholeFileWriter
from spate.snapshot.outputs import PARQUET, read_outputs, read_outputs_table, write_outputs_parquet

SCHEMA = pa.schema([("user", pa.string()), ("clicks", pa.int64()), ("batch", pa.int64())])


def staged(tmp_path, rows):
    storage = CheckpointStorage(str(tmp_path))
    table = pa.Table.from_pylist(rows, schema=SCHEMA)
    handle = write_outputs_parquet(table, WholeFileWriter(storage, staged_dir(3), STAGED_PARQUET_SUFFIX, 3))
    return storage, table, handle


def test_a_parquet_file_of_its_own_that_other_readers_open(tmp_path):
    rows = [{"user": f"u{i}", "clicks": i * 3, "batch": 3} for i in range(500)]
    storage, table, handle = staged(tmp_path, rows)
    assert handle.serializer == PARQUET and handle.file_offset == 0 and handle.count == 500
    assert handle.path.startswith("staged/3/") and handle.path.endswith(".parquet") and is_spate_file(handle.path)
    assert handle.size == (tmp_path / handle.path).stat().st_size
    assert pq.read_table(tmp_path / handle.path).equals(table), "plain Parquet, no spate frame"
    assert read_outputs(storage, handle) == rows
    assert read_outputs_table(storage, handle, SCHEMA).equals(table)
    assert read_outputs(storage, handle, decode=False) == []  # verified only


def test_no_rows_no_file(tmp_path):
    storage, _, handle = staged(tmp_path, [])
    assert handle is None and not (tmp_path / "staged").exists()


def test_a_corrupt_or_short_file_is_named(tmp_path):
    rows = [{"user": f"user-{i:06d}", "clicks": i, "batch": 3} for i in range(2000)]
    storage, _, handle = staged(tmp_path, rows)
    path = tmp_path / handle.path
    data = bytearray(path.read_bytes())
    data[len(data) // 3] ^= 0xFF  # inside a data page: its checksum no longer matches
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptFileError, match=r"staged/3/.*\.parquet: staged outputs are not a readable Parquet"):
        read_outputs(storage, handle, decode=False)
    path.write_bytes(bytes(data[: len(data) // 2]))
    with pytest.raises(CorruptFileError, match=r"truncated"):
        read_outputs(storage, handle)


def test_the_row_count_is_checked(tmp_path):
    storage, _, handle = staged(tmp_path, [{"user": "a", "clicks": 1, "batch": 3}])
    with pytest.raises(CorruptFileError, match=r"1 staged rows, the checkpoint names 2"):
        read_outputs(storage, type(handle)(handle.path, handle.size, 2, PARQUET))
