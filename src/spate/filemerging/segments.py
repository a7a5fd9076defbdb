"""Logical files and the writers that place them: a whole file each (merging off) or a segment of a pooled
physical file (merging on). Every handle in a checkpoint points at a :class:`FileRef`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from spate.fs import CheckpointStorage, random_name


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
    """Writes logical files; ``discard`` gives up one that no checkpoint will reference."""

    def write(self, data: bytes) -> FileRef: ...

    def discard(self, ref: FileRef) -> None: ...


class WholeFileWriter:
    """Merging off: every logical file is a physical file of its own, named at random in ``directory``."""

    def __init__(self, storage: CheckpointStorage, directory: str, suffix: str) -> None:
        self.storage, self.directory, self.suffix = storage, directory, suffix

    def write(self, data: bytes) -> FileRef:
        path = f"{self.directory}/{random_name(self.suffix)}"
        self.storage.write(path, data)
        return FileRef(path, 0, len(data))

    def discard(self, ref: FileRef) -> None:
        self.storage.delete(ref.path)
