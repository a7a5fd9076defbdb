"""Compare spate.keygroups against real Spark ``hash()`` / ``pmod(hash(), 128)`` for every supported type."""

from __future__ import annotations

import datetime as dt
import decimal
import random
import struct
import time
from typing import Any

import pytest

from spate.keygroups import compile_key_hasher, key_group, key_groups, spark_hash

pytestmark = pytest.mark.spark

N = 10_000
MAXP = 128
D = decimal.Decimal

# (column name, Spark DDL type, type PySpark infers for the Python values or None if not inferrable)
COLUMNS = [
    ("l", "bigint", "bigint"),
    ("i", "int", None),
    ("sh", "smallint", None),
    ("by", "tinyint", None),
    ("bo", "boolean", "boolean"),
    ("f", "float", None),
    ("d", "double", "double"),
    ("sc", "string", "string"),
    ("sb", "string", "string"),
    ("bi", "binary", "binary"),
    ("dt", "date", "date"),
    ("ts", "timestamp", "timestamp"),
    ("tn", "timestamp_ntz", None),
    ("d10", "decimal(10,2)", None),
    ("d38", "decimal(38,18)", "decimal(38,18)"),
    ("d20", "decimal(20,0)", None),
]
TYPES = dict((name, ddl) for name, ddl, _ in COLUMNS)

MULTI = [
    ("l", "sc"),
    ("i", "d", "dt"),
    ("sb", "d38", "ts"),
    ("bo", "bi", "f"),
    ("d10", "tn"),
    ("sh", "by", "d20"),
]

_CHAR_RANGES = [(0x00, 0x7F), (0x80, 0x7FF), (0x800, 0xD7FF), (0xE000, 0xFFFF), (0x10000, 0x10FFFF)]


def _rand_char(rng: random.Random, max_bytes: int = 4) -> str:
    ranges = [r for r in _CHAR_RANGES if len(chr(r[0]).encode()) <= max_bytes]
    lo, hi = rng.choice(ranges)
    return chr(rng.randint(lo, hi))


def _string_by_chars(rng: random.Random, n_chars: int) -> str:
    return "".join(_rand_char(rng) for _ in range(n_chars))


def _string_by_bytes(rng: random.Random, n_bytes: int) -> str:
    out = []
    left = n_bytes
    while left:
        c = _rand_char(rng, min(left, 4))
        out.append(c)
        left -= len(c.encode())
    return "".join(out)


def _rand_decimal(rng: random.Random, int_digits: int, frac_digits: int) -> decimal.Decimal:
    ip = rng.randint(0, 10 ** rng.randint(0, int_digits) - 1) if int_digits else 0
    fd = rng.randint(0, frac_digits)
    fp = rng.randint(0, 10**fd - 1) if fd else 0
    sign = "-" if rng.random() < 0.5 else ""
    return D(f"{sign}{ip}.{fp:0{fd}d}" if fd else f"{sign}{ip}")


def _special(i: int, specials: list[Any], rng_value: Any) -> Any:
    return specials[i] if i < len(specials) else rng_value


def _make_rows(local_utc: bool) -> list[tuple[Any, ...]]:
    rng = random.Random(20240611)
    tz = [dt.UTC, dt.timezone(dt.timedelta(hours=5, minutes=30)), dt.timezone(dt.timedelta(hours=-8))]
    long_specials = [-(2**63), 2**63 - 1, 0, -1, 1, 2**31, -(2**31) - 1, 2**32, -(2**32), 42]
    int_specials = [-(2**31), 2**31 - 1, 0, -1, 1]
    float_specials = [
        0.0,
        -0.0,
        float("nan"),
        -float("nan"),
        float("inf"),
        float("-inf"),
        1.0,
        -1.0,
        3.4028234663852886e38,
        1.401298464324817e-45,
        0.1,
        1e39,
        -1e39,
    ]
    double_specials = [
        0.0,
        -0.0,
        float("nan"),
        -float("nan"),
        float("inf"),
        float("-inf"),
        1.0,
        -1.0,
        1.7976931348623157e308,
        5e-324,
        0.1,
    ]
    dec10_specials = [
        D("1.005"),
        D("-1.005"),
        D("1.015"),
        D("0"),
        D("-0.00"),
        D("99999999.99"),
        D("-99999999.994"),
        D("1E+5"),
        D("1.5"),
        D("NaN"),
    ]
    dec38_specials = [
        D("1.5"),
        D("0"),
        D("1E-30"),
        D("1.0000000000000000005"),
        D("-1.0000000000000000005"),
        D("99999999999999999999.999999999999999999"),
        D("-99999999999999999999.999999999999999999"),
        D("0.000000000000000001"),
        D("-0.000000000000000001"),
        D("127"),
        D("-128"),
        D("128"),
    ]
    dec20_specials = [
        D("99999999999999999999"),
        D("-99999999999999999999"),
        D("0.5"),
        D("-0.5"),
        D("1.4999"),
        D("9223372036854775807"),
        D("9223372036854775808"),
        D("-9223372036854775809"),
    ]

    rows = []

    def maybe_null(v: Any, i: int) -> Any:
        return None if (i >= 20 and rng.random() < 0.04) else v

    for i in range(N):
        r = rng.random()
        if r < 0.3:
            lv = rng.randint(-(2**63), 2**63 - 1)
        elif r < 0.6:
            lv = rng.randint(-1000, 1000)
        else:
            lv = rng.randint(-(2**40), 2**40)
        f_bits = struct.unpack("<f", struct.pack("<I", rng.getrandbits(32)))[0]
        fv = f_bits if rng.random() < 0.5 else rng.uniform(-1e6, 1e6)
        dv = (
            struct.unpack("<d", struct.pack("<Q", rng.getrandbits(64)))[0]
            if rng.random() < 0.5
            else rng.uniform(-1e9, 1e9)
        )
        date_v = dt.date.fromordinal(rng.randint(1, dt.date(9999, 12, 31).toordinal()))
        if rng.random() < 0.5:
            date_v = dt.date.fromordinal(rng.randint(dt.date(1900, 1, 1).toordinal(), dt.date(2100, 1, 1).toordinal()))
        base = dt.datetime(1900, 1, 1) + dt.timedelta(microseconds=rng.randint(0, 300 * 365 * 86400 * 10**6))
        if i < 4:
            base = [
                dt.datetime(1970, 1, 1),
                dt.datetime(1969, 12, 31, 23, 59, 59, 999999),
                dt.datetime(1, 1, 2),
                dt.datetime(9999, 12, 30, 23, 59, 59, 999999),
            ][i]
        ts_v: dt.datetime = base.replace(tzinfo=rng.choice(tz)) if i > 3 else base.replace(tzinfo=dt.UTC)
        if local_utc and rng.random() < 0.2:
            ts_v = base  # naive: PySpark uses the local zone, spate uses UTC; equal only when local is UTC
        tn_v = base
        rows.append(
            (
                maybe_null(_special(i, long_specials, lv), i),
                maybe_null(_special(i, int_specials, rng.randint(-(2**31), 2**31 - 1)), i),
                maybe_null(rng.randint(-(2**15), 2**15 - 1), i),
                maybe_null(rng.randint(-128, 127), i),
                maybe_null(rng.random() < 0.5, i),
                maybe_null(_special(i, float_specials, fv), i),
                maybe_null(_special(i, double_specials, dv), i),
                maybe_null(_string_by_chars(rng, i % 17), i),
                maybe_null(_string_by_bytes(rng, i % 17), i),
                maybe_null(rng.randbytes(i % 17), i),
                maybe_null(date_v, i),
                maybe_null(ts_v, i),
                maybe_null(tn_v, i),
                maybe_null(_special(i, dec10_specials, _rand_decimal(rng, 7, 4)), i),
                maybe_null(_special(i, dec38_specials, _rand_decimal(rng, 19, 24)), i),
                maybe_null(_special(i, dec20_specials, _rand_decimal(rng, 19, 3)), i),
            )
        )
    return rows


def test_hash_matches_spark_for_every_type(spark: Any) -> None:
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    local_utc = time.localtime().tm_gmtoff == 0 and time.gmtime(0) == time.localtime(0)
    rows = _make_rows(local_utc)
    ddl = ", ".join(f"{name} {ddl}" for name, ddl, _ in COLUMNS)
    df = spark.createDataFrame(rows, ddl)
    schema: StructType = df.schema

    exprs: list[tuple[str, ...]] = [(name,) for name, _, _ in COLUMNS] + list(MULTI)
    select = []
    for j, cols in enumerate(exprs):
        select.append(F.hash(*cols).alias(f"h{j}"))
        select.append(F.pmod(F.hash(*cols), F.lit(MAXP)).alias(f"g{j}"))
    # Keep the input values too: Spark's (rounded) values are what we must reproduce from the Python input.
    result = df.select(*select).collect()
    assert len(result) == N

    failures = []
    for j, cols in enumerate(exprs):
        idx = [[name for name, _, _ in COLUMNS].index(c) for c in cols]
        types = [TYPES[c] for c in cols]
        hasher = compile_key_hasher(types)
        struct_hasher = compile_key_hasher(StructType([schema[c] for c in cols]))
        keys = [rows[r][idx[0]] if len(idx) == 1 else tuple(rows[r][k] for k in idx) for r in range(N)]
        spark_h = [row[f"h{j}"] for row in result]
        spark_g = [row[f"g{j}"] for row in result]
        ours_h = [hasher(k) for k in keys]
        assert ours_h[:500] == [struct_hasher(k) for k in keys[:500]]
        assert key_groups(keys, MAXP, types) == spark_g, cols
        for r in range(N):
            if ours_h[r] != spark_h[r] or (r < 2000 and key_group(keys[r], MAXP, types) != spark_g[r]):
                failures.append((cols, keys[r], spark_h[r], ours_h[r]))
        # Without key_types the inferred Spark type must give the same answer where PySpark infers it.
        if len(cols) == 1 and dict((n, inf) for n, _, inf in COLUMNS)[cols[0]] == types[0]:
            for r in range(N):
                if spark_hash(keys[r]) != spark_h[r]:
                    failures.append((cols, "inferred", keys[r], spark_h[r], spark_hash(keys[r])))
    assert not failures, f"{len(failures)} mismatches, first: {failures[:5]}"


def test_inferred_multi_column_keys_match_spark(spark: Any) -> None:
    from pyspark.sql import functions as F

    rng = random.Random(7)
    rows = []
    for _ in range(2000):
        rows.append(
            (
                rng.choice([None, rng.randint(-(2**63), 2**63 - 1)]),
                rng.choice([None, _string_by_chars(rng, rng.randint(0, 12))]),
                rng.choice([None, rng.uniform(-1e3, 1e3)]),
                rng.choice([None, rng.random() < 0.5]),
            )
        )
    df = spark.createDataFrame(rows, "a bigint, b string, c double, d boolean")
    result = df.select(F.hash("a", "b", "c", "d").alias("h"), F.pmod(F.hash("a", "b"), F.lit(MAXP)).alias("g"))
    got = result.collect()
    for row, out in zip(rows, got, strict=True):
        assert spark_hash(row) == out["h"], row
        assert key_group(row[:2], MAXP) == out["g"], row


def test_numpy_vectorised_matches_spark(spark: Any) -> None:
    import numpy as np
    from pyspark.sql import functions as F

    rng = np.random.default_rng(3)
    longs = rng.integers(-(2**63), 2**63 - 1, size=N, dtype=np.int64, endpoint=True)
    ints = rng.integers(-(2**31), 2**31 - 1, size=N, dtype=np.int64, endpoint=True)
    doubles = rng.normal(size=N) * 1e6
    doubles[:3] = [0.0, -0.0, np.nan]
    df = spark.createDataFrame(
        list(zip(longs.tolist(), ints.tolist(), doubles.tolist(), strict=True)), "l bigint, i int, d double"
    )
    out = df.select(*[F.pmod(F.hash(c), F.lit(MAXP)).alias(c) for c in ("l", "i", "d")]).collect()
    assert key_groups(longs, MAXP) == [r["l"] for r in out]
    assert key_groups(ints, MAXP, ["int"]) == [r["i"] for r in out]
    assert key_groups(doubles, MAXP) == [r["d"] for r in out]


def test_negative_zero_and_nans_hash_and_group_as_in_spark(spark: Any, tmp_path: Any) -> None:
    """Spark normalizes -0.0 to 0.0 and every NaN to one NaN before hashing and grouping: spate's key group of
    each is Spark's pmod(hash(col), n), and LocalRunner counts per key exactly as Spark's groupBy does."""
    from pyspark.sql import functions as F

    from spate import LocalRunner, Processor, ValueStateDescriptor

    def double(bits: int) -> float:
        return struct.unpack("<d", struct.pack("<Q", bits))[0]

    values = [0.0, -0.0, float("nan"), double(0x7FF8000000000001), double(0xFFF8000000000000),
              double(0x7FF80000DEADBEEF), 1.5, -0.0, double(0x7FF8000000000001)]
    df = spark.createDataFrame([(v,) for v in values], "d double")
    spark_groups = [r["g"] for r in df.select(F.pmod(F.hash("d"), F.lit(MAXP)).alias("g")).collect()]
    assert [key_group(v, MAXP) for v in values] == spark_groups
    spark_counts = {("NaN" if v != v else v): n for v, n in df.groupBy("d").count().collect()}

    class Count(Processor):
        def open(self, ctx: Any) -> None:
            self.count = ctx.state(ValueStateDescriptor("count", default=0))

        def process(self, key: Any, rows: list, ctx: Any) -> Any:
            self.count.update(self.count.value() + len(rows))
            yield {"key": "NaN" if key != key else key, "count": self.count.value()}

    half = len(values) // 2
    with LocalRunner(Count, key="d", checkpoint_root=str(tmp_path / "c"), max_parallelism=MAXP) as runner:
        results = runner.run([[{"d": v} for v in values[:half]], [{"d": v} for v in values[half:]]])
    final = {r["key"]: r["count"] for res in results for r in res.outputs}
    assert final == spark_counts == {0.0: 3, "NaN": 5, 1.5: 1}


def test_routed_rows_carry_spates_key_group_and_subtask_whatever_the_column_names(spark):
    """The routing columns are SQL expressions: key columns named with spaces, dots and backticks are quoted."""
    from spate.keygroups import subtask_for_key_group
    from spate.spark.routed_frame import RoutedFrames
    from spate.spark.task import KG_COLUMN, SUBTASK_COLUMN

    names = ("user id", "a`b.c")
    rows = [(f"u{i}", i * 7919) for i in range(300)]
    df = spark.createDataFrame(rows, "`user id` string, `a``b.c` bigint")
    for p in (1, 3, 7):
        got = RoutedFrames(names).rows(df, p, MAXP).collect()
        for r in got:
            kg = key_group((r["user id"], r["a`b.c"]), MAXP, ["string", "bigint"])
            assert (r[KG_COLUMN], r[SUBTASK_COLUMN]) == (kg, subtask_for_key_group(MAXP, p, kg))
        assert len(got) == len(rows)
