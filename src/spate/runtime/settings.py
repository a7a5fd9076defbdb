"""The settings of a query, one object for every transport (``LocalRunner`` and the Spark stream): where and
how spate keeps its state, from arguments or a Spark-style conf (``spark.spate.*``)."""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from spate.changelog.state import ChangelogConfig
from spate.checkpoint.coordinator import DEFAULT_RETAINED, Coordinator
from spate.errors import InvalidParallelismError, SettingError
from spate.filemerging.config import FileMergingConfig, resolve_file_merging
from spate.runtime.subtask import TABLE_KINDS, SubtaskConfig
from spate.sinks.table_sink import TableSink

CONF_PREFIX = "spark.spate."


def _bool(text: str) -> bool:
    value = text.strip().lower()
    if value not in ("true", "false"):
        raise SettingError(f"expected true or false, got {text!r}: set it to true or false")
    return value == "true"


# Spark conf key (after ``spark.spate.``) → (field, parser)
_CONF: dict[str, tuple[str, Callable[[str], Any]]] = {
    "checkpointRoot": ("checkpoint_root", str),
    "parallelism": ("parallelism", int),
    "maxParallelism": ("max_parallelism", int),
    "table": ("table", str),
    "localDir": ("local_dir", str),
    "changelog": ("changelog", _bool),
    "fileMerging": ("file_merging", str),
    "retained": ("retained", int),
    "eventTimeColumn": ("event_time_column", str),
    "watermarkDelayMs": ("watermark_delay_ms", int),
    "allowPickle": ("allow_pickle", _bool),
    "restoreFrom": ("restore_from", str),
    "evictIdleAfterBatches": ("evict_idle_after_batches", int),
    "evictIdleAfterSeconds": ("evict_idle_after_s", float),
    "profile": ("profile", _bool),
    "stagedOutputs": ("staged_outputs", str),
}
STAGED_OUTPUTS = ("auto", "parquet", "arrow")


@dataclass(frozen=True)
class SpateSettings:
    """Where and how spate keeps a stream's state.

    Args:
        checkpoint_root: spate's checkpoint root (path or ``pyarrow.fs`` URI); Spark's own checkpoint is
            kept at ``<root>/_spark`` unless given (see ``StatefulStream.start``).
        parallelism: number of subtasks, independent of ``spark.sql.shuffle.partitions``; may change on every
            restart (up to the max parallelism).
        max_parallelism: number of key groups, fixed for the life of the root (default from the parallelism).
        table: live state on executors: ``"lmdb"`` (executor-local disk, reused across batches) or ``"heap"``.
        local_dir: executor-local directory for lmdb state (default: each executor's own Spark local dir,
            else its temp dir; see :func:`executor_local_dir`).
        changelog: incremental checkpoints (FLIP-158): ``True``/``False`` or a :class:`ChangelogConfig`.
        file_merging: ``"off"``, ``"within"``, ``"across"`` or a :class:`FileMergingConfig` (FLIP-306).
        retained: complete checkpoints kept.
        event_time_column / watermark_delay_ms: event time; watermark = max event time seen − delay.
        allow_pickle: allow pickled state values (only for trusted checkpoints).
        restore_from: a savepoint (or another root's checkpoint) to start from when the root has no checkpoint
            yet, at any parallelism.
        evict_idle_after_batches / evict_idle_after_s: a Python worker keeps the subtasks it ran open between
            batches, and closes one (its local copy stays on disk, for whichever worker runs it next) once the
            worker took part in this many batches (of any query) and this many seconds went by without it
            running the subtask: both, so that neither fast nor slow triggers close subtasks a worker still
            serves. An executor deletes a local copy of the query that no process holds open and none used for
            ``evict_idle_after_s`` (its subtask runs on another executor now). Defaults: 10 batches, 300 s.
        profile: also time the state table's reads and writes in every batch (each ack's ``profile`` statistics
            always hold the other phases: reading Arrow, grouping, processing, outputs, snapshot).
        staged_outputs: how a batch's outputs are staged for a function sink on Spark: ``"parquet"`` (a
            Parquet file per subtask, which the sink's DataFrame reads in the JVM, no Python worker),
            ``"arrow"`` (framed in the checkpoint's files, read back by Python tasks) or ``"auto"`` (Parquet
            where Spark reads the checkpoint root as it is: a local or mounted shared file system).

    Raises:
        SettingError: no ``checkpoint_root``, a setting of the wrong type, an unknown ``table`` or
            ``staged_outputs``, idle eviction limits out of range.
        InvalidParallelismError: ``parallelism`` below 1 (a :class:`SettingError` too).
    """

    checkpoint_root: str = ""
    parallelism: int = 2
    max_parallelism: int | None = None
    table: str = "lmdb"
    local_dir: str | None = None
    changelog: bool | ChangelogConfig = True
    file_merging: bool | str | FileMergingConfig = "across"
    retained: int = DEFAULT_RETAINED
    event_time_column: str | None = None
    watermark_delay_ms: int = 0
    allow_pickle: bool = False
    restore_from: str | None = None
    evict_idle_after_batches: int = 10
    evict_idle_after_s: float = 300.0
    profile: bool = False
    staged_outputs: str = "auto"

    def __post_init__(self) -> None:
        if not self.checkpoint_root:
            raise SettingError("a stateful stream needs checkpoint_root (or spark.spate.checkpointRoot): where spate "
                               "keeps its checkpoints")
        for name in ("parallelism", "max_parallelism", "retained", "watermark_delay_ms"):
            value = getattr(self, name)
            if value is None and name == "max_parallelism":
                continue
            if not isinstance(value, numbers.Integral) or isinstance(value, bool):
                fix = f"{name}={int(value)}" if isinstance(value, str) and value.strip().isdigit() else f"an int {name}"
                raise SettingError(f"{name} must be an int, got {value!r} ({type(value).__name__}): pass {fix}")
            object.__setattr__(self, name, int(value))  # numpy's ints too
        if self.parallelism < 1:
            raise InvalidParallelismError(f"parallelism must be >= 1, got {self.parallelism}: pass the number of "
                                          "subtasks as a positive int")
        if self.table not in TABLE_KINDS:
            raise SettingError(f"unknown state table {self.table!r}: use one of {TABLE_KINDS}")
        if self.staged_outputs not in STAGED_OUTPUTS:
            raise SettingError(f"unknown staged_outputs {self.staged_outputs!r}: use one of {STAGED_OUTPUTS}")
        if self.evict_idle_after_batches < 1 or self.evict_idle_after_s < 0:
            raise SettingError(f"evict_idle_after_batches must be >= 1 and evict_idle_after_s >= 0, got "
                               f"{self.evict_idle_after_batches} and {self.evict_idle_after_s}: use values in "
                               "those ranges (defaults: 10 batches, 300 s)")

    @staticmethod
    def from_conf(conf: Mapping[str, str], **overrides: Any) -> SpateSettings:
        """Settings from ``spark.spate.*`` entries of ``conf``; keyword arguments (not None) win.

        Raises:
            SettingError: an unknown ``spark.spate.*`` key, a value that does not parse (an int, true or false),
                or settings that cannot work together (see :class:`SpateSettings`).
        """
        values: dict[str, Any] = {}
        for key, text in conf.items():
            if not key.startswith(CONF_PREFIX):
                continue
            name = key[len(CONF_PREFIX):]
            if name not in _CONF:
                raise SettingError(f"unknown setting {key}; known: {sorted(CONF_PREFIX + k for k in _CONF)}")
            field, parse = _CONF[name]
            try:
                values[field] = parse(text)
            except ValueError as e:
                raise SettingError(f"{key}={text!r}: {e}") from e
        values.update({k: v for k, v in overrides.items() if v is not None})
        return SpateSettings(**values)

    def replace(self, **changes: Any) -> SpateSettings:
        return dataclasses.replace(self, **changes)

    @property
    def changelog_config(self) -> ChangelogConfig | None:
        return ChangelogConfig() if self.changelog is True else (self.changelog or None)

    @property
    def file_merging_config(self) -> FileMergingConfig | None:
        return resolve_file_merging(self.file_merging)

    def subtask_config(self, *, local_dir: str | None, stage_outputs: bool, output_schema: pa.Schema | None = None,
                       sticky: bool = True, table_sink: TableSink | None = None, staged_format: str = "arrow",
                       **in_process: Any) -> SubtaskConfig:
        """The settings of the query's subtasks on a worker, for every transport. ``local_dir``: where the
        worker keeps lmdb state (decided on the worker); ``stage_outputs``: whether a sink gets the outputs;
        ``sticky``: whether a subtask's next batch runs in this process; ``table_sink``: the query's opened
        :class:`~spate.sinks.table_sink.TableSink`, if its sink is one; ``staged_format``: how outputs are
        staged (``"arrow"`` or ``"parquet"``, resolved by the transport); ``in_process``: settings only the
        in-process runner has (``compress``, ``key_types``, ``output_serializer``)."""
        return SubtaskConfig(table=self.table, local_dir=local_dir, allow_pickle=self.allow_pickle,
                             event_time_column=self.event_time_column, stage_outputs=stage_outputs,
                             changelog=self.changelog_config, file_merging=self.file_merging_config,
                             output_schema=output_schema, sticky=sticky, profile=self.profile,
                             table_sink=table_sink, staged_format=staged_format, **in_process)

    def coordinator(self) -> Coordinator:
        """The query's coordinator (not started: ``start(parallelism)``) for these settings."""
        merging = self.file_merging_config
        return Coordinator(self.checkpoint_root, max_parallelism=self.max_parallelism,
                           retained=self.retained, restore_from=self.restore_from,
                           watermark_delay_ms=self.watermark_delay_ms if self.event_time_column else None,
                           max_space_amplification=merging.max_space_amplification if merging else 0)


__all__ = ["CONF_PREFIX", "SpateSettings"]
