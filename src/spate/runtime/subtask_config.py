"""The settings of a query's subtasks' state (:class:`SubtaskConfig`), and the check that a worker's services
were made for them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from spate.changelog.state import ChangelogConfig
from spate.errors import SettingError
from spate.filemerging.config import FileMergingConfig
from spate.runtime.rescale import FOLD_PER_BATCH
from spate.runtime.services import WorkerServices
from spate.serde import check_pickle_allowed
from spate.sinks.table_sink import TableSink

TABLE_KINDS = ("heap", "lmdb")
STAGED_FORMATS = ("arrow", "parquet")  # outputs staged framed (Arrow IPC or rows), or as Parquet files


@dataclass(frozen=True)
class SubtaskConfig:
    """Settings of a subtask's state (shared by every subtask of a query; a different setting is a new config,
    e.g. ``dataclasses.replace(config, sticky=False)``).

    Raises:
        SettingError: an unknown ``table`` or ``staged_format``, the lmdb table without ``local_dir``.
        SerializationError: pickle as the output serializer without ``allow_pickle``.
    """

    table: str = "heap"
    local_dir: str | None = None
    sticky: bool = True  # a subtask's next batch runs in this process (False on Spark: Python workers hop)
    allow_pickle: bool = False
    compress: bool = False
    key_types: Any = None
    event_time_column: str | None = None
    stage_outputs: bool = False
    staged_format: str = "arrow"  # "parquet": outputs of the output schema staged as Parquet files (Spark reads)
    table_sink: TableSink | None = None  # opened: outputs become its data files instead of staged outputs
    output_serializer: str = "msgpack"
    changelog: ChangelogConfig | None = None
    file_merging: FileMergingConfig | None = None
    output_schema: pa.Schema | None = None  # what the output rows must match (checked before each checkpoint)
    profile: bool = False  # time the state table's reads and writes (ack stats "profile": "table_ms")
    fold_per_batch: int = FOLD_PER_BATCH  # entries moved from a rescaled table's bases into it per batch
    # opt-in: an lmdb table this large (bytes in use) without TTL'd state is written, in full snapshots, as an lmdb
    # file of its own (spate.snapshot.native), restored at the same parallelism by copying the file; None (the
    # default): key-group frames. Off by default: at 10 GB its checkpoints took 143 s against 125 s and its rescaled
    # restores were slower, for a restore at the same parallelism of 14.5 s against 23.9 s (docs/benchmarks.md)
    native_snapshots_from_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.table not in TABLE_KINDS:
            raise SettingError(f"unknown state table {self.table!r}: use one of {TABLE_KINDS}")
        if self.staged_format not in STAGED_FORMATS:
            raise SettingError(f"unknown staged_format {self.staged_format!r}: use one of {STAGED_FORMATS}")
        if self.table == "lmdb" and not self.local_dir:
            raise SettingError("the lmdb table needs local_dir (a directory on local disk for live state): pass "
                               "local_dir, or table='heap'")
        check_pickle_allowed(self.output_serializer, self.allow_pickle, "output_serializer")


def check_services(config: SubtaskConfig, services: WorkerServices) -> None:
    """The services must have been made for ``config``: a scheduler iff the changelog is on, a file-merging
    manager iff merging is on."""
    for name, wanted, made in (("the changelog", config.changelog, services.scheduler),
                               ("file merging", config.file_merging, services.merging)):
        if (wanted is None) != (made is None):
            raise ValueError(f"the worker services of {services.uri} were made with {name} "
                             f"{'off' if made is None else 'on'}, the subtask has it "
                             f"{'off' if wanted is None else 'on'}")
