"""An lmdb table over read-only bases: state a subtask took over at an online rescale without copying it.

At a rescale, old subtasks' local lmdb files are hard-linked into the new subtask's directory as *bases*, each
owning a key-group range (``base-<i>.mdb``, listed in the table's ``bases`` metadata); the subtask writes only
its own lmdb table, the *delta*. A read looks in the delta, then, unless the delta holds a tombstone for the key
(``TOMBSTONE_PREFIX + key``), in the base owning the key group. Deleting a key a base may hold writes a
tombstone; writing it again removes the tombstone. After each batch, :meth:`OverlayTable.fold` moves a bounded
number of entries from the bases into the delta, a key group at a time; a folded base is unlinked, and with the
last one the tombstones go: the table is a plain lmdb table again.

Taking over a base costs a hard link, whatever its size. A base file is never written: nothing writes an old
subtask's table once its parallelism is gone, and a table directory is deleted and made anew (a new file),
never rewritten in place, before it is used at another checkpoint (see :mod:`spate.runtime.rescale`).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import cast

import lmdb

from spate.errors import SpateError
from spate.state.layout import TOMBSTONE_PREFIX, U16, primary_length
from spate.state.lmdb_table import LmdbTable, ReadOnlyTable
from spate.state.table import StateTable

BASES_META = "bases"  # the table metadata listing its bases: [[file name, first kg, stop], ...]


@dataclass
class Base:
    """A read-only lmdb file of another subtask's state, owning key groups ``[start, stop)`` of this table.

    ``opened`` is its reader, or the reader still to come while the file is placed (a restore's base downloaded, or
    its CRC-32 checked, as the log replays into the delta): the first read of the base waits for it, and raises what
    placing it raised."""

    name: str
    start: int
    stop: int
    opened: ReadOnlyTable | Future[ReadOnlyTable]
    resume: bytes = b""  # folding key group ``start`` goes on from this key (b"": from its first)
    # the entries the table still reads from it (in its key groups, from ``resume`` on, neither replaced nor deleted
    # by the delta); None: not known (it holds more key groups than it owns, or entries were restored into them)
    served: int | None = None

    @property
    def table(self) -> ReadOnlyTable:
        """The base's reader, once it is placed."""
        if isinstance(self.opened, Future):
            self.opened = self.opened.result()
        return self.opened

    def placed(self) -> ReadOnlyTable | None:
        """The reader, waited for; None if placing the file failed (no reader to let go of)."""
        try:
            return self.table
        except Exception:  # noqa: BLE001 - raised to whoever reads the base; here there is nothing to release
            return None

    def owns(self, kg: int) -> bool:
        return self.start <= kg < self.stop


class SharedReaders:
    """The read-only lmdb files open in this process. lmdb opens a file once per process, and at a rescale
    several new subtasks of one worker read the same old table (hard links of one file): they share one
    :class:`ReadOnlyTable`, closed when the last of them lets go. Owned by the worker's services."""

    def __init__(self) -> None:
        self._open: dict[tuple[int, int], list] = {}  # (device, inode) -> [table, users]
        self._lock = threading.Lock()

    def open(self, path: str, file: bool = False) -> ReadOnlyTable:
        """The reader of the lmdb data file at ``path`` (a table directory, or with ``file`` the file itself)."""
        st = os.stat(path if file else os.path.join(path, "data.mdb"))
        with self._lock:
            entry = self._open.get((st.st_dev, st.st_ino))
            if entry is None:
                try:
                    table = ReadOnlyTable(path, file=file)
                except lmdb.Error as e:  # e.g. open for writing elsewhere in this process
                    raise SpateError(f"{path} cannot be read here: {e}") from e
                entry = self._open[(st.st_dev, st.st_ino)] = [table, 0]
            entry[1] += 1
            return entry[0]  # type: ignore[no-any-return]

    def release(self, table: ReadOnlyTable) -> None:
        with self._lock:
            for ident, entry in list(self._open.items()):
                if entry[0] is table:
                    entry[1] -= 1
                    if entry[1] == 0:
                        del self._open[ident]
                        table.close()
                    return


def listed_bases(raw: bytes | None) -> list[tuple[str, int, int, bytes, int | None]]:
    """The bases a table's ``bases`` metadata lists: (file name, first key group, stop, key to resume folding
    the first key group from, entries served or None: not known, and in listings written before 2026-11-28);
    empty: none."""
    return [(name, start, stop, bytes.fromhex(resume), served[0] if served else None)
            for name, start, stop, resume, *served in json.loads(raw)] if raw else []


def open_local_table(path: str, readers: SharedReaders) -> LmdbTable | OverlayTable:
    """The lmdb table in ``path``: an :class:`OverlayTable` if it lists bases, else a plain one. Raises
    FileNotFoundError (with the table closed) if a listed base file is missing."""
    delta = LmdbTable(path)
    listed = listed_bases(delta.committed_meta(BASES_META))
    names = {name for name, *_ in listed}
    for name in os.listdir(path):  # a base whose drop was committed, but the process died before unlinking it
        if name.startswith("base-") and name.endswith(".mdb") and name not in names:
            os.unlink(os.path.join(path, name))
    if not listed:
        return delta
    overlay = OverlayTable(delta, [], readers)
    try:
        for name, start, stop, resume, served in listed:
            overlay.bases.append(Base(name, start, stop, readers.open(os.path.join(path, name), file=True), resume,
                                      served))
    except BaseException:
        overlay.close()
        raise
    return overlay


class OverlayTable(StateTable):
    """``delta`` (this subtask's own table) over ``bases`` (see the module docstring)."""

    kind = "lmdb"

    def __init__(self, delta: LmdbTable, bases: list[Base], readers: SharedReaders) -> None:
        self.inner = delta  # lock, tag and digest are the delta's (the unwrapping in runtime.subtask finds it)
        self.bases = bases
        self._readers = readers
        self._views = 0  # consistent views open (a materialization in another thread): no base is closed then
        self._views_lock = threading.Lock()
        self._tombstones = delta.has_prefix(TOMBSTONE_PREFIX)  # none yet: reads and writes skip looking for one

    @property
    def path(self) -> str:
        return self.inner.path

    def _base(self, kg: int) -> Base | None:
        for b in self.bases:
            if b.owns(kg):
                return b
        return None

    # -- single keys --------------------------------------------------------------------------------------
    def _get(self, kg: int, key: bytes) -> bytes | None:
        value = self.inner.get_key(key)
        if value is not None:
            return value
        base = self._base(kg)
        if base is None or self._tombstones and self.inner.get_key(TOMBSTONE_PREFIX + key) is not None:
            return None
        return base.table.get_key(key)

    def _put(self, kg: int, key: bytes, value: bytes, answer: bool = True) -> bool:
        """Put ``key``; whether the table held it (the delta, or a base not deleted from). Not ``answer``ed (False)
        where that takes a read of the base only to answer it."""
        if self.inner.put_key(key, value):
            return True  # the delta's own replaced (a key the delta holds has no tombstone)
        base = self._base(kg)
        if base is None or self._tombstones and self.inner.delete_key(TOMBSTONE_PREFIX + key):
            return False
        if not answer and base.served is None or base.table.get_key(key) is None:
            return False
        if base.served is not None:
            base.served -= 1  # the delta's entry shadows it now
        return True

    def _delete(self, kg: int, key: bytes) -> bool:
        existed = self.inner.delete_key(key)
        base = self._base(kg)
        if base is not None and (not self._tombstones or self.inner.get_key(TOMBSTONE_PREFIX + key) is None) and \
                base.table.get_key(key) is not None:
            self.inner.put_key(TOMBSTONE_PREFIX + key, b"")
            if not existed and base.served is not None:
                base.served -= 1  # it was read from the base: now deleted there
            self._tombstones = existed = True
        return existed

    def get(self, kg: int, primary: bytes) -> bytes | None:
        return self._get(kg, U16.pack(kg) + primary)

    def put(self, kg: int, primary: bytes, value: bytes) -> None:
        self._put(kg, U16.pack(kg) + primary, value, answer=False)

    def put_existed(self, kg: int, primary: bytes, value: bytes) -> bool:
        return self._put(kg, U16.pack(kg) + primary, value)

    def put_many(self, entries: Sequence[tuple[int, bytes, bytes]]) -> None:
        for kg, primary, value in entries:
            self._put(kg, U16.pack(kg) + primary, value, answer=False)

    def put_many_existed(self, entries: Sequence[tuple[int, bytes, bytes]]) -> list[bool]:
        put = self._put
        return [put(kg, U16.pack(kg) + primary, value) for kg, primary, value in entries]

    def delete(self, kg: int, primary: bytes) -> None:
        prefix = U16.pack(kg) + primary
        if not self._delete(kg, prefix):  # not a value entry: every map entry under the primary
            for key, _ in self._scan(kg, prefix):
                self._delete(kg, key)

    def map_get(self, kg: int, primary: bytes, user_key: bytes) -> bytes | None:
        return self._get(kg, U16.pack(kg) + primary + user_key)

    def map_put(self, kg: int, primary: bytes, user_key: bytes, value: bytes) -> None:
        self._put(kg, U16.pack(kg) + primary + user_key, value, answer=False)

    def map_put_existed(self, kg: int, primary: bytes, user_key: bytes, value: bytes) -> bool:
        return self._put(kg, U16.pack(kg) + primary + user_key, value)

    def map_delete(self, kg: int, primary: bytes, user_key: bytes) -> None:
        self._delete(kg, U16.pack(kg) + primary + user_key)

    # -- scans: the delta's entries, and the base's that the delta neither replaced nor deleted --------------
    def _scan(self, kg: int, prefix: bytes) -> list[tuple[bytes, bytes]]:
        base = self._base(kg)
        mine = self.inner.scan(prefix)
        if base is None:
            return mine
        deleted = {k[2:] for k, _ in self.inner.scan(TOMBSTONE_PREFIX + prefix)} if self._tombstones else set()
        return merged(mine, base.table.scan(prefix), deleted)

    def map_items(self, kg: int, primary: bytes) -> list[tuple[bytes, bytes]]:
        prefix = U16.pack(kg) + primary
        n = len(prefix)
        return [(k[n:], v) for k, v in self._scan(kg, prefix)]

    def state_entries(self, kg: int, sid_prefix: bytes) -> Iterator[tuple[bytes, bytes, bytes]]:
        for k, v in self._scan(kg, U16.pack(kg) + sid_prefix):
            flat = k[2:]
            plen = primary_length(flat)
            yield flat[:plen], flat[plen:], v

    def key_group_flat(self, kg: int) -> list[bytes]:
        return [x for k, v in self._scan(kg, U16.pack(kg)) for x in (k[2:], v)]

    @contextlib.contextmanager
    def consistent_view(self) -> Iterator[OverlayView]:
        """The delta's read transaction over the bases as they are now (folding later does not change what the
        view reads: its transaction does not see the folded entries, so it keeps reading them from the bases,
        which stay open until it is closed)."""
        with self.bases_kept(), self.inner.consistent_view() as view:
            yield OverlayView(view, self.bases)

    @contextlib.contextmanager
    def bases_kept(self) -> Iterator[None]:
        """While held, no folded base is dropped (its file stays): a view reads it, here or in another process."""
        with self._views_lock:
            self._views += 1
        try:
            yield
        finally:
            with self._views_lock:
                self._views -= 1

    def restore_key_group(self, kg: int, flat: list[bytes], map_sids: frozenset[bytes],
                          digest: int | None = None) -> None:
        base = self._base(kg)
        if base is not None and flat:
            # which of the entries replace the base's is not known without a read of the base per entry (15 s
            # of a 10 GB restore's log replay): the count is known again from the checkpoint's
            # (learn_entry_count), or once the base is folded in
            base.served = None
        self.inner.restore_key_group(kg, flat, map_sids, digest)
        if self._tombstones and base is not None:
            prefix = TOMBSTONE_PREFIX + U16.pack(kg)
            for key in flat[0::2]:
                self.inner.delete_key(prefix + key)

    def add_base(self, base: Base, states: bytes) -> None:
        """Read ``base``'s key groups from it from now on; ``states``: the registry of the delta and the base."""
        self.bases.append(base)
        self.inner.put_meta("states", states)
        self.inner.put_meta(BASES_META, self._listing())

    # -- folding the bases into the delta --------------------------------------------------------------------
    def fold(self, limit: int) -> int:
        """Look at up to ``limit`` entries of the bases, moving those the delta neither replaced nor deleted into
        it; unlink the bases folded completely. Returns the entries looked at."""
        seen = 0
        for base in list(self.bases):
            while base.start < base.stop and seen < limit:
                seen += self._fold_some(base, limit - seen)
                self.inner.put_meta(BASES_META, self._listing())  # with what was folded, in one transaction
            if base.start < base.stop:
                break
            self._drop(base)  # unless a view reads from it: then at a later fold
        if not self.bases and self._tombstones:
            self.inner.drop_prefix(TOMBSTONE_PREFIX)
            self._tombstones = False
        return seen

    def _fold_some(self, base: Base, budget: int) -> int:
        """Fold up to ``budget`` entries of the base's first key group from where it stopped (a key group done,
        its tombstones go and the base moves on to the next). While a key group is half folded, reads of it
        still look in the base: what was folded is in the delta too, with the same value."""
        prefix = U16.pack(base.start)
        entries = base.table.scan_from(base.resume or prefix, prefix, budget + 1)
        done = len(entries) <= budget
        if not done:
            base.resume = entries.pop()[0]
        get, tombstones = self.inner.get_key, self._tombstones
        new = [(k, v) for k, v in entries
               if get(k) is None and not (tombstones and get(TOMBSTONE_PREFIX + k) is not None)]
        if new:
            self.inner.add_new(new)
            if base.served is not None:
                base.served -= len(new)  # the delta holds them now
        if done:
            if self._tombstones:
                for key, _ in self.inner.scan(TOMBSTONE_PREFIX + prefix):
                    self.inner.delete_key(key)
            base.start, base.resume = base.start + 1, b""
        return len(entries)

    def _drop(self, base: Base) -> bool:
        """Forget a folded base, unless a consistent view is open: committed first, so no committed state lists a
        file that is gone. Returns whether it was dropped."""
        with self._views_lock:
            if self._views:
                return False
            self.bases.remove(base)
        self.inner.put_meta(BASES_META, self._listing())
        self.inner.commit()
        self._readers.release(base.table)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(self.path, base.name))
        return True

    def _listing(self) -> bytes:
        return json.dumps([[b.name, b.start, b.stop, b.resume.hex(), b.served] for b in self.bases]).encode() \
            if self.bases else b""

    # -- the rest is the delta's ----------------------------------------------------------------------------
    def get_meta(self, name: str) -> bytes | None:
        return self.inner.get_meta(name)

    def put_meta(self, name: str, value: bytes) -> None:
        self.inner.put_meta(name, value)

    def committed_meta(self, name: str) -> bytes | None:
        return self.inner.committed_meta(name)

    def commit(self) -> None:
        """Commit the delta, with the bases' ``served`` counts where they changed (so a table reopened at a commit
        knows its entry count)."""
        listing = self._listing()
        if self.bases and listing != self.inner.get_meta(BASES_META):
            self.inner.put_meta(BASES_META, listing)
        self.inner.commit()

    def approx_bytes(self) -> int:
        return self.inner.approx_bytes() + sum(b.table.data_bytes() for b in self.bases)

    def entry_count(self) -> int | None:
        """The delta's entries and those the table reads from its bases; None while a base's are not known."""
        served = [b.served for b in self.bases]
        if None in served:
            return None
        return self.inner.entry_count() + sum(cast("list[int]", served))

    def learn_entry_count(self, count: int) -> None:
        """The one base whose entries are not known serves what ``count`` leaves (after a log was replayed into
        its key groups at a restore, :meth:`restore_key_group`). Several unknown, or a ``count`` smaller than the
        table's known entries (not this table's count): left unknown."""
        unknown = [b for b in self.bases if b.served is None]
        rest = count - self.inner.entry_count() - sum(b.served for b in self.bases if b.served is not None)
        if len(unknown) == 1 and rest >= 0:
            unknown[0].served = rest

    def verify(self) -> str | None:
        """The delta's and every base's entries against their digests."""
        checks = [("", self.inner.verify), *((b.name, b.table.verify) for b in self.bases)]
        for name, check in checks:
            problem = check()
            if problem is not None:
                return f"{name}: {problem}" if name else problem
        return None

    def lock(self, timeout_s: float = 60.0) -> None:
        self.inner.lock(timeout_s)

    def unlock(self) -> None:
        self.inner.unlock()

    def close(self) -> None:
        self._release_bases()
        self.inner.close()

    def destroy(self) -> None:
        self._release_bases()
        self.inner.destroy()

    def _release_bases(self) -> None:
        for b in self.bases:
            if (reader := b.placed()) is not None:
                self._readers.release(reader)
        self.bases = []


class OverlayView:
    """A consistent view of an overlay: a read transaction of the delta (or a :class:`ReadOnlyTable` of it) over
    the (immutable) bases."""

    @staticmethod
    def of_snapshot(view: object, listing: bytes | None, opened: dict[str, ReadOnlyTable]) -> OverlayView:
        """The view of a delta snapshot ``view`` whose ``bases`` metadata is ``listing``, its bases among ``opened``
        (by file name; a materialization's reader in another process opens them once)."""
        return OverlayView(view, [Base(name, start, stop, opened[name], resume)
                                  for name, start, stop, resume, _ in listed_bases(listing)])

    def __init__(self, view: object, bases: list[Base]) -> None:
        self._view = view
        self._bases = [(b.start, b.stop, b.table) for b in bases]  # the ranges as they are now

    def key_group_flat(self, kg: int) -> list[bytes]:
        base = next((table for start, stop, table in self._bases if start <= kg < stop), None)
        view = self._view
        if base is None:
            return view.key_group_flat(kg)  # type: ignore[attr-defined,no-any-return]
        prefix = U16.pack(kg)
        deleted = {k[2:] for k, _ in view.scan(TOMBSTONE_PREFIX + prefix)}  # type: ignore[attr-defined]
        mine = view.scan(prefix)  # type: ignore[attr-defined]
        if not mine and not deleted:  # nothing of the key group written since: the base's, read in C loops
            return base.key_group_flat(kg)  # type: ignore[no-any-return]
        entries = merged(mine, base.scan(prefix), deleted)
        return [x for k, v in entries for x in (k[2:], v)]


def merged(mine: list[tuple[bytes, bytes]], theirs: list[tuple[bytes, bytes]],
           deleted: set[bytes]) -> list[tuple[bytes, bytes]]:
    """The delta's entries ``mine`` and the base's ``theirs`` not replaced or ``deleted`` by it, in key order."""
    if not theirs:
        return mine
    own = {k for k, _ in mine}
    return sorted([*mine, *((k, v) for k, v in theirs if k not in own and k not in deleted)])
