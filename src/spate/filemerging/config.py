"""File-merging settings (Flink's ``execution.checkpointing.file-merging.*``)."""

from __future__ import annotations

from dataclasses import dataclass

from spate.errors import SettingError

MB = 1 << 20
WITHIN = "within"
ACROSS = "across"


@dataclass(frozen=True)
class FileMergingConfig:
    """How checkpoint files are merged into physical files.

    Args:
        mode: ``"within"`` merges the files of one checkpoint; ``"across"`` also appends later checkpoints'
            files to a physical file that is still open. On object stores a file becomes readable only when
            closed, so there every physical file is closed when its checkpoint is acknowledged and
            ``"across"`` behaves as ``"within"``.
        max_file_size: a physical file that reached this size takes no more segments.
        blocking_pool: one physical file per directory at a time, writers wait for it (fewest files);
            otherwise a writer that finds every file busy creates another (no waiting).
        max_space_amplification: when physical bytes exceed this factor times the bytes still referenced,
            the most wasteful files stop being reused and their live segments are re-written by the next
            checkpoints that need them, so the files can go. Below 1 turns space control off.
        rewrite_budget: bytes of such re-writes one subtask's snapshot does at most (beyond Flink), and of
            copies of segments restored from another subtask's directory after a rescale: the rest is named where
            it is and waits for later checkpoints, so a checkpoint never copies a large share of the state on its
            path.

    Raises:
        SettingError: an unknown ``mode``, a ``max_file_size`` below 1 or a negative ``rewrite_budget``.
    """

    mode: str = WITHIN
    max_file_size: int = 32 * MB
    blocking_pool: bool = False
    max_space_amplification: float = 2.0
    rewrite_budget: int = 16 * MB

    def __post_init__(self) -> None:
        if self.mode not in (WITHIN, ACROSS):
            raise SettingError(f"file-merging mode {self.mode!r} is unknown: use {WITHIN!r} or {ACROSS!r}")
        if self.max_file_size < 1:
            raise SettingError(f"max_file_size must be >= 1 byte, got {self.max_file_size}: pass a positive size "
                               f"(default {32 * MB})")
        if self.rewrite_budget < 0:
            raise SettingError(f"rewrite_budget must be >= 0 bytes, got {self.rewrite_budget}: pass 0 (no "
                               f"re-writes) or a positive budget (default {16 * MB})")

    @property
    def across(self) -> bool:
        return self.mode == ACROSS


def resolve_file_merging(setting: bool | str | FileMergingConfig | None) -> FileMergingConfig | None:
    """``True``/``"within"``/``"across"``/a config → a config; ``False``/``None``/``"off"`` → None.

    Raises:
        SettingError: any other value.
    """
    if setting is None or setting is False or setting == "off":
        return None
    if setting is True:
        return FileMergingConfig()
    if isinstance(setting, str):
        return FileMergingConfig(mode=setting)
    if isinstance(setting, FileMergingConfig):
        return setting
    raise SettingError(f"file_merging must be a bool, 'off', 'within', 'across' or a FileMergingConfig, "
                       f"got {setting!r}")
