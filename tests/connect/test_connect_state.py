"""State bootstrapped from a batch DataFrame on a Spark Connect session (``write_savepoint``: the client drives
the one batch job, the subtasks run in ``mapInArrow``), restored at other parallelisms, and read back over Connect
(``read_state``: one ``mapInArrow`` task per subtask). tests/spark/test_state_frame.py runs over Connect too."""

from __future__ import annotations

import sys
from collections import Counter

import pytest
from pyspark import cloudpickle

from spate import LocalRunner, Processor, ValueStateDescriptor
from spate.spark.state_frame import read_state, write_savepoint

pytestmark = pytest.mark.spark
cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the server's Python cannot import the tests
TOTAL = ValueStateDescriptor("total", default=0)
ROWS = [{"user": f"u{i % 7}", "n": i} for i in range(50)]


class Sum(Processor):
    def open(self, ctx):
        self.total = ctx.state(TOTAL)

    def process(self, key, rows, ctx):
        self.total.update(self.total.value() + sum(r["n"] for r in rows))
        yield {"user": key, "total": self.total.value()}


def test_a_savepoint_written_over_connect_restores_at_other_parallelisms(connect, tmp_path):
    target = str(tmp_path / "sp")
    meta = write_savepoint(connect.createDataFrame(ROWS, "user string, n long"), "user", target, Sum(),
                           parallelism=2, max_parallelism=32)
    assert (meta.parallelism, meta.max_parallelism, meta.is_savepoint) == (2, 32, True)
    want: Counter = Counter()
    for r in ROWS:
        want[r["user"]] += r["n"]
    for p in (3, 1):
        with LocalRunner(Sum, key="user", checkpoint_root=str(tmp_path / f"run{p}"), parallelism=p,
                         restore_from=target) as runner:
            out = runner.run_batch(0, [{"user": u, "n": 0} for u in want]).outputs
        assert {o["user"]: o["total"] for o in out} == dict(want), p


def test_read_state_over_connect_reads_what_was_written(connect, tmp_path):
    target = str(tmp_path / "sp")
    write_savepoint(connect.createDataFrame(ROWS, "user string, n long"), "user", target, Sum(), parallelism=3)
    frame = read_state(connect, target, "total", key_schema="user string")
    assert frame.schema.simpleString() == ("struct<key:struct<user:string>,user_key:string,value:bigint,"
                                           "key_group:int,expires_at_ms:bigint>")
    want: Counter = Counter()
    for r in ROWS:
        want[r["user"]] += r["n"]
    assert {r.key.user: r.value for r in frame.collect()} == dict(want)
    assert frame.select("key_group").distinct().count() == len(want)
