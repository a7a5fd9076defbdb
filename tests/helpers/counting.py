"""The counting job of the checkpoint tests: ``Count`` (a running count per key, and the batches each subtask
saw), its input (``batches``), the counts a checkpoint holds (``counts``) and the counts it should hold
(``expected_counts``)."""

from __future__ import annotations

from spate import CheckpointStorage, Processor, ValueStateDescriptor, keyed_state_entries, load_checkpoint
from spate.checkpoint.inspect import verify_checkpoint

COUNT = ValueStateDescriptor("count", default=0)


class Count(Processor):
    def open(self, ctx):
        self.count = ctx.state(COUNT)
        self.offsets = ctx.get_list_state("offsets")

    def process(self, key, rows, ctx):
        self.count.update(self.count.value() + len(rows))
        yield {"k": key, "n": self.count.value()}

    def end_batch(self, ctx):
        self.offsets.update([ctx.batch_id])


def batches(n: int, keys: int = 20) -> list[list[dict]]:
    return [[{"k": f"user-{(b * 7 + i) % keys}"} for i in range(10)] for b in range(n)]


def counts(root: str, checkpoint_id: int | None = None) -> dict:
    s = CheckpointStorage(root)
    return {e.key: e.value for e in keyed_state_entries(s, load_checkpoint(s, checkpoint_id), "count")}


def expected_counts(source: list[list[dict]]) -> dict:
    out: dict = {}
    for rows in source:
        for r in rows:
            out[r["k"]] = out.get(r["k"], 0) + 1
    return out


def check_checkpoint(root: str, source: list[list[dict]]) -> None:
    """The last checkpoint of ``root`` holds the counts of ``source``; its entry counts, where every subtask knows
    its own, are the keys counted; and its files verify."""
    storage = CheckpointStorage(root)
    last = load_checkpoint(storage)
    rows = [st.stats.get("state_rows") for st in last.subtasks]
    if None not in rows:
        assert sum(rows) == len(expected_counts(source)), rows
    assert counts(root) == expected_counts(source)
    assert verify_checkpoint(storage, last) == []
