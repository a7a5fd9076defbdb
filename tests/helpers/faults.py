"""Fault injection for ``LocalRunner``'s ``fault_injector``: ``CrashOnce``, a fake crash at one protocol step of
one batch, and ``crash_segments``, a job run in segments that may end in one."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any


class CrashOnce:
    """Fault injection (a fake crash): raises at protocol ``step`` of batch ``batch_id``, the first time only."""

    def __init__(self, step: str | None, batch_id: int) -> None:
        self.step, self.batch_id, self.crashed = step, batch_id, False

    def __call__(self, at: str, batch_id: int) -> None:
        if at == self.step and batch_id == self.batch_id and not self.crashed:
            self.crashed = True
            raise RuntimeError("injected crash")


def crash_segments(open_runner: Callable[[int, CrashOnce], Any], segments: list[tuple[int, int, str | None]],
                   src: list, after_batch: Callable[[Any], None] | None = None) -> Iterator[int]:
    """Run the batches ``src`` in segments: per (parallelism, length, crash step) a runner from
    ``open_runner(parallelism, fault)`` runs up to ``length`` more batches, the last one crashing at that protocol
    step (None: none); a last segment at parallelism 2 runs the rest. Yields the batches done after each segment;
    ``after_batch(runner)`` runs after each batch that did not crash."""
    done = 0
    for parallelism, length, crash in [*segments, (2, len(src), None)]:
        fault = CrashOnce(crash, min(done + length, len(src) - 1))
        with open_runner(parallelism, fault) as r:
            for n in range(r.next_batch_id, min(done + length + (crash is not None), len(src))):
                try:
                    r.run_batch(n, src[n])
                except RuntimeError as e:
                    assert fault.crashed, e
                    break
                if after_batch is not None:
                    after_batch(r)
            done = r.next_batch_id
        yield done
