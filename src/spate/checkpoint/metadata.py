"""Checkpoint metadata (``chk-<n>/_metadata``) and the query file (``_query``)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from spate.checkpoint.ackinfo import ACK_INFO_FIELDS, AckInfo, ack_info_from_stats
from spate.checkpoint.changelists import ChangeListRef, expand
from spate.errors import CorruptFileError, MissingFileError
from spate.frames import FrameKind, frame, read_single_frame
from spate.fs import CheckpointStorage
from spate.layout import (
    DELIVERED_FILE,
    QUERY_FILE,
)
from spate.segments import FileRef
from spate.sinks.table_sink import SinkFile
from spate.snapshot.handles import ChangeSetHandle, KeyedHandle, OperatorStateHandle, keyed_handle
from spate.snapshot.outputs import OutputsHandle

# 2: handles may be segments of merged files (``file_offset``, ``file_size``); 3: typed per-subtask ack facts
# (``rows``, ``staged``, ``recovery``, ...) instead of statistics an older reader would misread; 4: a subtask's
# log since the materialization partly in change-set lists (``changelog_lists``) an older reader would not read;
# 5: a subtask's data file staged for a table sink (``sink_file``), which an older reader would not commit;
# 6: staged outputs as a Parquet file of their own (serializer ``"parquet"``), which an older reader cannot read;
# 7: key-group frames carry their key group's digest as a third field, which an older reader cannot unpack;
# 8: keyed handles may be native lmdb snapshots (``type: "lmdb_native"``), which an older reader takes for frames
METADATA_FORMAT_VERSION = 8


@dataclass
class SubtaskState(AckInfo):
    """The handles of one subtask in a checkpoint, the typed facts of its ack (:class:`AckInfo`) and its
    free-form statistics. ``changelog`` is the whole log since the materialization; its first handles are
    written down in ``changelog_lists`` (:mod:`spate.checkpoint.changelists`), the rest inline."""

    keyed: list[KeyedHandle] = field(default_factory=list)
    operator: OperatorStateHandle | None = None
    outputs: OutputsHandle | None = None
    stats: dict[str, Any] = field(default_factory=dict)
    changelog: list[ChangeSetHandle] = field(default_factory=list)
    changelog_lists: list[ChangeListRef] = field(default_factory=list)
    sink_file: SinkFile | None = None

    def to_dict(self) -> dict[str, Any]:
        listed = sum(r.count for r in self.changelog_lists)
        assert listed <= len(self.changelog), "the change-set lists of a subtask cover more than its log"
        return {"keyed": [h.to_dict() for h in self.keyed],
                "changelog": [h.to_dict() for h in self.changelog[listed:]],
                "changelog_lists": [r.to_dict() for r in self.changelog_lists],
                "operator": self.operator.to_dict() if self.operator else None,
                "outputs": self.outputs.to_dict() if self.outputs else None,
                **({"sink_file": self.sink_file.to_dict()} if self.sink_file else {}), **self.ack_info(),
                "stats": self.stats}

    @staticmethod
    def from_dict(data: dict[str, Any]) -> SubtaskState:
        """As written: ``changelog`` holds only the inline handles until :func:`read_metadata` reads the lists."""
        op, outputs = data.get("operator"), data.get("outputs")
        stats = dict(data.get("stats", {}))
        info = {n: data[n] for n in ACK_INFO_FIELDS if n in data} if "recovery" in data else \
            ack_info_from_stats(stats)  # metadata format < 3
        return SubtaskState([keyed_handle(h) for h in data["keyed"]],
                            OperatorStateHandle.from_dict(op) if op else None,
                            OutputsHandle.from_dict(outputs) if outputs else None, stats,
                            [ChangeSetHandle.from_dict(h) for h in data.get("changelog", [])],
                            [ChangeListRef.from_dict(r) for r in data.get("changelog_lists", [])],
                            SinkFile.from_dict(data["sink_file"]) if data.get("sink_file") else None, **info)


RESCALE_HISTORY = 20  # rescales a checkpoint's metadata carries forward from its base


@dataclass
class CheckpointMetadata:
    """Everything needed to restore a query from checkpoint ``checkpoint_id``."""

    checkpoint_id: int
    query_id: str
    epoch: int
    parallelism: int
    max_parallelism: int
    timestamp_ms: int
    subtasks: list[SubtaskState]
    max_event_time_ms: int | None = None
    watermark_ms: int | None = None
    is_savepoint: bool = False
    batch_watermark_ms: int | None = None  # the watermark this batch ran with (the next batch's late-row bound)
    format_version: int = METADATA_FORMAT_VERSION
    rescaled_from: int | None = None  # the base's parallelism, when this checkpoint's differs (a rescale)
    rescale_reason: str | None = None  # why (informational): "requested", an autoscaler's decision, ...
    rescales: list[dict[str, Any]] = field(default_factory=list)  # the latest RESCALE_HISTORY rescales, oldest first

    def segments(self) -> list[FileRef]:
        """Every logical file this checkpoint references (once each)."""
        refs: dict[tuple[str, int], FileRef] = {}
        for st in self.subtasks:
            for h in (*st.keyed, *st.changelog, *st.changelog_lists,
                      *(x for x in (st.operator, st.outputs) if x is not None)):
                ref = h.segment
                known = refs.get(ref.key)
                if known is None or known.length < ref.length:
                    refs[ref.key] = ref
        return list(refs.values())

    def files(self) -> dict[str, int]:
        """Every physical file this checkpoint references, with the end of the last byte it uses."""
        out: dict[str, int] = {}
        for ref in self.segments():
            out[ref.path] = max(out.get(ref.path, 0), ref.end)
        return out

    @property
    def state_bytes(self) -> int:
        """Bytes of every logical file referenced."""
        return sum(ref.length for ref in self.segments())

    def to_dict(self) -> dict[str, Any]:
        """The current format (``format_version`` is what was read; a re-written copy has the current one)."""
        return {"format_version": METADATA_FORMAT_VERSION, "checkpoint_id": self.checkpoint_id,
                "query_id": self.query_id, "epoch": self.epoch, "parallelism": self.parallelism,
                "max_parallelism": self.max_parallelism, "timestamp_ms": self.timestamp_ms,
                "max_event_time_ms": self.max_event_time_ms, "watermark_ms": self.watermark_ms,
                "batch_watermark_ms": self.batch_watermark_ms, "is_savepoint": self.is_savepoint,
                "rescaled_from": self.rescaled_from, "rescale_reason": self.rescale_reason,
                "rescales": self.rescales, "subtasks": [s.to_dict() for s in self.subtasks]}

    @staticmethod
    def from_dict(data: dict[str, Any]) -> CheckpointMetadata:
        return CheckpointMetadata(
            data["checkpoint_id"], data["query_id"], data["epoch"], data["parallelism"], data["max_parallelism"],
            data["timestamp_ms"], [SubtaskState.from_dict(s) for s in data["subtasks"]],
            data.get("max_event_time_ms"), data.get("watermark_ms"), data.get("is_savepoint", False),
            data.get("batch_watermark_ms"), data["format_version"], data.get("rescaled_from"),
            data.get("rescale_reason"), list(data.get("rescales", [])))

    def to_bytes(self) -> bytes:
        return frame(FrameKind.METADATA, json.dumps(self.to_dict(), separators=(",", ":")).encode())


def read_metadata(storage: CheckpointStorage, path: str) -> CheckpointMetadata:
    """Read and verify a metadata file; errors name the file."""
    where = storage.path(path)
    payload = read_single_frame(storage.read(path, "checkpoint metadata"), where, FrameKind.METADATA)
    try:
        data = json.loads(payload)
    except ValueError as e:
        raise CorruptFileError(f"{where}: metadata is not valid JSON ({e})") from e
    version = data.get("format_version", 0)
    if version > METADATA_FORMAT_VERSION:
        raise CorruptFileError(f"{where}: metadata format version {version} is newer than this spate "
                               f"supports ({METADATA_FORMAT_VERSION}); upgrade spate")
    try:
        meta = CheckpointMetadata.from_dict(data)
    except (KeyError, TypeError, ValueError) as e:
        raise CorruptFileError(f"{where}: metadata is missing or has malformed fields ({e!r})") from e
    for st in meta.subtasks:
        for ref in st.changelog_lists:
            _under_root(storage, ref.path, where)
        try:
            st.changelog = expand(storage, st.changelog_lists, st.changelog, f"listed by {where}")
        except MissingFileError as e:
            if not storage.exists(path):
                raise  # the checkpoint was subsumed while being read
            # never mistaken for a subsumed checkpoint: discovery would then resume from an older one
            raise CorruptFileError(f"{e}; the checkpoint cannot be read without it") from e
    for rel in meta.files():
        _under_root(storage, rel, where)
    return meta


def _under_root(storage: CheckpointStorage, rel: str, where: str) -> None:
    try:
        storage.path(rel)  # every referenced path must stay under the root
    except ValueError as e:
        raise CorruptFileError(f"{where}: {e}; refusing to read outside the checkpoint root") from e


@dataclass
class QueryInfo:
    """``_query``: identity of the query owning a checkpoint root, and the fencing epoch of its driver."""

    query_id: str
    max_parallelism: int
    epoch: int
    format_version: int = METADATA_FORMAT_VERSION

    def to_bytes(self) -> bytes:
        return frame(FrameKind.QUERY, json.dumps(self.__dict__).encode())

    @staticmethod
    def read(storage: CheckpointStorage) -> QueryInfo | None:
        if not storage.exists(QUERY_FILE):
            return None
        where = storage.path(QUERY_FILE)
        try:
            data = json.loads(read_single_frame(storage.read(QUERY_FILE), where, FrameKind.QUERY))
            info = QueryInfo(data["query_id"], data["max_parallelism"], data["epoch"], data["format_version"])
        except (KeyError, TypeError, ValueError) as e:
            raise CorruptFileError(f"{where}: query file is malformed ({e!r})") from e
        if info.format_version > METADATA_FORMAT_VERSION:
            raise CorruptFileError(f"{where}: format version {info.format_version} is newer than this spate "
                                   f"supports ({METADATA_FORMAT_VERSION}); upgrade spate")
        return info


def read_delivered(storage: CheckpointStorage, path: str = DELIVERED_FILE) -> int:
    """The newest checkpoint whose outputs the sink confirmed, from ``_delivered`` (or an older spate's
    per-checkpoint marker at ``path``); -1 when there is none or it is empty. Corruption names the file."""
    if not storage.exists(path):
        return -1
    where = storage.path(path)
    payload = read_single_frame(storage.read(path, "delivery marker"), where, FrameKind.DELIVERED)
    try:
        return int(payload.decode("ascii")) if payload else -1
    except ValueError as e:
        raise CorruptFileError(f"{where}: delivery marker holds {payload[:40]!r}, not a checkpoint id") from e
