"""The messages of the driver/task protocol: a plan per subtask per checkpoint, and the subtask's ack.

Both travel as plain dicts (``to_dict``/``from_dict``) so any transport can carry them: direct calls in
the in-process runner, Arrow rows on Spark.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from spate.checkpoint.ackinfo import AckInfo
from spate.keygroups import key_group_range
from spate.segments import FileRef
from spate.sinks.table_sink import SinkFile
from spate.snapshot.handles import ChangeSetHandle, KeyedHandle, OperatorStateHandle, OperatorStatePiece, keyed_handle
from spate.snapshot.lineage import change_set_identity, changelog_digest
from spate.snapshot.outputs import OutputsHandle


@dataclass(frozen=True)
class RescaleSource:
    """An old subtask whose key groups a new subtask takes over at a rescale: its ``index`` at the base's
    parallelism, its key-group range ``[start, stop)``, the fingerprint of the lineage a local copy of its
    state at the base checkpoint carries (:meth:`spate.snapshot.lineage.Lineage.digest`), and how many new
    subtasks take over some of its key groups (``consumers``; one: its local copy may be moved, not copied)."""

    index: int
    start: int
    stop: int
    lineage: str
    consumers: int = 0

    @property
    def key_groups(self) -> range:
        return range(self.start, self.stop)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @staticmethod
    def from_dict(data: dict[str, Any]) -> RescaleSource:
        return RescaleSource(**data)


INLINE_CHANGE_SETS = 16  # a serialized plan lists at most this many change sets; a longer log is named


@dataclass(frozen=True)
class ChangelogRef:
    """A plan's log since the materialization named instead of listed: how many change sets, and the
    fingerprint of their identities (:func:`~spate.snapshot.lineage.changelog_digest`). A subtask whose live
    state has exactly this log needs nothing more; any other lists it from the base checkpoint's metadata
    first (:func:`spate.runtime.recovery.trust.listed`), so a serialized plan does not grow with the log."""

    length: int
    digest: str

    @staticmethod
    def of(changelog: list[ChangeSetHandle]) -> ChangelogRef:
        return ChangelogRef(len(changelog), changelog_digest(change_set_identity(h) for h in changelog))


@dataclass
class SubtaskPlan:
    """What subtask ``index`` of ``parallelism`` needs to take part in checkpoint ``checkpoint_id``.

    ``base_checkpoint_id`` is the checkpoint its state must reflect before processing: local state tagged
    with it is reused; otherwise the subtask restores ``keyed`` and ``operator`` from ``base_uri``.
    With file merging, ``open_files`` are the physical files workers may keep appending to, and
    ``non_reusable`` those whose live segments new checkpoints must re-write instead of referencing.
    When the base has another parallelism (``base_parallelism``), ``rescale_sources`` are the old subtasks
    whose key groups this subtask takes over, largest overlap first: local copies of their state may be used
    instead of reading checkpoint storage (:mod:`spate.runtime.rescale`). ``base_state_entries``: the state
    entries the base's subtask of exactly these key groups reported (None: another parallelism, or not known).
    """

    checkpoint_id: int
    index: int
    parallelism: int
    max_parallelism: int
    query_id: str
    epoch: int
    checkpoint_uri: str
    base_checkpoint_id: int | None = None
    base_uri: str | None = None
    base_is_savepoint: bool = False
    keyed: list[KeyedHandle] = field(default_factory=list)
    changelog: list[ChangeSetHandle] = field(default_factory=list)
    operator: list[OperatorStatePiece] = field(default_factory=list)
    processing_time_ms: int = 0
    watermark_ms: int | None = None
    late_watermark_ms: int | None = None  # the previous batch's watermark: rows at or below it are late (Spark)
    open_files: list[str] = field(default_factory=list)
    non_reusable: list[str] = field(default_factory=list)
    base_parallelism: int | None = None
    rescale_sources: list[RescaleSource] = field(default_factory=list)
    changelog_ref: ChangelogRef | None = None  # the log named, ``changelog`` empty (:meth:`compacted`)
    base_state_entries: int | None = None

    @property
    def key_groups(self) -> range:
        return key_group_range(self.max_parallelism, self.parallelism, self.index)

    @property
    def log_length(self) -> int:
        """Change sets in the base's log since the materialization, listed or named."""
        return self.changelog_ref.length if self.changelog_ref is not None else len(self.changelog)

    def compacted(self, inline: int | None = None) -> SubtaskPlan:
        """This plan for a transport that serializes it: a log of more than ``inline`` (default
        :data:`INLINE_CHANGE_SETS`) change sets named by a :class:`ChangelogRef` instead of listed, when the
        subtask can list it itself from the base's metadata (a checkpoint of this root, at this parallelism)."""
        limit = INLINE_CHANGE_SETS if inline is None else inline
        if (len(self.changelog) <= limit or self.base_checkpoint_id is None or self.base_is_savepoint
                or self.base_uri != self.checkpoint_uri or self.base_parallelism != self.parallelism):
            return self
        return dataclasses.replace(self, changelog=[], changelog_ref=ChangelogRef.of(self.changelog))

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["keyed"] = [h.to_dict() for h in self.keyed]
        d["changelog"] = [h.to_dict() for h in self.changelog]
        d["operator"] = [p.to_dict() for p in self.operator]
        d["rescale_sources"] = [s.to_dict() for s in self.rescale_sources]
        d["changelog_ref"] = dict(self.changelog_ref.__dict__) if self.changelog_ref is not None else None
        return d

    @staticmethod
    def from_dict(data: dict[str, Any]) -> SubtaskPlan:
        d = dict(data)
        d["keyed"] = [keyed_handle(h) for h in d["keyed"]]
        d["changelog"] = [ChangeSetHandle.from_dict(h) for h in d.get("changelog", [])]
        d["operator"] = [OperatorStatePiece.from_dict(p) for p in d["operator"]]
        d["rescale_sources"] = [RescaleSource.from_dict(s) for s in d.get("rescale_sources", [])]
        ref = d.get("changelog_ref")
        d["changelog_ref"] = ChangelogRef(**ref) if ref else None
        return SubtaskPlan(**d)


@dataclass
class SubtaskAck(AckInfo):
    """A subtask's part of checkpoint ``checkpoint_id``: its state handles, the physical files its worker
    wrote (``files``: path → [size, still open]; ``worker``: the worker's id with file merging), the data file it
    staged for a table sink (``sink_file``, the table's, not the checkpoint's), the typed
    facts of :class:`AckInfo` (``executor``: where the subtask ran and its state now lives; on Spark
    ``'<id>@<host>'``) and free-form ``stats``."""

    checkpoint_id: int
    index: int
    epoch: int
    keyed: list[KeyedHandle] = field(default_factory=list)
    changelog: list[ChangeSetHandle] = field(default_factory=list)
    operator: OperatorStateHandle | None = None
    outputs: OutputsHandle | None = None
    files: dict[str, list] = field(default_factory=dict)
    max_event_time_ms: int | None = None
    stats: dict[str, Any] = field(default_factory=dict)
    worker: str | None = None
    sink_file: SinkFile | None = None  # the data file it staged for a table sink (not a checkpoint file)

    def segments(self) -> list[FileRef]:
        """Every logical file this ack references."""
        refs: list[FileRef] = [h.segment for h in self.keyed]
        refs += [h.segment for h in self.changelog]
        refs += [h.segment for h in (self.operator, self.outputs) if h is not None]
        return refs

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["keyed"] = [h.to_dict() for h in self.keyed]
        d["changelog"] = [h.to_dict() for h in self.changelog]
        d["operator"] = self.operator.to_dict() if self.operator else None
        d["outputs"] = self.outputs.to_dict() if self.outputs else None
        d["sink_file"] = self.sink_file.to_dict() if self.sink_file else None
        return d

    @staticmethod
    def from_dict(data: dict[str, Any]) -> SubtaskAck:
        d = dict(data)
        d["keyed"] = [keyed_handle(h) for h in d["keyed"]]
        d["changelog"] = [ChangeSetHandle.from_dict(h) for h in d.get("changelog", [])]
        d["operator"] = OperatorStateHandle.from_dict(d["operator"]) if d["operator"] else None
        d["outputs"] = OutputsHandle.from_dict(d["outputs"]) if d.get("outputs") else None
        d["sink_file"] = SinkFile.from_dict(d["sink_file"]) if d.get("sink_file") else None
        return SubtaskAck(**d)
