"""Logical files and the writers that place them: a whole file each (merging off) or a segment of a pooled
physical file (merging on, :mod:`spate.filemerging.manager`). Every handle in a checkpoint points at a
:class:`FileRef`.

It sits just above :mod:`spate.fs`, below every layer that writes checkpoint files (snapshots, the changelog,
file merging, the coordinator), so none of them depends on a higher one to name a file."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from spate.errors import naming_disk_full
from spate.fs import CheckpointStorage
from spate.layout import data_file


@dataclass(frozen=True)
class FileRef:
    """A logical file: ``length`` bytes at ``offset`` of the physical file ``path`` (relative to the root).
    Its identity is its location: physical files are never overwritten, so a location is never reused."""

    path: str
    offset: int
    length: int

    @property
    def key(self) -> tuple[str, int]:
        return self.path, self.offset

    @property
    def end(self) -> int:
        return self.offset + self.length


class SegmentWriter(Protocol):
    """Writes logical files; ``discard`` gives up one that no checkpoint will reference. ``write_parts``
    writes one logical file from its parts as they come (a large snapshot is never whole in memory)."""

    def write(self, data: bytes) -> FileRef: ...

    def write_parts(self, parts: Iterable[bytes]) -> FileRef: ...

    def link_in(self, local_path: str) -> FileRef | None:
        """The finished local file ``local_path`` as a logical file with a physical file of its own, linked into
        place instead of copied; None where that cannot be done (then ``write_parts`` copies it)."""

    def discard(self, ref: FileRef) -> None: ...


class WholeFileWriter:
    """Merging off: every logical file is a physical file of its own, named at random in ``directory``;
    ``checkpoint_id`` (the checkpoint the files belong to) is named when the storage is full."""

    def __init__(self, storage: CheckpointStorage, directory: str, suffix: str,
                 checkpoint_id: int | None = None) -> None:
        self.storage, self.directory, self.suffix = storage, directory, suffix
        self.checkpoint_id = checkpoint_id

    def write(self, data: bytes) -> FileRef:
        path = data_file(self.directory, self.suffix)
        with naming_disk_full(self.storage.path(path), self.checkpoint_id):
            self.storage.write(path, data)
        return FileRef(path, 0, len(data))

    def write_parts(self, parts: Iterable[bytes]) -> FileRef:
        path = data_file(self.directory, self.suffix)
        try:
            with naming_disk_full(self.storage.path(path), self.checkpoint_id):
                size = self.storage.write_parts(path, parts)
        except FileExistsError:
            raise  # the name was taken: that file is not ours to delete
        except BaseException:
            with contextlib.suppress(OSError):  # the part written so far, under a new name of ours: no one's
                self.storage.delete(path)
            raise
        return FileRef(path, 0, size)

    def link_in(self, local_path: str) -> FileRef | None:
        path = data_file(self.directory, self.suffix)
        with naming_disk_full(self.storage.path(path), self.checkpoint_id):  # a new directory entry may not fit
            size = self.storage.link_in(path, local_path)
        return None if size is None else FileRef(path, 0, size)

    def discard(self, ref: FileRef) -> None:
        self.storage.delete(ref.path)
