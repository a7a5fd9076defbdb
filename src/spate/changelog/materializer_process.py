"""The process that reads a subtask's lmdb table for a background materialization: ``python -m
spate.changelog.materializer_process``, started and fed by :class:`~spate.changelog.process_view.ProcessView`.

Why a process. py-lmdb releases the GIL around every cursor step. A thread reading the table beside a thread that
runs Python (the subtask's batches) waits for the GIL at every entry: 32 key groups of a 1 GB table took 0.5-1.3 s
alone and 135 s beside a busy Python thread (docs/benchmarks.md). Here no other thread runs Python while a key
group is read, hashed and framed; the subtask's process only writes the finished frames.

Which snapshot. lmdb serves readers in other processes. The reader starts from, and moves on to, only the
snapshots the subtask names at its sequence-number boundaries (:class:`Advance`: a position and the lmdb
transaction committed there). A snapshot is taken only if the transaction a read opens is that one; if the
subtask committed more since, the offer is passed over and the reader stays on the snapshot it has (still exact:
each key group is reported with the position it was read at, as :class:`~spate.changelog.rolling_view.RollingView`
does in process).
"""

from __future__ import annotations

import os
import queue
import sys
import threading
import time
from typing import BinaryIO, cast

import lmdb

from spate.changelog.materializer_protocol import (
    Advance,
    Failed,
    Finished,
    KeyGroupRead,
    NativeWritten,
    ProtocolError,
    Start,
    receive,
    send,
)
from spate.pacing import Pace, write_back_behind
from spate.snapshot.keyed import key_group_frame
from spate.snapshot.native_write import STATES_KEY, NativeFileBuilder, map_bytes, part_path
from spate.state.layout import META_PREFIX
from spate.state.lmdb_read_ahead import KeyGroupReadAhead
from spate.state.lmdb_readonly import ReadOnlyTable, ReadView
from spate.state.lmdb_scan import flat_key_group
from spate.state.overlay import BASES_META, OverlayView, listed_bases

MIN_MAP_BYTES = 1 << 30
LISTENER_GRACE_S = 30.0  # after the last key group, for the subtask to close the pipe
BASES_KEY = META_PREFIX + BASES_META.encode()  # an overlay's read-only bases (spate.state.overlay)
SEND_AHEAD = 1  # framed key groups waiting to be sent (one of a 10 GB state is about 80 MB)


class Snapshots:
    """The snapshot the reader uses and the newest one offered since (opened by the listening thread)."""

    def __init__(self, env: lmdb.Environment) -> None:
        self._env = env
        self._lock = threading.Lock()
        self._newest: tuple[lmdb.Transaction, int] | None = None  # opened, not yet taken by the reader
        self._in_use: tuple[lmdb.Transaction, int] | None = None  # the reader's
        self._closed = False
        self.ended = threading.Event()  # the subtask closed the pipe: stop

    def offer(self, position: int, txn_id: int) -> bool:
        """Open the snapshot the subtask committed at ``position``; False if it is no longer the newest."""
        txn = self._begin()
        if txn is None:
            return False
        passed_over = None
        with self._lock:
            taken = txn.id() == txn_id and not self._closed
            if taken:
                passed_over, self._newest = self._newest, (txn, position)
        if not taken:
            txn.abort()
        elif passed_over is not None:
            passed_over[0].abort()
        return taken

    def take(self) -> tuple[lmdb.Transaction, int] | None:
        """The newest snapshot offered (the reader's previous one closed), or the one in use."""
        with self._lock:
            newer, self._newest = self._newest, None
        if newer is not None:
            if self._in_use is not None:
                self._in_use[0].abort()
            self._in_use = newer
        return self._in_use

    def _begin(self) -> lmdb.Transaction | None:
        """A read transaction; if the subtask grew the map beyond ours, adopt its size while nothing is open
        (else pass: the reader keeps its snapshot)."""
        try:
            return self._env.begin()
        except lmdb.MapResizedError:
            with self._lock:
                idle = self._in_use is None and self._newest is None
            if not idle:
                return None
            self._env.set_mapsize(0)
            return self._env.begin()

    def close(self) -> None:
        """Abort every transaction, so that no reader slot of this process pins the subtask's table."""
        with self._lock:
            self._closed = True
            held, self._newest, self._in_use = (self._newest, self._in_use), None, None
        for h in held:
            if h is not None:
                h[0].abort()


def listen(source: BinaryIO, snapshots: Snapshots) -> None:
    """Take the subtask's boundaries as they come, until it closes the pipe."""
    try:
        while (message := receive(source)) is not None:
            if isinstance(message, Advance):
                snapshots.offer(message.position, message.txn_id)
    except (OSError, ProtocolError, lmdb.Error):
        pass
    finally:
        snapshots.ended.set()


class Sender:
    """Sends the messages from a thread of its own, so that the next key group is read and framed while this
    one goes through the pipe (the subtask writes each frame to its file before it reads the next: sent from the
    reading thread, the two took turns). At most :data:`SEND_AHEAD` messages wait, besides the one being sent; a
    failed send is raised at the next :meth:`send` or at :meth:`close`."""

    def __init__(self, out: BinaryIO) -> None:
        self._out = out
        self._queue: queue.Queue[KeyGroupRead | NativeWritten | Finished | None] = queue.Queue(SEND_AHEAD)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True, name="sender")
        self._thread.start()

    def send(self, message: KeyGroupRead | NativeWritten | Finished) -> None:
        self._raise()
        self._queue.put(message)

    def close(self) -> None:
        """Wait until every message was sent (or one failed: raised here)."""
        self._queue.put(None)
        self._thread.join()
        self._raise()

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        while (message := self._queue.get()) is not None:
            if self._error is None:  # after a failure the rest is dropped, so that the reading thread never waits
                try:
                    send(self._out, message)
                except BaseException as e:  # noqa: BLE001 - raised in the reading thread
                    self._error = e


class KeyGroupSource:
    """A key group as the reader's snapshot of the table holds it: the table's own entries, over the read-only
    bases its ``bases`` metadata lists at that snapshot when it is an overlay (after a rescale, or a restore from a
    native snapshot: :mod:`spate.state.overlay`). The subtask keeps every base file while the reader runs."""

    def __init__(self, table_dir: str) -> None:
        self._dir = table_dir
        self._opened: dict[str, ReadOnlyTable] = {}
        self._txn: lmdb.Transaction | None = None
        self._overlay: OverlayView | None = None

    def flat(self, txn: lmdb.Transaction, kg: int) -> list[bytes]:
        if txn is not self._txn:
            self._txn = txn
            listing = cast("bytes | None", txn.get(BASES_KEY))  # buffers off: bytes
            self._overlay = OverlayView.of_snapshot(ReadView(txn), listing, self._open(listing)) if listing else None
        return flat_key_group(txn, kg) if self._overlay is None else self._overlay.key_group_flat(kg)

    def _open(self, listing: bytes) -> dict[str, ReadOnlyTable]:
        for name, *_range in listed_bases(listing):
            if name not in self._opened:
                self._opened[name] = ReadOnlyTable(os.path.join(self._dir, name), file=True)
        return self._opened

    def close(self) -> None:
        self._overlay = self._txn = None
        for table in self._opened.values():
            table.close()
        self._opened.clear()


class NativeParts:
    """The native snapshot's files: one, or (``start.part_bytes``) a new one once the one being built holds that many
    bytes of entries. Each is built (:class:`NativeFileBuilder`) from its first key group that holds data on."""

    def __init__(self, start: Start, map_size: int, pace: Pace) -> None:
        self._start, self._map_size, self._pace = start, map_size, pace
        self._made = 0
        self._builder: NativeFileBuilder | None = None

    def add(self, kg: int, flat: list[bytes]) -> int:
        if self._builder is None:
            path = part_path(self._start.native, self._made)
            self._builder = NativeFileBuilder(path, self._map_size, self._pace, background=True)
        return self._builder.add(kg, flat)

    def full(self) -> bool:
        limit = self._start.part_bytes
        return limit is not None and self._builder is not None and self._builder.bytes >= limit

    def finish(self, last: int, metadata: dict[bytes, bytes]) -> NativeWritten:
        """The file being built finished, holding the key groups up to ``last`` (none of them holds data, if no file
        was begun since the last one)."""
        builder, self._builder = self._builder, None
        if builder is None:
            return NativeWritten([], 0, 0, "", last)
        builder.finish(metadata)
        self._made += 1
        built = builder.built()
        return NativeWritten(list(built.groups), built.digest, built.crc, builder.path, last)

    def abort(self) -> None:
        if self._builder is not None:
            self._builder.abort()
            self._builder = None


def read_key_groups(start: Start, snapshots: Snapshots, out: BinaryIO, ahead: KeyGroupReadAhead,
                    map_size: int = MIN_MAP_BYTES) -> None:
    """Read the key groups of ``start`` in order, each from the newest snapshot taken, and send them framed, or
    (``start.native``) put them into the native snapshot's files (lmdb maps of ``map_size``), send their positions
    only and each file once finished."""
    sender = Sender(out)
    source = KeyGroupSource(start.path)
    native = NativeParts(start, map_size, Pace(start.bytes_per_s, busy=write_back_behind)) if start.native else None
    txn: lmdb.Transaction | None = None
    try:
        for kg in range(start.first, start.last + 1):
            if snapshots.ended.is_set():
                return
            current = snapshots.take()
            assert current is not None  # the start's snapshot was offered before the first key group
            txn, position = current
            ahead.reading(kg)
            began = time.perf_counter()
            flat = source.flat(txn, kg)
            elapsed = time.perf_counter() - began
            if native is not None:
                size = native.add(kg, flat) if flat else 0
                frame = b""
            else:
                frame = key_group_frame(kg, flat) if flat else b""
                size = len(frame)
            del flat  # only the frame waits in the queue
            ahead.read(size, elapsed)
            sender.send(KeyGroupRead(kg, position, frame))
            if native is not None and native.full() and kg < start.last:
                sender.send(native.finish(kg, _table_metadata(txn)))
        metadata = _table_metadata(txn)
        snapshots.close()  # every key group read: no snapshot of the table is held while the file is finished
        if native is not None:
            sender.send(native.finish(start.last, metadata))
            native = None
        sender.send(Finished())
    finally:
        if native is not None:
            native.abort()
        source.close()
        sender.close()


def _table_metadata(txn: lmdb.Transaction | None) -> dict[bytes, bytes]:
    """What a native snapshot keeps of the table's metadata: its state registry, as of the last snapshot read."""
    states = cast("bytes | None", txn.get(STATES_KEY)) if txn is not None else None  # buffers off: bytes
    return {STATES_KEY: states} if states is not None else {}


def serve(source: BinaryIO, out: BinaryIO) -> int:
    """Serve one materialization over ``source`` and ``out``; the exit status."""
    start = receive(source)
    if not isinstance(start, Start):
        send(out, Failed(f"expected a Start message, got {start!r}"))
        return 2
    try:
        # a map with room to grow: a snapshot beyond it could only be taken while no other one is open; a native
        # snapshot of an overlay holds its bases' entries too, so its map is sized on them as well
        used = os.path.getsize(os.path.join(start.path, "data.mdb"))
        map_size = max(4 * used, MIN_MAP_BYTES)
        env = lmdb.open(start.path, readonly=True, lock=True, subdir=True, max_dbs=0, readahead=False,
                        map_size=map_size)
        native_map_size = map_bytes(start.path)
    except (lmdb.Error, OSError) as e:
        send(out, Failed(f"cannot open the lmdb table {start.path}: {e}"))
        return 1
    snapshots = Snapshots(env)
    listener = threading.Thread(target=listen, args=(source, snapshots), daemon=True, name="boundaries")
    try:
        if not snapshots.offer(start.position, start.txn_id):
            # the subtask committed since it asked: wait for a boundary this reader can catch
            while (message := receive(source)) is not None:
                if isinstance(message, Advance) and snapshots.offer(message.position, message.txn_id):
                    break
            else:
                return 0
        listener.start()
        # the read-ahead's threads are joined before env closes, and they never see the map resized under them:
        # they start after the first key group, and from then on the reader holds a snapshot (Snapshots._begin)
        with KeyGroupReadAhead(env, range(start.first, start.last + 1)) as ahead:
            read_key_groups(start, snapshots, out, ahead, native_map_size)
        return 0
    except (lmdb.Error, ProtocolError) as e:
        send(out, Failed(f"reading the lmdb table {start.path} failed: {e}"))
        return 1
    finally:
        if listener.is_alive():
            listener.join(LISTENER_GRACE_S)  # it ends when the subtask closes the pipe
        snapshots.close()
        env.close()


def main() -> int:
    return serve(sys.stdin.buffer, sys.stdout.buffer)


if __name__ == "__main__":
    sys.exit(main())
