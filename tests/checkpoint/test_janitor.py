"""The janitor's background deletions are bounded, ordered, drained and joined."""

from __future__ import annotations

import threading

import pytest

from spate.checkpoint.janitor import Janitor
from spate.fs import CheckpointStorage


def _janitor(tmp_path, queue_size: int = 2) -> Janitor:
    return Janitor(CheckpointStorage(str(tmp_path / "root")), queue_size)


def test_deletions_run_in_order_and_drain_waits_for_them(tmp_path):
    janitor, done = _janitor(tmp_path, queue_size=100), []
    for i in range(50):
        janitor._submit(done.append, i)
    janitor.drain()
    assert done == list(range(50))
    janitor.close()


def test_a_full_queue_makes_the_submitter_wait_and_drops_nothing(tmp_path):
    janitor, release, done = _janitor(tmp_path, queue_size=2), threading.Event(), []
    janitor._submit(release.wait)  # the worker holds this one
    submitter = threading.Thread(target=lambda: [janitor._submit(done.append, i) for i in range(5)])
    submitter.start()
    submitter.join(0.3)
    assert submitter.is_alive(), "the submitter waits for room"
    assert len(janitor._tasks) <= janitor.queue_size
    release.set()
    submitter.join(5)
    janitor.drain()
    assert done == [0, 1, 2, 3, 4]
    janitor.close()


def test_drain_raises_the_first_failure_and_later_deletions_still_run(tmp_path):
    janitor, done = _janitor(tmp_path), []

    def fail(message: str) -> None:
        raise OSError(message)

    janitor._submit(fail, "first")
    janitor._submit(fail, "second")
    janitor._submit(done.append, "after")
    with pytest.raises(OSError, match="first"):
        janitor.drain()
    assert done == ["after"]
    janitor.drain()  # the failure was reported once
    janitor.close()


def test_close_joins_the_worker_and_refuses_new_work(tmp_path):
    janitor = _janitor(tmp_path)
    janitor._submit(lambda: None)
    worker = janitor._worker
    janitor.close()
    assert worker is None or not worker.is_alive()
    assert janitor._worker is None
    with pytest.raises(RuntimeError, match="closed"):
        janitor.discard("shared/x")


def test_an_idle_janitor_holds_no_thread(tmp_path):
    janitor = _janitor(tmp_path)
    janitor._submit(lambda: None)
    janitor.drain()
    worker = janitor._worker
    if worker is not None:
        worker.join(5)
    assert janitor._worker is None
    janitor.close()


def test_janitor_never_deletes_what_spate_does_not_name(tmp_path):
    janitor = _janitor(tmp_path)
    janitor.storage.write("notes.txt", b"not spate's")
    janitor.discard("notes.txt")
    janitor.close()
    assert janitor.storage.exists("notes.txt")
