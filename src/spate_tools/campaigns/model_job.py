"""A processor that exercises every keyed state type, timers and operator state, and a plain in-memory
reference model of what it must compute. Used by the property-based tests and the crash-fuzz campaign
(``spate fuzz``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from spate import (
    AggregatingStateDescriptor,
    Context,
    ListStateDescriptor,
    MapStateDescriptor,
    Processor,
    ReducingStateDescriptor,
    ValueStateDescriptor,
)

TTL_MS = 2500  # with 1000 ms between batches: a TTL'd value lives through the next two batches


class MeanAgg:
    def create_accumulator(self) -> list[int]:
        return [0, 0]

    def add(self, value: int, acc: list[int]) -> list[int]:
        return [acc[0] + value, acc[1] + 1]

    def get_result(self, acc: list[int]) -> list[int]:
        return acc

    def merge(self, a: list[int], b: list[int]) -> list[int]:
        return [a[0] + b[0], a[1] + b[1]]


VALUE: ValueStateDescriptor[int] = ValueStateDescriptor("value")
LIST: ListStateDescriptor[int] = ListStateDescriptor("list")
MAP = MapStateDescriptor("map")
REDUCING: ReducingStateDescriptor[int] = ReducingStateDescriptor("sum", lambda a, b: a + b)
AGGREGATING = AggregatingStateDescriptor("mean", aggregate_fn=MeanAgg())
TTL_VALUE: ValueStateDescriptor[int] = ValueStateDescriptor("ttl", ttl_ms=TTL_MS)


class ModelJob(Processor):
    """Rows are operations: {"k": key, "op": name, "x": int, "i": row id}."""

    def open(self, ctx: Context) -> None:
        self.value = ctx.state(VALUE)
        self.list = ctx.state(LIST)
        self.map = ctx.state(MAP)
        self.sum = ctx.state(REDUCING)
        self.mean = ctx.state(AGGREGATING)
        self.ttl = ctx.state(TTL_VALUE)
        self.splits = ctx.get_list_state("batches-seen")

    def process(self, key: Any, rows: Sequence[dict[str, Any]], ctx: Context):
        for row in rows:
            op, x = row["op"], row["x"]
            if op == "vput":
                self.value.update(x)
            elif op == "vclear":
                self.value.clear()
            elif op == "ladd":
                self.list.add(x)
            elif op == "lset":
                self.list.update([x, x + 1])
            elif op == "mput":
                self.map.put(x % 4, x)
            elif op == "mdel":
                self.map.remove(x % 4)
            elif op == "radd":
                self.sum.add(x)
            elif op == "aadd":
                self.mean.add(x)
            elif op == "tput":
                self.ttl.update(x)
            elif op == "timer":
                ctx.register_processing_time_timer(ctx.processing_time_ms + 1000 * (1 + x % 3))
            elif op == "untimer":
                for ts in ctx.processing_time_timers():
                    ctx.delete_processing_time_timer(ts)
            yield {"i": row["i"], "k": key, **self.view()}

    def view(self) -> dict[str, Any]:
        return {"v": self.value.value(), "l": self.list.get(), "m": sorted(self.map.items()), "s": self.sum.get(),
                "a": self.mean.get(), "t": self.ttl.value()}

    def on_timer(self, key: Any, timestamp_ms: int, ctx: Context):
        yield {"k": key, "timer": timestamp_ms}

    def end_batch(self, ctx: Context):
        self.splits.add([ctx.batch_id, ctx.subtask_index])
        return None


OPS = ("vput", "vclear", "ladd", "lset", "mput", "mdel", "radd", "aadd", "tput", "timer", "untimer")


class Model:
    """The reference: dicts per state, applied in row order, timers fired by processing time."""

    def __init__(self) -> None:
        self.value: dict[Any, int] = {}
        self.list: dict[Any, list[int]] = {}
        self.map: dict[Any, dict[int, int]] = {}
        self.sum: dict[Any, int] = {}
        self.mean: dict[Any, list[int]] = {}
        self.ttl: dict[Any, tuple[int, int]] = {}  # key -> (value, expiry)
        self.timers: dict[Any, set[int]] = {}

    def batch(self, rows: list[dict], now: int) -> list[dict]:
        out: list[dict] = []
        for row in rows:  # the input first, then the timers due (which the input may have deleted)
            self.apply(row, now)
            out.append({"i": row["i"], "k": row["k"], **self.view(row["k"], now)})
        due = sorted((ts, repr(k), k) for k, tss in self.timers.items() for ts in tss if ts <= now)
        for ts, _, k in due:
            self.timers[k].discard(ts)
            out.append({"k": k, "timer": ts})
        return out

    def apply(self, row: dict, now: int) -> None:
        k, op, x = row["k"], row["op"], row["x"]
        if op == "vput":
            self.value[k] = x
        elif op == "vclear":
            self.value.pop(k, None)
        elif op == "ladd":
            self.list.setdefault(k, []).append(x)
        elif op == "lset":
            self.list[k] = [x, x + 1]
        elif op == "mput":
            self.map.setdefault(k, {})[x % 4] = x
        elif op == "mdel":
            self.map.get(k, {}).pop(x % 4, None)
        elif op == "radd":
            self.sum[k] = self.sum.get(k, 0) + x
        elif op == "aadd":
            acc = self.mean.get(k, [0, 0])
            self.mean[k] = [acc[0] + x, acc[1] + 1]
        elif op == "tput":
            self.ttl[k] = (x, now + TTL_MS)
        elif op == "timer":
            self.timers.setdefault(k, set()).add(now + 1000 * (1 + x % 3))
        elif op == "untimer":
            self.timers.pop(k, None)

    def view(self, k: Any, now: int) -> dict[str, Any]:
        ttl = self.ttl.get(k)
        return {"v": self.value.get(k), "l": list(self.list.get(k, [])), "m": sorted(self.map.get(k, {}).items()),
                "s": self.sum.get(k), "a": self.mean.get(k), "t": ttl[0] if ttl and ttl[1] > now else None}

    def checkpointed(self, now: int) -> dict[str, dict[Any, Any]]:
        """What a checkpoint taken at ``now`` must hold, per state name (key -> value)."""
        return {
            "value": dict(self.value),
            "list": {k: v for k, v in self.list.items() if v},
            "map": {k: dict(v) for k, v in self.map.items() if v},
            "sum": dict(self.sum),
            "mean": dict(self.mean),
            "ttl": {k: v for k, (v, exp) in self.ttl.items() if exp > now},
            "timers:processing": {k: set(v) for k, v in self.timers.items() if v},
        }
