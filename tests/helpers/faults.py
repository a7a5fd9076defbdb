"""Fault injection for ``LocalRunner``'s ``fault_injector``: ``CrashOnce``, a fake crash at one protocol step of
one batch."""

from __future__ import annotations


class CrashOnce:
    """Fault injection (a fake crash): raises at protocol ``step`` of batch ``batch_id``, the first time only."""

    def __init__(self, step: str | None, batch_id: int) -> None:
        self.step, self.batch_id, self.crashed = step, batch_id, False

    def __call__(self, at: str, batch_id: int) -> None:
        if at == self.step and batch_id == self.batch_id and not self.crashed:
            self.crashed = True
            raise RuntimeError("injected crash")
