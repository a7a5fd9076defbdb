"""How a background materialization reads the subtask's table: a large lmdb table by a process of its own
(:mod:`spate.changelog.materializer_process`), anything else by a thread through a
:class:`~spate.changelog.rolling_view.RollingView`.

Both give the same key groups, each read at a sequence-number boundary and reported with its position, so a
restore replays the same change sets either way. The process is worth its start (a Python interpreter, a few
hundred ms) only for a table that takes seconds to read; TTL'd state, whose expired entries are filtered while
the snapshot is made, and the in-memory table are read in process (an overlay's own entries and bases are read
by the reader process as well). With the native materialization
on, the reader process also writes the key groups it reads into an lmdb file of their own, a native snapshot, in
place of their frames.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from typing import IO, Protocol

from spate.changelog.materialized import MaterializedPart
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
from spate.changelog.rolling_view import RollingView
from spate.errors import CheckpointError
from spate.pacing import Pace, write_back_behind
from spate.segments import SegmentWriter
from spate.snapshot.handles import KeyedHandle, KeyGroupsHandle
from spate.snapshot.keyed import SnapshotScope, write_frames, write_key_groups
from spate.snapshot.native_write import NativeBuild, build_path, remove_build, remove_parts, write_native_file
from spate.state.lmdb_table import LmdbTable
from spate.state.overlay import OverlayTable
from spate.state.table import StateTable, TableView, unwrapped

log = logging.getLogger(__name__)
EXIT_WAIT_S = 10.0  # for the reader to exit after its last key group, before it is killed
READER_MODULE = "spate.changelog.materializer_process"
PIPE_BYTES = 4 << 20
NATIVE = "native"  # a view's ``read_by`` when it writes a native snapshot
Placed = Callable[[MaterializedPart], None]  # told of each part of a materialization placed before its last


class MaterializationView(Protocol):
    """What a materialization reads the table through."""

    positions: dict[int, int]  # per key group read: the position it was read at
    read_by: str  # "thread", "process" or "native"

    def advance(self, position: int) -> None: ...

    def write(self, scope: SnapshotScope, out: SegmentWriter, placed: Placed | None = None) -> KeyedHandle | None:
        """Write the materialization to ``out``; its handle (of the last part, if written in parts: ``placed`` is
        told of each one before it, as it is placed)."""

    def close(self) -> None: ...


class ThreadView:
    """A :class:`RollingView` read by the materialization's thread."""

    read_by = "thread"

    def __init__(self, open_view: Callable[[], AbstractContextManager[TableView]], position: int) -> None:
        self._rolling = RollingView(open_view, position)
        self.positions = self._rolling.positions

    def advance(self, position: int) -> None:
        self._rolling.advance(position)

    def close(self) -> None:
        self._rolling.close()

    def write(self, scope: SnapshotScope, out: SegmentWriter, placed: Placed | None = None) -> KeyGroupsHandle | None:
        return write_key_groups(self._rolling, scope, out)  # one part


class ProcessView:
    """An lmdb table's key groups (an overlay's over its bases) read, hashed and framed by a reader process (or put
    into a native snapshot's file there); this side writes the frames (or the file).

    :meth:`advance` (the subtask's thread, at a boundary) commits the table and offers the reader that snapshot;
    :meth:`write` (the materialization's thread) writes the frames as they come (or places each native file the
    reader finished, a part of the snapshot with ``native.part_bytes``); :meth:`close` (any thread) ends the reader,
    killing it if it has not finished, and the file's copy at its next chunk."""

    read_by = "process"

    def __init__(self, table: LmdbTable | OverlayTable, key_groups: range, position: int,
                 native: NativePace | None = None) -> None:
        # an overlay's base files stay while the reader reads them (let go in close())
        self._kept = table.bases_kept() if isinstance(table, OverlayTable) else contextlib.nullcontext()
        self._commit = table.commit  # an overlay's commit writes its bases' counts too: none is left for right after
        table = table.inner if isinstance(table, OverlayTable) else table
        self._table = table
        self._lock = threading.Lock()
        self._finished = False
        self._closed = threading.Event()  # a copy of the native file still going stops at its next chunk
        self.positions: dict[int, int] = {}
        self._native = build_path(table.path) if native else ""
        self._read_pace = native.read_bytes_per_s if native else None
        self._parts: list[NativeWritten] = []  # the native files the reader finished, not yet placed
        self._writing = False  # write() places the native files, and removes them after
        if native:
            self.read_by = NATIVE
        self._kept.__enter__()
        try:
            self._commit()
            self._reader = subprocess.Popen([sys.executable, "-m", READER_MODULE], stdin=subprocess.PIPE,
                                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        except BaseException:
            self._kept.__exit__(None, None, None)
            raise
        _widen(self._reader.stdout)
        self._offer(Start(table.path, key_groups.start, key_groups.stop - 1, position, self._committed_txn(),
                          self._native, native.write_bytes_per_s if native else None,
                          native.part_bytes if native else None))

    def advance(self, position: int) -> None:
        self._commit()
        self._offer(Advance(position, self._committed_txn()))

    def write(self, scope: SnapshotScope, out: SegmentWriter, placed: Placed | None = None) -> KeyedHandle | None:
        if not self._native:
            return write_frames(self._frames(), scope, out)
        pace = _CopyPace(self._read_pace, self._closed)
        self._writing = True
        first = scope.key_groups.start  # of the part being read
        last: MaterializedPart | None = None
        try:
            for _ in self._frames():
                if not self._parts or last is not None:
                    raise self._failure("it sent a frame for a native snapshot, or a file after the last")
                written = self._parts.pop()
                part = self._placed(written, replace(scope, key_groups=range(first, written.last + 1)), out, pace)
                if written.last + 1 >= scope.key_groups.stop:
                    last = part
                elif placed is None:
                    raise self._failure("it wrote a native snapshot in parts, one was asked for")
                else:
                    placed(part)
                first = written.last + 1
            if last is None:
                raise self._failure("it finished without writing the native snapshot")
            return last.handle
        except BaseException:
            if last is not None and last.handle is not None:  # placed, then the reader failed (or was stopped)
                out.discard(last.handle.segment)
            raise
        finally:
            remove_parts(self._native)  # those the reader finished and those it was building

    def _placed(self, written: NativeWritten, scope: SnapshotScope, out: SegmentWriter,
                pace: Pace) -> MaterializedPart:
        """A native file the reader finished placed in checkpoint storage (removed from the table's directory)."""
        handle = None
        if written.path:  # else none of its key groups holds data: no file was begun
            try:
                built = NativeBuild(tuple(written.groups), written.digest, written.crc)
                handle = write_native_file(written.path, built, scope, out, pace)
            finally:
                remove_build(written.path)
        kgs = scope.key_groups
        return MaterializedPart(handle, kgs, {kg: self.positions[kg] for kg in kgs})

    def _frames(self) -> Iterator[tuple[int, tuple[bytes, ...]]]:
        stdout = self._reader.stdout
        assert stdout is not None
        while True:
            try:
                message = receive(stdout)  # type: ignore[arg-type]
            except (OSError, ValueError, ProtocolError) as e:
                raise self._failure(str(e)) from e
            if isinstance(message, KeyGroupRead):
                self.positions[message.kg] = message.position
                if message.frame:
                    yield message.kg, (message.frame,)
                del message  # its frame is not kept while the next one is received
            elif isinstance(message, NativeWritten) and self._native:
                self._parts.append(message)
                yield message.last, ()  # placed by write() before the next message is read
            elif isinstance(message, Finished):
                with self._lock:
                    self._finished = True
                return
            else:
                raise self._failure(message.error if isinstance(message, Failed) else "it stopped")

    def close(self) -> None:
        """End the reader (idempotent): let it exit after it finished, else kill it; then clear the lmdb reader
        slots a killed reader leaves, which would keep the table from reusing pages."""
        self._closed.set()
        with self._lock:
            reader, finished = self._reader, self._finished
            stdin = reader.stdin
            if stdin is None or stdin.closed:
                return
            with contextlib.suppress(OSError):
                stdin.close()  # a reader that finished exits now
        if not finished:
            reader.kill()
        try:
            reader.wait(EXIT_WAIT_S)
        except subprocess.TimeoutExpired:
            reader.kill()
            reader.wait()
        if reader.stdout is not None:
            reader.stdout.close()
        if not finished or reader.returncode != 0:
            with contextlib.suppress(Exception):  # the table may be closing: nothing is left to clear then
                self._table.env.reader_check()
        if reader.stderr is not None:
            reader.stderr.close()
        if self._native and not finished and not self._writing:  # else write() removes them, once done with them
            remove_parts(self._native)
        self._kept.__exit__(None, None, None)

    def _offer(self, message: Start | Advance) -> None:
        with self._lock:
            stdin = self._reader.stdin
            if stdin is None or stdin.closed:
                return
            with contextlib.suppress(OSError):  # the reader is gone: writing the frames says why
                send(stdin, message)  # type: ignore[arg-type]

    def _committed_txn(self) -> int:
        return int(self._table.env.info()["last_txnid"])

    def _failure(self, why: str) -> CheckpointError:
        with contextlib.suppress(Exception):
            self._reader.wait(EXIT_WAIT_S)
        err = b""
        if self._reader.stderr is not None and self._reader.returncode is not None:
            with contextlib.suppress(Exception):
                err = self._reader.stderr.read()[-2000:]
        return CheckpointError(f"the materialization's reader process of {self._table.path} failed: {why} (exit "
                               f"status {self._reader.returncode}){': ' + err.decode(errors='replace') if err else ''}")


class _CopyPace(Pace):
    """The native file's copy to checkpoint storage that is not this file system, at its pace while the write-back
    is behind, stopped once the view is closed: paced, it takes about a minute at 10 GB, which a closing subtask
    would otherwise wait for."""

    def __init__(self, bytes_per_s: float | None, closed: threading.Event) -> None:
        super().__init__(bytes_per_s, busy=write_back_behind)
        self._view_closed = closed

    def moved(self, n: int) -> None:
        if self._view_closed.is_set():
            raise CheckpointError("the materialization was stopped while its native file was copied")
        super().moved(n)


def _widen(pipe: IO[bytes] | None) -> None:
    """Let the pipe hold up to :data:`PIPE_BYTES` (Linux; the system's limit for an unprivileged process is
    usually 1 MB): each read of it releases and retakes the GIL, which beside a thread running Python waits up to
    a switch interval (5 ms), so the fewer reads per frame the better (64 KB pipes: 16 per MB)."""
    setter = getattr(fcntl, "F_SETPIPE_SZ", None)
    if pipe is None or setter is None:
        return
    try:
        with open("/proc/sys/fs/pipe-max-size") as limit:
            size = min(PIPE_BYTES, int(limit.read()))
    except (OSError, ValueError):
        size = 1 << 20
    with contextlib.suppress(OSError):
        fcntl.fcntl(pipe.fileno(), setter, size)


@dataclass(frozen=True)
class NativePace:
    """How fast a native materialization's file is written (its entries, by the reader process) and read to be
    copied to checkpoint storage that is not this file system (by the subtask), in bytes a second; None: as fast as
    the disk goes."""

    write_bytes_per_s: float | None = None
    read_bytes_per_s: float | None = None
    part_bytes: int | None = None  # a background materialization's file finished every this many bytes (None: one)


class MaterializationReads:
    """How one subtask's materializations read its table: a large lmdb table (at least ``process_from_bytes``
    in use) without TTL'd state in a reader process, which with ``native`` writes a native snapshot
    (:mod:`spate.snapshot.native`) at its pace instead of key-group frames; anything else in a thread. After a
    reader process fails, this subtask's materializations read in a thread."""

    def __init__(self, process_from_bytes: int, native: NativePace | None = None) -> None:
        self.process_from_bytes = process_from_bytes
        self.native = native
        self.process_failed = False

    def open(self, table: StateTable, scope: SnapshotScope, position: int, in_parts: bool = False
             ) -> MaterializationView:
        """A view of ``table`` at ``position`` (the caller is at a sequence-number boundary); ``in_parts``: a native
        snapshot written in parts of ``native.part_bytes``."""
        inner = unwrapped(table)  # under the changelog's wrapper, and the profiler's (``profile=True``)
        if isinstance(inner, (LmdbTable, OverlayTable)) and not scope.filters and not self.process_failed \
                and inner.approx_bytes() >= self.process_from_bytes:
            native = self.native if self.native is None or in_parts else replace(self.native, part_bytes=None)
            try:
                return ProcessView(inner, scope.key_groups, position, native)
            except OSError as e:
                log.warning("cannot start a reader process for the materialization of %s (%s); reading it in a "
                            "thread", inner.path, e)
                self.process_failed = True

        def open_view() -> AbstractContextManager[TableView]:
            table.commit()
            return table.consistent_view()

        return ThreadView(open_view, position)

    def failed(self, view: MaterializationView) -> None:
        """A materialization through ``view`` failed: if a reader process did, read in a thread from now on."""
        if isinstance(view, ProcessView):
            log.warning("a materialization's reader process failed; this subtask's next ones read in a thread")
            self.process_failed = True
