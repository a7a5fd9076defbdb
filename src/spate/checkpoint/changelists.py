"""Change-set lists: how a checkpoint's metadata stays the same size however long the log since the last
materialization grows.

A subtask's keyed state with the changelog on is its materialized snapshot plus every change set logged since;
listing them all in each checkpoint's ``_metadata`` would make every checkpoint's commit (encode, write) grow
with the log. Instead the coordinator moves the log's older part into *change-set lists*: immutable files
(``shared/changelog/<hex>.cll``) holding handles, which the metadata references in order before the handles it
lists inline. Lists are kept like a binary counter: a list is written once ``INLINE_CHANGE_SETS`` handles are
inline, two lists of the same length are merged into one, so a subtask references at most about
log2(log length / ``INLINE_CHANGE_SETS``) lists plus fewer than ``INLINE_CHANGE_SETS`` inline handles, and each
handle is re-written O(log) times in all. A checkpoint whose subtask's log starts with the base's lists (the
same handles in the same order) references them again; anything else (a rescale, a materialization, a moved
change set) writes new lists. Lists are shared files like any other: the registry deletes them when no retained
checkpoint references them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from spate.errors import CorruptFileError
from spate.frames import FrameKind, frame, read_single_frame
from spate.fs import CheckpointStorage
from spate.layout import change_list_file
from spate.segments import FileRef
from spate.snapshot.handles import ChangeSetHandle

INLINE_CHANGE_SETS = 16  # a subtask's metadata lists fewer inline handles than this


@dataclass(frozen=True)
class ChangeListRef:
    """A change-set list file: ``count`` handles in ``size`` bytes at ``path`` (relative to the root)."""

    path: str
    count: int
    size: int

    @property
    def segment(self) -> FileRef:
        return FileRef(self.path, 0, self.size)

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "count": self.count, "size": self.size}

    @staticmethod
    def from_dict(data: dict[str, Any]) -> ChangeListRef:
        return ChangeListRef(data["path"], data["count"], data["size"])


def encode_change_list(handles: list[ChangeSetHandle]) -> bytes:
    return frame(FrameKind.CHANGE_LIST, json.dumps([h.to_dict() for h in handles], separators=(",", ":")).encode())


def write_change_list(storage: CheckpointStorage, handles: list[ChangeSetHandle]) -> ChangeListRef:
    data = encode_change_list(handles)
    path = change_list_file()
    storage.create_exclusive(path, data)
    return ChangeListRef(path, len(handles), len(data))


def read_change_list(storage: CheckpointStorage, ref: ChangeListRef, context: str) -> list[ChangeSetHandle]:
    """The handles of list ``ref``, verified (checksum, count); errors name the file and ``context``."""
    where = f"{storage.path(ref.path)} ({context})"
    payload = read_single_frame(storage.read(ref.path, context), where, FrameKind.CHANGE_LIST)
    try:
        handles = [ChangeSetHandle.from_dict(d) for d in json.loads(payload)]
    except (KeyError, TypeError, ValueError) as e:
        raise CorruptFileError(f"{where}: change-set list is malformed ({e!r})") from e
    if len(handles) != ref.count:
        raise CorruptFileError(f"{where}: change-set list holds {len(handles)} handles, the metadata says "
                               f"{ref.count}")
    return handles


def _same(a: list[ChangeSetHandle], b: list[ChangeSetHandle]) -> bool:
    return len(a) == len(b) and all(x is y or x == y for x, y in zip(a, b, strict=True))


def reused_lists(log: list[ChangeSetHandle], base_lists: list[ChangeListRef],
                 base_log: list[ChangeSetHandle]) -> list[ChangeListRef]:
    """The longest prefix of the base's lists (over ``base_log``) that ``log`` starts with."""
    kept, at = [], 0
    for ref in base_lists:
        if not _same(log[at:at + ref.count], base_log[at:at + ref.count]):
            break
        kept.append(ref)
        at += ref.count
    return kept


def extend_lists(storage: CheckpointStorage, log: list[ChangeSetHandle],
                 lists: list[ChangeListRef]) -> list[ChangeListRef]:
    """``lists`` (a prefix of ``log``) extended so that fewer than ``INLINE_CHANGE_SETS`` handles stay inline,
    merging the last two lists while they are of the same length. Only the lists that remain are written."""
    plan: list[tuple[int, ChangeListRef | None]] = [(r.count, r) for r in lists]  # None: to be written
    at = sum(r.count for r in lists)
    while len(log) - at >= INLINE_CHANGE_SETS:
        plan.append((INLINE_CHANGE_SETS, None))
        at += INLINE_CHANGE_SETS
        while len(plan) >= 2 and plan[-1][0] == plan[-2][0]:
            plan[-2:] = [(plan[-2][0] + plan[-1][0], None)]
    out, at = [], 0
    for count, ref in plan:
        out.append(ref if ref is not None else write_change_list(storage, log[at:at + count]))
        at += count
    return out


def expand(storage: CheckpointStorage, lists: list[ChangeListRef], inline: list[ChangeSetHandle],
           context: str) -> list[ChangeSetHandle]:
    """A subtask's whole log: its lists' handles in order, then the inline ones."""
    out: list[ChangeSetHandle] = []
    for ref in lists:
        out += read_change_list(storage, ref, context)
    return out + inline
