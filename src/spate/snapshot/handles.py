"""State handles: what a checkpoint records about the files holding a subtask's state.

Paths are relative to the checkpoint root (or savepoint directory) the metadata lives in. A handle's file is
a logical file: ``file_offset`` is where it starts in the physical file ``path`` (0 without file merging), and
every other offset in the handle is relative to that start.
"""

from __future__ import annotations

import functools
from collections.abc import Collection
from dataclasses import dataclass, field, replace
from typing import Any

from spate.segments import FileRef


class _KeyGroupIndexed:
    """Shared by handles whose file has one frame per key group, located by ``offsets``."""

    offsets: dict[int, tuple[int, int]]

    def span(self) -> tuple[int, int]:
        """(offset, length) of the contiguous byte range holding every key group of this handle."""
        return offsets_span(self.offsets)

    @property
    def state_bytes(self) -> int:
        return sum(length for _, length in self.offsets.values())

    def to_dict(self) -> dict[str, Any]:
        return self._dict

    @functools.cached_property
    def _dict(self) -> dict[str, Any]:
        # handles are immutable and re-sent with every checkpoint: encode once; the offsets as tuples, which
        # cyclic GC stops tracking, so a long log's cached encodings do not lengthen every GC pass
        return self._encode()

    def _encode(self) -> dict[str, Any]:
        raise TypeError(f"{type(self).__name__} must define _encode")


@dataclass(frozen=True)
class KeyGroupsHandle(_KeyGroupIndexed):
    """A full keyed-state snapshot file: one frame per non-empty key group, ``offsets[kg] = (offset, length)``.

    ``start``..``end`` (inclusive) is the key-group range the handle covers; a handle intersected with a
    smaller range keeps only the offsets inside it, so a reader fetches just that span of the file.
    """

    path: str
    start: int
    end: int
    offsets: dict[int, tuple[int, int]]
    size: int
    states: tuple[dict[str, Any], ...] = ()
    file_offset: int = 0

    @property
    def segment(self) -> FileRef:
        return FileRef(self.path, self.file_offset, self.size)

    def relocated(self, ref: FileRef, rebase: int) -> KeyGroupsHandle:
        """This handle's key groups copied to ``ref``, where they start ``rebase`` bytes earlier."""
        return KeyGroupsHandle(ref.path, self.start, self.end, rebased(self.offsets, rebase), ref.length, self.states,
                               ref.offset)

    def intersect(self, key_groups: range) -> KeyGroupsHandle | None:
        """The part of this handle inside ``key_groups`` (None if it holds no data there)."""
        start, end = max(self.start, key_groups.start), min(self.end, key_groups.stop - 1)
        offsets = offsets_within(self.offsets, start, end)
        if not offsets:
            return None
        if start == self.start and end == self.end:
            return self
        return KeyGroupsHandle(self.path, start, end, offsets, self.size, self.states, self.file_offset)

    def _encode(self) -> dict[str, Any]:
        return {"type": "key_groups", "path": self.path, "start": self.start, "end": self.end,
                "offsets": [(kg, o, n) for kg, (o, n) in sorted(self.offsets.items())], "size": self.size,
                "states": list(self.states), **_at(self.file_offset)}

    @staticmethod
    def from_dict(data: dict[str, Any]) -> KeyGroupsHandle:
        return KeyGroupsHandle(data["path"], data["start"], data["end"],
                               {kg: (o, n) for kg, o, n in data["offsets"]}, data["size"],
                               tuple(data.get("states", ())), data.get("file_offset", 0))


@dataclass(frozen=True)
class NativeSnapshotHandle:
    """A native snapshot of an lmdb table: a compacted copy of the table's environment (its ``data.mdb``, as
    lmdb's ``mdb_env_copy`` writes it), taken at one read transaction, ``size`` bytes whose CRC-32 is ``crc``.

    ``table_start``..``table_end`` (inclusive) is the key-group range of the table it copies, ``groups`` its
    key groups that hold data; ``start``..``end`` the range the handle stands for (an intersection narrows it, the
    file stays whole). ``digest`` is the table digest the copy holds
    (:mod:`spate.state.lmdb_digest`). Restored as a whole file when the range is the table's, else read key group
    by key group."""

    path: str
    start: int
    end: int
    table_start: int
    table_end: int
    groups: tuple[int, ...]
    size: int
    crc: int
    digest: int | None = None
    states: tuple[dict[str, Any], ...] = ()
    file_offset: int = 0

    @property
    def segment(self) -> FileRef:
        return FileRef(self.path, self.file_offset, self.size)

    @property
    def state_bytes(self) -> int:
        return self.size

    @property
    def held(self) -> tuple[int, ...]:
        """The key groups with data in the handle's range."""
        return tuple(kg for kg in self.groups if self.start <= kg <= self.end)

    @property
    def whole(self) -> bool:
        """Whether the handle stands for the whole table it copies."""
        return (self.start, self.end) == (self.table_start, self.table_end)

    def span(self) -> tuple[int, int]:
        return 0, self.size

    def relocated(self, ref: FileRef, rebase: int = 0) -> NativeSnapshotHandle:
        """This handle's file copied to ``ref`` (a whole file: ``rebase`` is 0)."""
        return replace(self, path=ref.path, file_offset=ref.offset)

    def intersect(self, key_groups: range) -> NativeSnapshotHandle | None:
        """The part of this handle inside ``key_groups`` (None if it holds no data there)."""
        start, end = max(self.start, key_groups.start), min(self.end, key_groups.stop - 1)
        if not any(start <= kg <= end for kg in self.groups):
            return None
        return self if (start, end) == (self.start, self.end) else replace(self, start=start, end=end)

    def to_dict(self) -> dict[str, Any]:
        return {"type": NATIVE_LMDB, "path": self.path, "start": self.start, "end": self.end,
                "table": [self.table_start, self.table_end], "groups": list(self.groups), "size": self.size,
                "crc": self.crc, "digest": self.digest, "states": list(self.states), **_at(self.file_offset)}

    @staticmethod
    def from_dict(data: dict[str, Any]) -> NativeSnapshotHandle:
        table_start, table_end = data["table"]
        return NativeSnapshotHandle(data["path"], data["start"], data["end"], table_start, table_end,
                                    tuple(data["groups"]), data["size"], data["crc"], data.get("digest"),
                                    tuple(data.get("states", ())), data.get("file_offset", 0))


NATIVE_LMDB = "lmdb_native"
KeyedHandle = KeyGroupsHandle | NativeSnapshotHandle  # a keyed snapshot: spate's key-group frames, or lmdb's own file


def keyed_handle(data: dict[str, Any]) -> KeyedHandle:
    """A keyed-snapshot handle from its dict (:meth:`KeyGroupsHandle.to_dict`, :meth:`NativeSnapshotHandle.to_dict`)."""
    if data.get("type") == NATIVE_LMDB:
        return NativeSnapshotHandle.from_dict(data)
    return KeyGroupsHandle.from_dict(data)


def held_key_groups(handle: KeyedHandle) -> Collection[int]:
    """The key groups with data in a keyed handle."""
    return handle.held if isinstance(handle, NativeSnapshotHandle) else handle.offsets.keys()


def _at(file_offset: int) -> dict[str, int]:
    """The ``file_offset`` field, written only for segments of merged files."""
    return {"file_offset": file_offset} if file_offset else {}


def rebased(offsets: dict[int, tuple[int, int]], by: int) -> dict[int, tuple[int, int]]:
    return {kg: (o - by, n) for kg, (o, n) in offsets.items()}


def offsets_within(offsets: dict[int, tuple[int, int]], start: int, end: int) -> dict[int, tuple[int, int]]:
    return {kg: o for kg, o in offsets.items() if start <= kg <= end}


def offsets_span(offsets: dict[int, tuple[int, int]]) -> tuple[int, int]:
    first, last = offsets[min(offsets)], offsets[max(offsets)]
    return first[0], last[0] + last[1] - first[0]


@dataclass(frozen=True)
class ChangeSetHandle(_KeyGroupIndexed):
    """One uploaded change set (sequence number ``sqn`` of log ``log_id``) inside a change file: one frame
    per key group, ``offsets[kg] = (offset, length)``, contiguous in the file."""

    path: str
    log_id: str
    sqn: int
    offsets: dict[int, tuple[int, int]]
    states: tuple[dict[str, Any], ...] = ()
    file_offset: int = 0
    file_size: int = 0  # of the whole change file (one upload, shared by the logs in it); 0 = not recorded

    @property
    def segment(self) -> FileRef:
        return FileRef(self.path, self.file_offset, self.file_size or max(o + n for o, n in self.offsets.values()))

    def relocated(self, ref: FileRef, rebase: int) -> ChangeSetHandle:
        return ChangeSetHandle(ref.path, self.log_id, self.sqn, rebased(self.offsets, rebase), self.states,
                               ref.offset, ref.length)

    def intersect(self, key_groups: range) -> ChangeSetHandle | None:
        offsets = offsets_within(self.offsets, key_groups.start, key_groups.stop - 1)
        if not offsets:
            return None
        if len(offsets) == len(self.offsets):
            return self
        return ChangeSetHandle(self.path, self.log_id, self.sqn, offsets, self.states, self.file_offset,
                               self.file_size)

    def with_states(self, states: tuple[dict[str, Any], ...]) -> ChangeSetHandle:
        return ChangeSetHandle(self.path, self.log_id, self.sqn, self.offsets, states, self.file_offset,
                               self.file_size)

    def _encode(self) -> dict[str, Any]:
        return {"path": self.path, "log": self.log_id, "sqn": self.sqn,
                "offsets": [(kg, o, n) for kg, (o, n) in sorted(self.offsets.items())], "states": list(self.states),
                **_at(self.file_offset), **({"file_size": self.file_size} if self.file_size else {})}

    @staticmethod
    def from_dict(data: dict[str, Any]) -> ChangeSetHandle:
        return ChangeSetHandle(data["path"], data["log"], data["sqn"], {kg: (o, n) for kg, o, n in data["offsets"]},
                               tuple(data.get("states", ())), data.get("file_offset", 0), data.get("file_size", 0))


@dataclass(frozen=True)
class OperatorStateEntry:
    """Where one operator state's elements are in an operator-state file."""

    mode: str
    serializer: str
    offset: int
    length: int
    count: int


@dataclass(frozen=True)
class OperatorStateHandle:
    """An operator-state file of one subtask: one frame per state name."""

    path: str
    size: int
    states: dict[str, OperatorStateEntry] = field(default_factory=dict)
    file_offset: int = 0

    @property
    def segment(self) -> FileRef:
        return FileRef(self.path, self.file_offset, self.size)

    def piece(self, name: str) -> OperatorStatePiece:
        """All elements of state ``name`` in this file."""
        e = self.states[name]
        return OperatorStatePiece(self.path, name, e.mode, e.serializer, self.file_offset + e.offset, e.length, 0,
                                  e.count)

    def to_dict(self) -> dict[str, Any]:
        return {"type": "operator", "path": self.path, "size": self.size,
                "states": {n: [e.mode, e.serializer, e.offset, e.length, e.count]
                           for n, e in sorted(self.states.items())}, **_at(self.file_offset)}

    @staticmethod
    def from_dict(data: dict[str, Any]) -> OperatorStateHandle:
        return OperatorStateHandle(data["path"], data["size"],
                                   {n: OperatorStateEntry(*v) for n, v in data["states"].items()},
                                   data.get("file_offset", 0))


@dataclass(frozen=True)
class OperatorStatePiece:
    """Elements ``start``..``stop`` (exclusive) of one state in one operator-state file: the unit the
    coordinator hands to a subtask on restore. ``offset`` is in the physical file."""

    path: str
    name: str
    mode: str
    serializer: str
    offset: int
    length: int
    start: int
    stop: int

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "name": self.name, "mode": self.mode, "serializer": self.serializer,
                "offset": self.offset, "length": self.length, "start": self.start, "stop": self.stop}

    @staticmethod
    def from_dict(data: dict[str, Any]) -> OperatorStatePiece:
        return OperatorStatePiece(**data)
