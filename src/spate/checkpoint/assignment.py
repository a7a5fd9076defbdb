"""Which state each new subtask restores: keyed state by key-group intersection, operator state by the FLIP-8
rules (split round-robin, union to all, broadcast copies)."""

from __future__ import annotations

from typing import TypeVar

from spate.checkpoint.protocol import RescaleSource
from spate.errors import IncompatibleStateError
from spate.keygroups import key_group_range
from spate.snapshot.handles import (
    ChangeSetHandle,
    KeyedHandle,
    KeyGroupsHandle,
    NativeSnapshotHandle,
    OperatorStateHandle,
    OperatorStatePiece,
)
from spate.snapshot.lineage import Lineage
from spate.state.operator import BROADCAST, SPLIT, UNION

H = TypeVar("H", KeyGroupsHandle, NativeSnapshotHandle, ChangeSetHandle)


def assign_keyed_state(old: list[list[H]], max_parallelism: int, new_parallelism: int) -> list[list[H]]:
    """Same parallelism: subtask i keeps old subtask i's handles. Otherwise each new subtask gets every old
    handle intersected with its key-group range (non-empty intersections only)."""
    if new_parallelism > max_parallelism:
        raise IncompatibleStateError(f"parallelism {new_parallelism} exceeds the max parallelism "
                                     f"{max_parallelism} the state was written with; use at most "
                                     f"{max_parallelism} subtasks")
    if len(old) == new_parallelism:
        return [list(handles) for handles in old]
    out = []
    for i in range(new_parallelism):
        kgs = key_group_range(max_parallelism, new_parallelism, i)
        out.append([part for handles in old for h in handles if (part := h.intersect(kgs)) is not None])
    return out


def rescale_sources(old: list[tuple[list[KeyedHandle], list[ChangeSetHandle]]], max_parallelism: int,
                    new_parallelism: int) -> list[list[RescaleSource]]:
    """Per new subtask, the old subtasks (their materialized and change-set handles in ``old``) whose key groups
    it takes over, largest overlap first (ties: lowest index), each with the lineage its local copy of the base
    carries. Empty lists when the parallelism is unchanged (nothing is rescaled)."""
    old_p = len(old)
    if old_p == new_parallelism:
        return [[] for _ in range(new_parallelism)]
    old_ranges = [key_group_range(max_parallelism, old_p, k) for k in range(old_p)]
    lineages = [Lineage.of(r, keyed, changelog).digest() for r, (keyed, changelog) in zip(old_ranges, old, strict=True)]
    overlaps = overlapping_subtasks(max_parallelism, old_p, new_parallelism)
    consumers = [sum(k in row for row in overlaps) for k in range(old_p)]
    return [[RescaleSource(k, old_ranges[k].start, old_ranges[k].stop, lineages[k], consumers[k]) for k in row]
            for row in overlaps]


def overlapping_subtasks(max_parallelism: int, old_parallelism: int, new_parallelism: int) -> list[list[int]]:
    """Per new subtask, the old subtasks owning some of its key groups, the largest part first (ties: the
    lowest index)."""
    old_ranges = [key_group_range(max_parallelism, old_parallelism, k) for k in range(old_parallelism)]
    out = []
    for i in range(new_parallelism):
        new = key_group_range(max_parallelism, new_parallelism, i)
        sizes = [(min(new.stop, r.stop) - max(new.start, r.start), k) for k, r in enumerate(old_ranges)]
        out.append([k for n, k in sorted(sizes, key=lambda o: (-o[0], o[1])) if n > 0])
    return out


def assign_operator_state(old: list[OperatorStateHandle | None], new_parallelism: int,
                          rebalance: bool = False) -> list[list[OperatorStatePiece]]:
    """FLIP-8 redistribution of operator state to ``new_parallelism`` subtasks.

    Split state: unchanged assignment when the parallelism is unchanged; otherwise, per state name in name
    order, ``base = total // P`` elements each and one more for ``total % P`` subtasks, the extra elements
    rotating on from where the previous name's ran out (balanced within one element, each element exactly
    once). Union state: every subtask gets every element. Broadcast state: subtask i gets old (i mod P_old)'s.
    ``rebalance`` deals split state out round-robin even at unchanged parallelism (Flink's repartitioner).
    """
    if new_parallelism < 1:
        raise ValueError(f"parallelism must be >= 1, got {new_parallelism}")
    out: list[list[OperatorStatePiece]] = [[] for _ in range(new_parallelism)]
    names = sorted({n for h in old if h for n in h.states})
    same = len(old) == new_parallelism and not rebalance
    start_subtask = 0
    for name in names:
        parts = [(h, h.states[name]) for h in old if h and name in h.states]
        mode = parts[0][1].mode
        if any(e.mode != mode for _, e in parts):
            raise IncompatibleStateError(f"operator state {name!r} has different modes in different subtasks")
        pieces = [h.piece(name) for h, _ in parts]
        if mode == UNION:
            for target in out:
                target.extend(pieces)
        elif mode == BROADCAST:
            copies = {i: h for i, h in enumerate(old) if h and name in h.states}
            first = next(iter(copies.values()))
            for i, target in enumerate(out):
                target.append(copies.get(i % len(old), first).piece(name))
        elif mode == SPLIT:
            if same:
                for i, h in enumerate(old):
                    if h and name in h.states:
                        out[i].append(h.piece(name))
            else:
                start_subtask = _split(pieces, out, start_subtask)
        else:
            raise IncompatibleStateError(f"operator state {name!r} has unknown mode {mode!r}")
    return out


def _split(pieces: list[OperatorStatePiece], out: list[list[OperatorStatePiece]], start_subtask: int) -> int:
    """Deal the elements of ``pieces`` out round-robin (Flink's RoundRobinOperatorStateRepartitioner)."""
    p = len(out)
    total = sum(pc.stop - pc.start for pc in pieces)
    base, remainder = divmod(total, p)
    next_start = start_subtask
    cursor = iter(pieces)
    current, pos = next(cursor, None), 0
    for i in range(p):
        idx = (i + start_subtask) % p
        take = base
        if remainder > 0:
            take += 1
            remainder -= 1
        elif remainder == 0:
            next_start = idx
            remainder -= 1
        while take > 0 and current is not None:
            available = current.stop - current.start - pos
            n = min(take, available)
            if n > 0:
                s = current.start + pos
                out[idx].append(OperatorStatePiece(current.path, current.name, current.mode, current.serializer,
                                                   current.offset, current.length, s, s + n))
                pos += n
                take -= n
            if pos >= current.stop - current.start:
                current, pos = next(cursor, None), 0
    return next_start
