"""Read-only access to a checkpoint root: list, load, verify, and decode state without running a query
(used by the CLI and by tests that compare checkpointed state with a reference)."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from spate.changelog.format import read_change_set
from spate.changelog.restore import restore_keyed_state
from spate.checkpoint.coordinator import list_complete_checkpoints
from spate.checkpoint.metadata import CheckpointMetadata, QueryInfo, SubtaskState, read_delivered, read_metadata
from spate.errors import CheckpointError, SpateError, StateAccessError
from spate.frames import RangeReader
from spate.fs import CheckpointStorage
from spate.keygroups import key_group_range
from spate.layout import METADATA_FILE, QUERY_FILE, delivered_path, metadata_path
from spate.open_files import OpenFiles
from spate.serde import decode_key, serializer_by_name
from spate.snapshot.handles import ChangeSetHandle, KeyedHandle, KeyGroupsHandle, NativeSnapshotHandle
from spate.snapshot.keyed import read_key_groups
from spate.snapshot.native import verify_native
from spate.snapshot.operator import read_operator_piece
from spate.snapshot.outputs import read_outputs
from spate.state.descriptors import LIST
from spate.state.heap import HeapTable
from spate.state.keyed import KeyedStateBackend, StateMeta, decode_stored
from spate.state.layout import U16, split_primary
from spate.state.stored import EXPIRY, LENGTH
from spate.state.timers import TIMER_SIDS


def load_checkpoint(storage: CheckpointStorage, checkpoint_id: int | None = None) -> CheckpointMetadata:
    """Metadata of checkpoint ``checkpoint_id`` (default: the latest complete one, or the savepoint if
    ``storage`` is a savepoint directory).

    Raises:
        CheckpointError: no complete checkpoint, or no checkpoint ``checkpoint_id`` (the message lists those
            there are).
        CorruptFileError / MissingFileError: its metadata does not verify, or a file it lists is gone.
    """
    if checkpoint_id is None:
        ids = list_complete_checkpoints(storage)
        if not ids:
            if storage.exists(METADATA_FILE):
                return read_metadata(storage, METADATA_FILE)
            raise CheckpointError(f"no complete checkpoint under {storage.uri}")
        checkpoint_id = ids[-1]
    if not storage.exists(metadata_path(checkpoint_id)):
        raise CheckpointError(f"checkpoint {checkpoint_id} does not exist under {storage.uri} "
                              f"(complete: {list_complete_checkpoints(storage)})")
    return read_metadata(storage, metadata_path(checkpoint_id))


def verify_checkpoint(storage: CheckpointStorage, meta: CheckpointMetadata) -> list[str]:
    """Read every segment ``meta`` references and check every checksum (each frame of each segment), and that
    every physical file holds all its segments; returns the problems found.

    Raises:
        Nothing for a problem it finds (each is a line of the result); an unreadable root raises its
        storage's error.
    """
    problems = []
    context = f"checkpoint {meta.checkpoint_id}"
    with OpenFiles(storage) as files:  # segments share a few physical files: each opened once
        for path, end in meta.files().items():
            try:
                size = files.size(path)
            except SpateError as e:
                problems.append(str(e))
                continue
            if size < end:
                problems.append(f"{storage.path(path)}: {size} bytes, but {context} has segments up to byte {end}; "
                                "the file is truncated")
        for i, st in enumerate(meta.subtasks):
            problems += [f"subtask {i}: {e}" for e in _subtask_problems(files, st, context)]
    return problems


def _subtask_problems(files: OpenFiles, st: SubtaskState, context: str) -> list[str]:
    """What is wrong with the files one subtask's state references (its keyed state, change sets, operator
    state and staged outputs), read through ``files``."""
    problems = []
    for handle in (*st.keyed, *st.changelog):
        try:
            _read_through(files, handle, context)
        except SpateError as e:
            problems.append(str(e))
    pieces = [st.operator.piece(name) for name in st.operator.states] if st.operator else []
    for piece in pieces:
        try:
            read_operator_piece(files, piece, context)
        except SpateError as e:
            problems.append(str(e))
    if st.outputs:
        try:
            read_outputs(files, st.outputs, allow_pickle=False, decode=False)
        except SpateError as e:
            problems.append(str(e))
    return problems


def _read_through(storage: RangeReader, handle: KeyedHandle | ChangeSetHandle, context: str) -> None:
    """Read every byte of a keyed or change-set handle, checking checksums and formats (raises SpateError)."""
    if isinstance(handle, NativeSnapshotHandle):
        verify_native(storage, handle, context)
    elif isinstance(handle, KeyGroupsHandle):
        for _ in read_key_groups(storage, handle, context):
            pass
    else:
        for _ in read_change_set(storage, handle, context):
            pass


def verify_root_files(storage: CheckpointStorage, checkpoint_ids: list[int]) -> list[str]:
    """Check the root's own files: ``_query`` (its frame and fields; required once checkpoints exist) and the
    delivery markers (``_delivered``, and the per-checkpoint ones of older versions); returns the problems."""
    checks: list[Callable[[], object]] = [lambda: _read_query(storage, required=bool(checkpoint_ids)),
                                          lambda: read_delivered(storage)]
    checks += [functools.partial(read_delivered, storage, delivered_path(n)) for n in checkpoint_ids]
    problems = []
    for check in checks:
        try:
            check()
        except Exception as e:  # noqa: BLE001 - verification reports every failure, whatever it is
            problems.append(describe_error(e))
    return problems


def _read_query(storage: CheckpointStorage, required: bool) -> QueryInfo | None:
    info = QueryInfo.read(storage)
    if info is None and required:
        raise CheckpointError(f"{storage.path(QUERY_FILE)} is missing but checkpoints exist")
    return info


def describe_error(e: BaseException) -> str:
    """One readable line for any failure: spate's own errors say what is wrong; others name their type."""
    return str(e) if isinstance(e, SpateError) else f"{type(e).__name__}: {e}"


def physical_files(storage: CheckpointStorage, meta: CheckpointMetadata) -> list[dict[str, Any]]:
    """Per physical file ``meta`` references: its segments, the bytes they hold and the file's size."""
    by_path: dict[str, list[int]] = {}
    for ref in meta.segments():
        by_path.setdefault(ref.path, []).append(ref.length)
    rows = []
    for path, lengths in sorted(by_path.items()):
        try:
            size: int | None = storage.size(path)
        except SpateError:
            size = None
        rows.append({"file": path, "segments": len(lengths), "segment_bytes": sum(lengths), "file_bytes": size})
    return rows


def keyed_state_names(meta: CheckpointMetadata) -> dict[str, str]:
    """name → kind of every keyed state in a checkpoint."""
    handles = [h.states for st in meta.subtasks for h in st.keyed] + [
        c.states for st in meta.subtasks for c in st.changelog]
    return {m["name"]: m["kind"] for states in handles for m in states}


def operator_state_names(meta: CheckpointMetadata) -> dict[str, str]:
    """name → mode of every operator state in a checkpoint."""
    return {n: e.mode for st in meta.subtasks if st.operator for n, e in st.operator.states.items()}


@dataclass(frozen=True)
class StateEntry:
    """One decoded keyed-state entry (``user_key`` is set for map state and timers)."""

    subtask: int
    key_group: int
    key: Any
    namespace: Any
    user_key: Any
    value: Any


def keyed_state_entries(storage: CheckpointStorage, meta: CheckpointMetadata, name: str,
                        allow_pickle: bool = False, now_ms: int | None = None) -> Iterator[StateEntry]:
    """Every live entry of keyed state ``name`` (or "timers:event"/"timers:processing") in a checkpoint.

    Each subtask's state is rebuilt in memory exactly as a restore would (materialized snapshots, then the
    changelog), so what this shows is what a restarted query would see.

    Raises:
        StateAccessError: (a ``ValueError``) a ``timers:`` name of an unknown time domain.
        CheckpointError: the checkpoint has no keyed state ``name`` (the message lists those it has).
        SerializationError: the state is pickled and ``allow_pickle`` is False, or its serializer is unknown.
    """
    now = int(time.time() * 1000) if now_ms is None else now_ms
    timer_domain = name.split(":", 1)[1] if name.startswith("timers:") else None
    if timer_domain is not None and timer_domain not in TIMER_SIDS:
        raise StateAccessError(f"unknown timer domain in {name!r}: use timers:event or timers:processing")
    if timer_domain is None:
        check_keyed_state(meta, name)
    for i in range(len(meta.subtasks)):
        backend = restore_subtask(storage, meta, i, allow_pickle)
        state_meta = next((m for m in backend.state_metas if m.name == name), None)
        if timer_domain is not None:
            sid = TIMER_SIDS[timer_domain]
        elif state_meta is None:
            continue
        else:
            sid = state_meta.sid
            loads = serializer_by_name(state_meta.serializer, allow_pickle, f"state {name!r}").loads
        for kg in backend.key_groups:
            for primary, uk, raw in backend.table.state_entries(kg, U16.pack(sid)):
                _sid, key_bytes, ns = split_primary(primary)
                user_key: Any
                if timer_domain is not None:
                    value, live = None, True
                    user_key = int.from_bytes(uk, "big") - (1 << 63)
                else:
                    live, value = decode_stored(state_meta, raw, loads, now)  # type: ignore[arg-type]
                    user_key = decode_key(uk) if uk else None
                if live:
                    yield StateEntry(i, kg, decode_key(key_bytes), decode_key(ns) if ns else None, user_key, value)


def check_keyed_state(meta: CheckpointMetadata, name: str) -> None:
    """Raise a :class:`CheckpointError` naming the keyed states that exist if ``meta`` has none named ``name``."""
    if name not in keyed_state_names(meta):
        raise CheckpointError(f"checkpoint {meta.checkpoint_id} has no keyed state named {name!r}; it has "
                              f"{sorted(keyed_state_names(meta))} (timers: timers:event, timers:processing)")


def restore_subtask(storage: CheckpointStorage, meta: CheckpointMetadata, subtask: int,
                    allow_pickle: bool = False) -> KeyedStateBackend:
    """Subtask ``subtask``'s keyed state in a checkpoint, rebuilt in memory exactly as a restore would."""
    backend = KeyedStateBackend(HeapTable(), meta.max_parallelism,
                                key_group_range(meta.max_parallelism, meta.parallelism, subtask),
                                allow_pickle=allow_pickle)
    st = meta.subtasks[subtask]
    restore_keyed_state(backend, storage, st.keyed, st.changelog, f"checkpoint {meta.checkpoint_id}")
    return backend


@dataclass(frozen=True)
class StateRecord:
    """One live stored item of a keyed state with its TTL expiry (None without TTL): the value of a value
    state, one entry of a map state (``user_key``), or one element of a list state (``index``: its position
    among the live elements)."""

    key_group: int
    key: Any
    namespace: Any
    user_key: Any
    index: int | None
    value: Any
    expires_at_ms: int | None


def subtask_state_records(storage: CheckpointStorage, meta: CheckpointMetadata, name: str, subtask: int,
                          allow_pickle: bool = False, now_ms: int | None = None) -> Iterator[StateRecord]:
    """Every live item of keyed state ``name`` in one subtask of a checkpoint (restored as a restore would,
    one subtask at a time), with its TTL expiry; items expired at ``now_ms`` (default: now) are left out."""
    check_keyed_state(meta, name)
    now = int(time.time() * 1000) if now_ms is None else now_ms
    backend = restore_subtask(storage, meta, subtask, allow_pickle)
    state_meta = next((m for m in backend.state_metas if m.name == name), None)
    if state_meta is None:
        return
    loads = serializer_by_name(state_meta.serializer, allow_pickle, f"state {name!r}").loads
    for kg in backend.key_groups:
        for primary, uk, raw in backend.table.state_entries(kg, U16.pack(state_meta.sid)):
            _sid, key_bytes, ns = split_primary(primary)
            key, namespace = decode_key(key_bytes), decode_key(ns) if ns else None
            user_key = decode_key(uk) if uk else None
            for index, value, expires in _stored_items(state_meta, raw, loads, now):
                yield StateRecord(kg, key, namespace, user_key, index, value, expires)


def _stored_items(meta: StateMeta, raw: bytes, loads: Callable[[bytes], Any],
                  now_ms: int) -> list[tuple[int | None, Any, int | None]]:
    """(list index or None, value, expiry or None) of the live items of one stored entry."""
    ttl = bool(meta.ttl_ms)
    if meta.kind != LIST:
        expires = EXPIRY.unpack_from(raw)[0] if ttl else None
        if expires is not None and expires <= now_ms:
            return []
        return [(None, loads(raw[8:] if ttl else raw), expires)]
    out: list[tuple[int | None, Any, int | None]] = []
    pos = 0
    while pos < len(raw):
        expires = None
        if ttl:
            expires = EXPIRY.unpack_from(raw, pos)[0]
            pos += 8
        length = LENGTH.unpack_from(raw, pos)[0]
        if expires is None or expires > now_ms:
            out.append((len(out), loads(raw[pos + 4:pos + 4 + length]), expires))
        pos += 4 + length
    return out


def operator_state_elements(storage: CheckpointStorage, meta: CheckpointMetadata, name: str,
                            allow_pickle: bool = False) -> list[list[Any]]:
    """Per subtask, the decoded elements of operator state ``name`` ((key, value) pairs for broadcast).

    Raises:
        CheckpointError: the checkpoint has no operator state ``name`` (the message lists those it has).
        SerializationError: the state is pickled and ``allow_pickle`` is False, or its serializer is unknown.
    """
    out: list[list[Any]] = []
    found = False
    for st in meta.subtasks:
        e = st.operator.states.get(name) if st.operator else None
        if e is None:
            out.append([])
            continue
        found = True
        assert st.operator is not None
        loads = serializer_by_name(e.serializer, allow_pickle, f"operator state {name!r}").loads
        enc = read_operator_piece(storage, st.operator.piece(name), f"checkpoint {meta.checkpoint_id}")
        if e.mode == "broadcast":
            out.append([(decode_key(enc[k]), loads(enc[k + 1])) for k in range(0, len(enc), 2)])
        else:
            out.append([loads(x) for x in enc])
    if not found:
        raise CheckpointError(f"checkpoint {meta.checkpoint_id} has no operator state named {name!r}; it has "
                              f"{sorted(operator_state_names(meta))}")
    return out


def subtask_recoveries(meta: CheckpointMetadata) -> list[dict[str, Any]]:
    """Per subtask of a checkpoint: where it ran (``executor``), how its state got to the base (``recovery``:
    reused, caught_up, restored, new; ``unknown`` in metadata of older versions), from which checkpoints, what
    that read from checkpoint storage and how long it took, and the input rows it processed."""
    return [{"subtask": i, "executor": st.executor, "recovery": st.recovery, "caught_up_from": st.caught_up_from,
             "restored_from": st.restored_from, "restore_bytes": st.restore_bytes, "restore_ms": st.restore_ms,
             "rows": st.rows} for i, st in enumerate(meta.subtasks)]


def checkpoint_summary(meta: CheckpointMetadata) -> dict[str, Any]:
    """Figures of one checkpoint for tables and JSON (``files``: physical files; ``segments``: the logical
    files in them)."""
    return {"checkpoint_id": meta.checkpoint_id, "timestamp_ms": meta.timestamp_ms,
            "parallelism": meta.parallelism, "max_parallelism": meta.max_parallelism,
            "files": len(meta.files()), "segments": len(meta.segments()), "state_bytes": meta.state_bytes,
            "watermark_ms": meta.watermark_ms,
            "keyed_states": sorted(keyed_state_names(meta)), "operator_states": sorted(operator_state_names(meta))}


__all__ = ["load_checkpoint", "verify_checkpoint", "verify_root_files", "describe_error", "physical_files",
           "keyed_state_entries", "operator_state_elements", "checkpoint_summary", "subtask_recoveries",
           "keyed_state_names", "check_keyed_state", "restore_subtask", "subtask_state_records", "StateRecord",
           "operator_state_names", "StateEntry"]
