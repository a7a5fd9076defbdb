"""The upload path of the changelog (DSTL): one scheduler per worker process and checkpoint root batches the
persist requests of all its subtasks into one file, caps the bytes in flight (back-pressure), and retries
each upload with a per-attempt timeout and hedging: a slow attempt keeps running while the next starts, the
first success wins and any later success is deleted.

Every thread the scheduler starts is its own: the upload pool, the flush timer and each attempt's hedge and
retry timers (:class:`OwnedTimers`); ``close`` ends and joins all of them. Change files are written through
the scheduler's ``segments`` (a :class:`~spate.segments.SegmentWriter` per checkpoint): file merging plugs its
pooled writers in there, and tests wrap it to inject faults."""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from spate.changelog.changeset import ChangeSet
from spate.changelog.format import change_set_handles, encode_change_file
from spate.errors import CheckpointError, SettingError
from spate.fs import CheckpointStorage
from spate.layout import CHANGE_FILE_SUFFIX, CHANGELOG_DIR
from spate.segments import FileRef, SegmentWriter, WholeFileWriter
from spate.snapshot.handles import ChangeSetHandle

log = logging.getLogger(__name__)
T = TypeVar("T")
MB = 1 << 20
RECENT_UPLOADS = 1000  # uploads a scheduler remembers (for inspection); per-checkpoint figures go to the tasks


@dataclass(frozen=True)
class UploadConfig:
    """Upload settings; defaults as Flink's ``dstl.dfs.*``.

    Raises:
        SettingError: ``max_attempts`` or ``num_threads`` below 1.
    """

    persist_delay_s: float = 0.010
    persist_size_threshold: int = 10 * MB
    max_in_flight: int = 100 * MB
    timeout_s: float = 1.0
    max_attempts: int = 3
    next_attempt_delay_s: float = 0.5
    num_threads: int = 5
    compress: bool = False

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise SettingError(f"max_attempts must be >= 1, got {self.max_attempts}: pass a positive number of "
                               "attempts (default 3)")
        if self.num_threads < 1:
            raise SettingError(f"num_threads must be >= 1, got {self.num_threads}: pass a positive number of "
                               "upload threads (default 5)")


class OwnedTimers:
    """The timer threads of one owner, each tracked from its start until it ended: ``close`` runs at once the
    actions still waiting (their owner is closing: a retry or hedge then gives up) and joins every thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: dict[threading.Timer, Callable[[], None]] = {}
        self._threads: set[threading.Timer] = set()

    def start(self, delay_s: float, action: Callable[[], None]) -> threading.Timer:
        """Run ``action`` in ``delay_s`` seconds, unless cancelled first."""
        timer = threading.Timer(delay_s, lambda: self._fire(timer))
        timer.daemon = True
        with self._lock:
            self._threads = {t for t in self._threads if t.is_alive()}
            self._threads.add(timer)
            self._waiting[timer] = action
            timer.start()
        return timer

    def _fire(self, timer: threading.Timer) -> None:
        with self._lock:
            action = self._waiting.pop(timer, None)
        if action is not None:  # not cancelled, not taken over by close
            action()

    def cancel(self, timer: threading.Timer) -> None:
        with self._lock:
            self._waiting.pop(timer, None)
        timer.cancel()

    def close(self) -> None:
        """Run what still waits, now, then join every timer thread (those the actions start too)."""
        me = threading.current_thread()
        while True:
            with self._lock:
                waiting, self._waiting = self._waiting, {}
                threads = [t for t in self._threads if t is not me and t.is_alive()]
            if not waiting and not threads:
                return
            for timer, action in waiting.items():
                timer.cancel()
                action()
            for t in threads:
                t.join()


class RetryingExecutor:
    """Runs ``action(attempt_number)`` until one attempt succeeds.

    An ``OSError`` is retried after ``next_attempt_delay_s``; an attempt still running after ``timeout_s``
    triggers the next attempt at once (hedging) while it keeps running; any other error fails at once.
    At most ``max_attempts`` attempts start. The first success completes the future; later successes are
    passed to ``discard``. Hedge and retry timers run on ``timers``.
    """

    def __init__(self, pool: ThreadPoolExecutor, max_attempts: int, timeout_s: float | None,
                 next_attempt_delay_s: float, timers: OwnedTimers | None = None) -> None:
        self._pool = pool
        self.timers = timers or OwnedTimers()
        self.max_attempts = max_attempts
        self.timeout_s = timeout_s
        self.delay_s = next_attempt_delay_s

    def execute(self, action: Callable[[int], T], discard: Callable[[T], None]) -> Execution[T]:
        """Start the attempts; the returned execution's ``result`` future completes with the winner."""
        execution = Execution(self, action, discard)
        execution._attempt()
        return execution


class Execution(Generic[T]):
    """One retried action: ``result`` (a future), ``attempts`` started so far, ``errors`` seen."""

    def __init__(self, ex: RetryingExecutor, action: Callable[[int], T], discard: Callable[[T], None]) -> None:
        self.ex, self.action, self.discard = ex, action, discard
        self.result: Future[T] = Future()
        self.decided = False  # a winner or a final failure was chosen (the future may complete just after)
        self.lock = threading.Lock()
        self.attempts = 0
        self.running = 0
        self.errors: list[BaseException] = []

    def _attempt(self) -> None:
        with self.lock:
            if self.decided or self.attempts >= self.ex.max_attempts:
                return
            self.attempts += 1
            self.running += 1
            n = self.attempts
        timer = self.ex.timers.start(self.ex.timeout_s, self._attempt) if self.ex.timeout_s else None  # hedge
        try:
            future = self.ex._pool.submit(self.action, n)
        except RuntimeError as e:  # the scheduler was closed (a hedge or retry timer fired afterwards)
            if timer is not None:
                self.ex.timers.cancel(timer)
            with self.lock:
                self.running -= 1
                give_up = not self.decided and self.running == 0
                self.decided = self.decided or give_up
            if give_up:
                self.result.set_exception(CheckpointError(f"changelog upload abandoned: {e}"))
            return
        future.add_done_callback(lambda f: self._finished(f, timer))

    def _finished(self, f: Future[T], timer: threading.Timer | None) -> None:
        if timer is not None:
            self.ex.timers.cancel(timer)
        # decide under the lock; complete the future after releasing it, because its callbacks run right there
        exc = f.exception()
        with self.lock:
            self.running -= 1
            won = exc is None and not self.decided
            failed = retry = False
            if exc is not None:
                self.errors.append(exc)
                if not self.decided:
                    if not isinstance(exc, OSError) or (self.attempts >= self.ex.max_attempts and self.running == 0):
                        failed = True
                    else:
                        retry = self.attempts < self.ex.max_attempts
            self.decided = self.decided or won or failed
        if won:
            self.result.set_result(f.result())
        elif exc is None:
            self.discard(f.result())
        elif failed:
            self.result.set_exception(exc)
        if retry:
            self.ex.timers.start(self.ex.delay_s, self._attempt)


@dataclass
class UploadTask:
    """Change sets of one log to upload for checkpoint ``checkpoint_id``; ``on_done`` gets their handles,
    ``on_fail`` the error."""

    log_id: str
    change_sets: dict[int, ChangeSet]
    on_done: Callable[[dict[int, ChangeSetHandle], UploadStats], None]
    on_fail: Callable[[BaseException], None]
    checkpoint_id: int = 0
    at_checkpoint: bool = False  # a checkpoint waits for it (not a pre-emptive upload)
    size: int = field(init=False)

    def __post_init__(self) -> None:
        self.size = sum(cs.size for cs in self.change_sets.values())


@dataclass
class UploadStats:
    """What one upload (one file) cost."""

    path: str
    bytes: int
    latency_ms: float
    attempts: int
    errors: int
    tasks: int


class ChangelogFileRegistry:
    """Per process: a change file is discarded once every change set in it was released by its writer,
    unless a completed checkpoint took it over (then the coordinator's registry owns it)."""

    def __init__(self) -> None:
        self._refs: dict[FileRef, tuple[int, SegmentWriter]] = {}
        self._lock = threading.Lock()

    def track(self, ref: FileRef, change_sets: int, writer: SegmentWriter) -> None:
        with self._lock:
            self._refs[ref] = (change_sets, writer)

    def release(self, ref: FileRef) -> None:
        with self._lock:
            if ref not in self._refs:
                return
            count, writer = self._refs[ref]
            if count > 1:
                self._refs[ref] = (count - 1, writer)
                return
            del self._refs[ref]
        writer.discard(ref)

    def stop_tracking(self, ref: FileRef) -> None:
        with self._lock:
            self._refs.pop(ref, None)

    def tracked(self) -> dict[FileRef, int]:
        with self._lock:
            return {ref: count for ref, (count, _) in self._refs.items()}


def change_files(storage: CheckpointStorage) -> Callable[[int], SegmentWriter]:
    """Change files without file merging: whole files in ``shared/changelog``, whatever the checkpoint."""
    return functools.partial(WholeFileWriter, storage, CHANGELOG_DIR, CHANGE_FILE_SUFFIX)


class BatchingUploadScheduler:
    """Collects upload tasks for ``persist_delay_s`` (or until ``persist_size_threshold`` bytes) and writes
    them as one change file; blocks ``upload`` while more than ``max_in_flight`` bytes are in flight.

    The delay is there to gather a checkpoint's uploads of every subtask of the process into one file. So once
    every log :meth:`register` ed asked for the checkpoint (an upload at the checkpoint, or :meth:`asked`:
    nothing more to upload), what is pending is written at once: nothing is left to wait for (a lone subtask's
    checkpoint never waits the delay).

    ``segments(checkpoint_id)`` gives the writer of change files for a checkpoint (default: whole files in
    ``shared/changelog``); every attempt writes through it. ``uploads``: the latest :data:`RECENT_UPLOADS`
    uploads."""

    def __init__(self, storage: CheckpointStorage, config: UploadConfig | None = None,
                 segments: Callable[[int], SegmentWriter] | None = None) -> None:
        self.storage = storage
        self.config = config or UploadConfig()
        self.segments = segments or change_files(storage)
        self.registry = ChangelogFileRegistry()
        self._pool = ThreadPoolExecutor(self.config.num_threads, thread_name_prefix="spate-upload")
        self._timers = OwnedTimers()
        self._retry = RetryingExecutor(self._pool, self.config.max_attempts, self.config.timeout_s,
                                       self.config.next_attempt_delay_s, self._timers)
        self._cond = threading.Condition()
        self._pending: list[UploadTask] = []
        self._pending_bytes = 0
        self._in_flight = 0
        self._timer: threading.Timer | None = None
        self._logs: set[str] = set()  # the logs uploading here (registered writers)
        self._asked: dict[str, int] = {}  # log -> the latest checkpoint it asked for
        self.uploads: deque[UploadStats] = deque(maxlen=RECENT_UPLOADS)

    def register(self, log_id: str) -> None:
        """A writer of log ``log_id`` uploads through this scheduler (until :meth:`unregister`)."""
        with self._cond:
            self._logs.add(log_id)

    def unregister(self, log_id: str) -> None:
        """The writer of ``log_id`` closed: the scheduler no longer waits for its asks."""
        with self._cond:
            self._logs.discard(log_id)
            self._asked.pop(log_id, None)

    def asked(self, log_id: str, checkpoint_id: int) -> None:
        """Log ``log_id`` has nothing more to upload for checkpoint ``checkpoint_id`` than it sent already."""
        with self._cond:
            self._record_ask(log_id, checkpoint_id)
            if self._pending and self._every_log_asked(checkpoint_id):
                self._flush_now()

    def upload(self, task: UploadTask) -> None:
        """Queue ``task``; blocks while too many bytes are in flight. Callers must not hold locks that upload
        callbacks need (the writer calls this outside its own lock)."""
        batch = None
        with self._cond:
            while self._in_flight > 0 and self._in_flight + task.size > self.config.max_in_flight:
                self._cond.wait()  # back-pressure
            self._in_flight += task.size
            self._pending.append(task)
            self._pending_bytes += task.size
            if task.at_checkpoint:
                self._record_ask(task.log_id, task.checkpoint_id)
            if self.config.persist_delay_s <= 0 or self._pending_bytes >= self.config.persist_size_threshold:
                batch = self._take_pending()
            elif task.at_checkpoint and self._every_log_asked(task.checkpoint_id):
                self._flush_now()
            elif self._timer is None:
                self._timer = self._timers.start(self.config.persist_delay_s, self.flush)
        self._start(batch)

    def _flush_now(self) -> None:
        """Write what is pending now, encoded on the timer's thread (the caller's checkpoint goes on meanwhile;
        caller holds ``_cond``)."""
        if self._timer is not None:
            self._timers.cancel(self._timer)
        self._timer = self._timers.start(0.0, self.flush)

    def _record_ask(self, log_id: str, checkpoint_id: int) -> None:
        """Log ``log_id`` asked for checkpoint ``checkpoint_id`` (caller holds ``_cond``)."""
        self._asked[log_id] = max(checkpoint_id, self._asked.get(log_id, checkpoint_id))

    def _every_log_asked(self, checkpoint_id: int) -> bool:
        """Whether every registered log asked for checkpoint ``checkpoint_id`` or a later one (caller holds
        ``_cond``)."""
        return all(self._asked.get(log, -1) >= checkpoint_id for log in self._logs)

    def flush(self) -> None:
        with self._cond:
            batch = self._take_pending()
        self._start(batch)

    def _take_pending(self) -> list[UploadTask]:
        if self._timer is not None:
            self._timers.cancel(self._timer)
            self._timer = None
        tasks, self._pending, self._pending_bytes = self._pending, [], 0
        return tasks

    def _start(self, tasks: list[UploadTask] | None) -> None:
        """Start one upload of ``tasks`` (outside ``_cond``: completion callbacks may run synchronously)."""
        if not tasks:
            return
        started = time.perf_counter()
        out = self.segments(max(t.checkpoint_id for t in tasks))
        data, located = encode_change_file([(t.log_id, sqn, cs) for t in tasks for sqn, cs in t.change_sets.items()],
                                           self.config.compress)
        # every attempt writes a new logical file: hedged attempts never collide, losers are discarded
        execution = self._retry.execute(lambda n: (out.write(data), out), self._discard)
        execution.result.add_done_callback(lambda f: self._completed(tasks, located, execution, started))

    @staticmethod
    def _discard(result: tuple[FileRef, SegmentWriter]) -> None:
        result[1].discard(result[0])

    def _completed(self, tasks: list[UploadTask], located: dict[tuple[str, int], Any], execution: Execution,
                   started: float) -> None:
        with self._cond:
            self._in_flight -= sum(t.size for t in tasks)
            self._cond.notify_all()
        f = execution.result
        exc = f.exception()
        if exc is not None:
            log.warning("changelog upload failed: %s", exc)
            for t in tasks:
                t.on_fail(exc)
            return
        ref, out = f.result()
        handles = change_set_handles(ref, located)
        self.registry.track(ref, len(handles), out)
        path = ref.path
        latency = round((time.perf_counter() - started) * 1000, 3)
        self.uploads.append(UploadStats(path, ref.length, latency, execution.attempts, len(execution.errors),
                                        len(tasks)))
        for t in tasks:
            mine = {sqn: handles[(t.log_id, sqn)] for sqn in t.change_sets if (t.log_id, sqn) in handles}
            # each task's share of the file, so statistics summed over subtasks add up to the file
            share = UploadStats(path, sum(h.state_bytes for h in mine.values()), latency, execution.attempts,
                                len(execution.errors), len(tasks))
            t.on_done(mine, share)

    def close(self) -> None:
        """Write what is pending, wait for the uploads, then end the timers: a retry still waiting gives up
        (the pool is gone) at once instead of later."""
        self.flush()
        self._pool.shutdown(wait=True)
        self._timers.close()
