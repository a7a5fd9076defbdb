"""Which state a subtask's local table holds, exactly: its key-group range and the identities of the handles its
last accepted ack listed (see :mod:`spate.runtime.recovery.trust` for how a copy is trusted by it). Here, below the
coordinator, so that a plan can name the lineage a local copy of the base must have (an online rescale builds
new subtasks' state from the old subtasks' local copies)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Iterable
from dataclasses import dataclass

from spate.snapshot.handles import ChangeSetHandle, KeyedHandle, held_key_groups

TAG_META = "checkpoint"  # the table-metadata name of the checkpoint a local table's state is (or "dirty")
LINEAGE_META = "lineage"  # the table-metadata name the lineage is stored under (next to the tag)


def _kg_span(key_groups: Collection[int]) -> tuple[int, int] | tuple[None, None]:
    """First and last key group with data of a handle. A handle only ever shrinks by intersection with key-group
    ranges, so together with the file (or log and sequence number) they say exactly which part of it is meant."""
    return (min(key_groups), max(key_groups)) if key_groups else (None, None)


def keyed_identity(handle: KeyedHandle) -> tuple:
    return (handle.path, handle.file_offset, *_kg_span(held_key_groups(handle)))


def change_set_identity(handle: ChangeSetHandle) -> tuple:
    """Where a change set is stored does not matter (file merging may re-write it): what it holds does."""
    return (handle.log_id, handle.sqn, *_kg_span(handle.offsets))


@dataclass(frozen=True)
class Lineage:
    """Exactly which state a table holds: its key-group range (start, stop), the identities of the
    materialized handles and, in replay order, of the change sets that make it up."""

    key_groups: tuple[int, int]
    keyed: tuple[tuple, ...]
    changelog: tuple[tuple, ...]

    @staticmethod
    def of(key_groups: range, keyed: Iterable[KeyedHandle], changelog: Iterable[ChangeSetHandle]) -> Lineage:
        return Lineage((key_groups.start, key_groups.stop), tuple(keyed_identity(h) for h in keyed),
                       tuple(change_set_identity(h) for h in changelog))

    def to_bytes(self) -> bytes:
        return json.dumps({"key_groups": self.key_groups, "keyed": self.keyed, "changelog": self.changelog},
                          separators=(",", ":")).encode()

    @staticmethod
    def from_bytes(raw: bytes | None) -> Lineage | None:
        """The lineage stored in a table (None if absent or unreadable: then nothing is trusted)."""
        if not raw:
            return None
        try:
            data = json.loads(raw)
            return Lineage(tuple(data["key_groups"]), tuple(tuple(h) for h in data["keyed"]),  # type: ignore[arg-type]
                           tuple(tuple(c) for c in data["changelog"]))
        except (ValueError, KeyError, TypeError):
            return None

    def digest(self) -> str:
        """A short fingerprint of :meth:`to_bytes` (what a plan names to check a local copy against)."""
        return lineage_digest(self.to_bytes())


def lineage_digest(raw: bytes) -> str:
    """The fingerprint of a lineage as stored (:meth:`Lineage.to_bytes`)."""
    return hashlib.sha256(raw).hexdigest()[:32]


def changelog_digest(identities: Iterable[tuple]) -> str:
    """The fingerprint of a log: the identities (:func:`change_set_identity`) of its change sets, in order."""
    return lineage_digest(json.dumps(list(identities), separators=(",", ":")).encode())
