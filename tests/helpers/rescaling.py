"""A job run through restarts at other parallelisms and an injected crash: ``run_rescaling`` (a
``LocalRunner`` per parallelism, each batch's outputs as (key, count) pairs of ``COUNT_SCHEMA``)."""

from __future__ import annotations

import pyarrow as pa

from spate import LocalRunner

COUNT_SCHEMA = pa.schema([("k", pa.string()), ("count", pa.int64())])


class InjectedCrash(Exception):
    """A fault injected by the test (the runner dies after the subtasks acknowledged)."""


def run_rescaling(processor, root, batches, parallelisms, crash_at=None, **kw):
    """Run ``batches`` switching parallelism at each entry of ``parallelisms`` ((from batch, P), ...); batch
    ``crash_at`` crashes once after its subtasks acknowledged (fault injection), and a new runner goes on from
    the last complete checkpoint."""
    outputs = {}
    switch = dict(parallelisms)
    crashed = []

    def fault(step, batch_id):
        if batch_id == crash_at and step == "after_acks" and not crashed:
            crashed.append(batch_id)
            raise InjectedCrash()

    p, n = switch[0], 0
    while n < len(batches):
        p = switch.get(n, p)
        with LocalRunner(processor, key="k", checkpoint_root=root, parallelism=p, output_schema=COUNT_SCHEMA,
                         fault_injector=fault, **kw) as runner:
            n = runner.next_batch_id
            try:
                while n < len(batches) and switch.get(n, p) == p:
                    outputs[n] = sorted((r["k"], r["count"]) for r in runner.run_batch(n, batches[n]).outputs)
                    n += 1
            except InjectedCrash:
                pass
    assert crash_at is None or crash_at >= len(batches) or crashed == [crash_at]
    return outputs
