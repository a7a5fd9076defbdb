"""Unit tests for spate.keygroups (no JVM). Hash vectors below were measured with Spark 4 ``hash()``."""

from __future__ import annotations

import datetime as dt
import decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spate.keygroups import (
    MAX_MAX_PARALLELISM,
    compile_key_hasher,
    default_max_parallelism,
    key_group,
    key_group_range,
    key_groups,
    normalize_key_types,
    spark_hash,
    subtask_for_key_group,
)

D = decimal.Decimal
UTC = dt.UTC

# (key, key_types or None for inference, Spark SQL expression it was measured with, expected hash)
SPARK_VECTORS: list[tuple[Any, Any, str, int]] = [
    (1, None, "hash(1L)", -1712319331),
    (-1, None, "hash(-1L)", -939490007),
    (2**63 - 1, None, "hash(9223372036854775807L)", -1604625029),
    (-(2**63), None, "hash(-9223372036854775808L)", -853646085),
    (1, ["int"], "hash(1)", -559580957),
    (-(2**31), ["int"], "hash(cast(-2147483648 as int))", 723455942),
    (1, ["smallint"], "hash(cast(1 as smallint))", -559580957),
    (1, ["tinyint"], "hash(cast(1 as tinyint))", -559580957),
    (-1, ["tinyint"], "hash(cast(-1 as tinyint))", -1604776387),
    (True, None, "hash(true)", -559580957),
    (False, None, "hash(false)", 933211791),
    (None, None, "hash(null)", 42),
    ((None, None), None, "hash(null, null)", 42),
    (0.0, ["float"], "hash(cast(0.0 as float))", 933211791),
    (-0.0, ["float"], "hash(cast(-0.0 as float))", 933211791),
    (float("nan"), ["float"], "hash(cast('NaN' as float))", -349261430),
    (1.5, ["float"], "hash(cast(1.5 as float))", -221251528),
    (float("-inf"), ["float"], "hash(cast('-Infinity' as float))", 427440766),
    (0.0, None, "hash(0.0D)", -1670924195),
    (-0.0, None, "hash(-0.0D)", -1670924195),
    (float("nan"), None, "hash(cast('NaN' as double))", -1281358385),
    (1.5, None, "hash(cast(1.5 as double))", 1290763749),
    (float("inf"), None, "hash(cast('Infinity' as double))", 833680482),
    ("", None, "hash('')", 142593372),
    ("a", None, "hash('a')", 1485273170),
    ("abcd", None, "hash('abcd')", -396302900),
    ("abcde", None, "hash('abcde')", 814637928),
    ("hello world", None, "hash('hello world')", -1528836094),
    ("ü", None, "hash('ü')", -1098725648),
    ("héllo", None, "hash('héllo')", 1212979866),
    ("日本語", None, "hash('日本語')", -1143049834),
    ("😀", None, "hash('😀')", 1877935379),
    (b"\x00", None, "hash(X'00')", -783713497),
    (b"\xff", None, "hash(X'FF')", 1398487324),
    (bytearray(b"\xde\xad\xbe\xef\x80"), None, "hash(X'DEADBEEF80')", 1357496943),
    (dt.date(1970, 1, 1), None, "hash(date'1970-01-01')", 933211791),
    (dt.date(1969, 12, 31), None, "hash(date'1969-12-31')", -1604776387),
    (dt.date(2024, 2, 29), None, "hash(date'2024-02-29')", 653915859),
    (dt.datetime(1970, 1, 1, 0, 0, 1, tzinfo=UTC), None, "hash(timestamp'1970-01-01 00:00:01')", -1715802514),
    (dt.datetime(2024, 1, 1, 12, 34, 56, 789012, tzinfo=UTC), None, "timestamp'2024-01-01 12:34:56.789012'", 915934044),
    (
        dt.datetime(2024, 1, 1, 12, 34, 56, 789012),
        ["timestamp_ntz"],
        "timestamp_ntz'2024-01-01 12:34:56.789012'",
        915934044,
    ),
    (D("1.5"), ["decimal(10,2)"], "hash(cast(1.5 as decimal(10,2)))", -2056712946),
    (D("-12.34"), ["decimal(10,2)"], "hash(cast(-12.34 as decimal(10,2)))", 180183791),
    (D("1.5"), None, "hash(cast(1.5 as decimal(38,18)))", -144108884),
    (D("0"), None, "hash(cast(0 as decimal(38,18)))", -783713497),
    (D("-1"), ["decimal(38,18)"], "hash(cast(-1 as decimal(38,18)))", -181059451),
    (D("12345678901234567890"), ["decimal(20,0)"], "hash(cast(12345678901234567890 as decimal(20,0)))", -493604283),
    (D("-128"), ["decimal(20,0)"], "hash(cast(-128 as decimal(20,0)))", 775851899),
    (D("127"), ["decimal(20,0)"], "hash(cast(127 as decimal(20,0)))", 1185089389),
    (D("1"), ["decimal(18,0)"], "hash(cast(1 as decimal(18,0)))", -1712319331),
    ((1, "a"), None, "hash(1L, 'a')", 573093329),
    ((1, None, "a"), None, "hash(1L, null, 'a')", 573093329),
    ((None, 1), None, "hash(null, 1L)", -1712319331),
    ((1, 2, "x"), ["int", "bigint", "string"], "hash(1, 2L, 'x')", -17463996),
    ((None, "a"), ["int", "string"], "hash(cast(null as int), 'a')", 1485273170),
    ((True, 1.0, dt.date(2000, 1, 1)), None, "hash(true, 1.0D, date'2000-01-01')", -48898495),
]


@pytest.mark.parametrize(("key", "types", "sql", "expected"), SPARK_VECTORS, ids=[v[2] for v in SPARK_VECTORS])
def test_spark_hash_vectors(key: Any, types: Any, sql: str, expected: int) -> None:
    assert spark_hash(key, types) == expected
    assert compile_key_hasher(types)(key) == expected
    assert key_group(key, 128, types) == expected % 128
    assert key_groups([key, key], 128, types) == [expected % 128] * 2
    # twice, to go through the memo tables as well
    assert spark_hash(key, types) == expected
    assert key_group(key, 128, types) == expected % 128


def test_pmod_is_non_negative() -> None:
    assert spark_hash(1) < 0
    assert key_group(1, 128) == (-1712319331) % 128 == 29
    assert key_group(1, 1) == 0
    assert key_group(1, MAX_MAX_PARALLELISM) == (-1712319331) % MAX_MAX_PARALLELISM


# ---------------------------------------------------------------------------------------------------------
# key_types forms
# ---------------------------------------------------------------------------------------------------------


class _FakeType:
    """Duck-typed stand-in for a pyspark DataType."""

    def __init__(self, s: str) -> None:
        self._s = s

    def simpleString(self) -> str:  # noqa: N802 - pyspark's name
        return self._s


class _FakeField:
    def __init__(self, t: _FakeType) -> None:
        self.dataType = t


class _FakeStruct(_FakeType):
    def __init__(self, *types: str) -> None:
        super().__init__("struct<...>")
        self.fields = [_FakeField(_FakeType(t)) for t in types]


def test_type_aliases_and_forms() -> None:
    assert normalize_key_types(["integer", "LONG", "short", "byte", "Decimal(10, 2)", "decimal"]) == (
        "int",
        "bigint",
        "smallint",
        "tinyint",
        "decimal(10,2)",
        "decimal(10,0)",
    )
    assert normalize_key_types("bigint") == ("bigint",)
    assert normalize_key_types(_FakeType("timestamp_ntz")) == ("timestamp_ntz",)
    assert normalize_key_types(_FakeStruct("int", "string")) == ("int", "string")
    assert spark_hash((1, 2, "x"), _FakeStruct("int", "bigint", "string")) == -17463996
    assert spark_hash((1, 2, "x"), [_FakeType("int"), "long", _FakeType("string")]) == -17463996
    assert spark_hash(1, "int") == spark_hash((1,), ["int"]) == -559580957


def test_real_pyspark_types_if_available() -> None:
    import pyspark.sql.types as types
    schema = types.StructType(
        [
            types.StructField("a", types.IntegerType()),
            types.StructField("b", types.LongType()),
            types.StructField("c", types.StringType()),
        ]
    )
    assert spark_hash((1, 2, "x"), schema) == -17463996
    assert spark_hash(D("1.5"), [types.DecimalType(38, 18)]) == -144108884
    assert normalize_key_types([types.ShortType(), types.ByteType(), types.TimestampNTZType()]) == (
        "smallint",
        "tinyint",
        "timestamp_ntz",
    )


def test_inference_matches_explicit_types() -> None:
    samples = [
        (5, "bigint"),
        (2.5, "double"),
        ("x", "string"),
        (b"xy", "binary"),
        (memoryview(b"xy"), "binary"),
        (True, "boolean"),
        (dt.date(2020, 5, 17), "date"),
        (dt.datetime(2020, 5, 17, 1, 2, 3, tzinfo=UTC), "timestamp"),
        (D("3.25"), "decimal(38,18)"),
    ]
    for v, t in samples:
        assert spark_hash(v) == spark_hash(v, [t]), (v, t)
    # bool is checked before int, datetime before date
    assert spark_hash(True) != spark_hash(1)
    assert spark_hash(dt.datetime(2020, 1, 1)) != spark_hash(dt.date(2020, 1, 1))


def test_naive_timestamp_is_utc_and_ntz_ignores_tz() -> None:
    naive = dt.datetime(2024, 3, 1, 8, 0)
    assert spark_hash(naive) == spark_hash(naive.replace(tzinfo=UTC))
    plus2 = dt.datetime(2024, 3, 1, 10, 0, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    assert spark_hash(plus2) == spark_hash(naive)
    assert spark_hash(plus2, ["timestamp_ntz"]) == spark_hash(plus2.replace(tzinfo=None), ["timestamp_ntz"])


def test_decimal_rounding_half_up() -> None:
    t = ["decimal(10,2)"]
    assert spark_hash(D("1.005"), t) == spark_hash(D("1.01"), t)
    assert spark_hash(D("-1.005"), t) == spark_hash(D("-1.01"), t)
    assert spark_hash(D("1.0049"), t) == spark_hash(D("1.00"), t)
    assert spark_hash(D("1E+2"), t) == spark_hash(D("100"), t) == spark_hash(100, t)
    assert spark_hash(D("NaN"), t) == 42  # PySpark turns Decimal NaN into null


def test_float_column_rounds_double_to_float32() -> None:
    assert spark_hash(0.1, ["float"]) == spark_hash(0.10000000149011612, ["float"])
    assert spark_hash(1e39, ["float"]) == spark_hash(float("inf"), ["float"])
    assert spark_hash(-(2**70), ["double"]) == spark_hash(-float(2**70), ["double"])


# ---------------------------------------------------------------------------------------------------------
# errors
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [[1], {"a": 1}, {1}, object(), 1j, (1, [2]), dt.time(1, 2), dt.timedelta(1)])
def test_unsupported_key_types_raise_type_error(bad: Any) -> None:
    with pytest.raises(TypeError, match="key_types"):
        spark_hash(bad)
    with pytest.raises(TypeError, match="key_types"):
        key_group(bad, 128)


def test_type_error_names_type() -> None:
    with pytest.raises(TypeError, match="list"):
        spark_hash([1, 2])


def test_int_out_of_range() -> None:
    with pytest.raises(ValueError, match="int64"):
        spark_hash(2**63)
    with pytest.raises(ValueError, match="int64"):
        key_group(-(2**63) - 1, 128)
    with pytest.raises(ValueError):
        spark_hash(2**31, ["int"])
    with pytest.raises(ValueError):
        spark_hash(-129, ["tinyint"])
    with pytest.raises(ValueError):
        spark_hash(40000, ["smallint"])
    with pytest.raises(ValueError):
        spark_hash(D("123456789.5"), ["decimal(10,2)"])
    with pytest.raises(ValueError):
        spark_hash(D("Infinity"), ["decimal(10,2)"])


def test_bad_key_types() -> None:
    with pytest.raises(TypeError, match="unsupported Spark key type"):
        spark_hash(1, ["varchar(10)"])
    with pytest.raises(TypeError):
        spark_hash(1, ["array<int>"])
    with pytest.raises(TypeError):
        spark_hash("a", [_FakeType("string collate UNICODE_CI")])
    with pytest.raises(TypeError):
        spark_hash(1, [int])
    with pytest.raises(ValueError):
        spark_hash(1, ["decimal(39,2)"])
    with pytest.raises(ValueError):
        spark_hash(1, [])
    # value does not match the declared type
    with pytest.raises(TypeError):
        spark_hash("1", ["bigint"])
    with pytest.raises(TypeError):
        spark_hash(1, ["string"])
    with pytest.raises(TypeError):
        spark_hash(dt.date(2020, 1, 1), ["timestamp"])


def test_wrong_column_count() -> None:
    with pytest.raises(ValueError):
        spark_hash((1, 2), ["bigint"])
    with pytest.raises(ValueError):
        spark_hash(1, ["bigint", "string"])
    with pytest.raises(ValueError):
        spark_hash("ab", ["string", "string"])
    with pytest.raises(ValueError):
        spark_hash((1, "a", 3), ["bigint", "string"])
    with pytest.raises(ValueError):
        spark_hash((1, "a"), ["bigint", "string", "int"])


@pytest.mark.parametrize("maxp", [0, -1, MAX_MAX_PARALLELISM + 1])
def test_key_group_bad_max_parallelism(maxp: int) -> None:
    with pytest.raises(ValueError, match="max_parallelism"):
        key_group(1, maxp)
    with pytest.raises(ValueError, match="max_parallelism"):
        key_groups([1], maxp)


def test_key_group_max_parallelism_must_be_int() -> None:
    with pytest.raises(TypeError):
        key_group(1, 128.0)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------------------
# numpy batch path
# ---------------------------------------------------------------------------------------------------------


def test_numpy_batch_matches_scalar() -> None:
    import numpy as np
    rng = np.random.default_rng(0)
    longs = rng.integers(-(2**63), 2**63 - 1, size=2000, dtype=np.int64, endpoint=True)
    assert key_groups(longs, 128) == [key_group(int(v), 128) for v in longs]
    ints = rng.integers(-(2**31), 2**31 - 1, size=2000, dtype=np.int32, endpoint=True)
    assert key_groups(ints, 1000, ["int"]) == [key_group(int(v), 1000, ["int"]) for v in ints]
    small = ints.astype(np.int8)
    assert key_groups(small, 77, ["tinyint"]) == [key_group(int(v), 77, ["tinyint"]) for v in small]
    doubles = rng.normal(size=2000) * 1e9
    doubles[:4] = [0.0, -0.0, np.nan, np.inf]
    assert key_groups(doubles, 128) == [key_group(float(v), 128) for v in doubles]
    unsigned = np.array([0, 5, 2**63 - 1], dtype=np.uint64)
    assert key_groups(unsigned, 128) == [key_group(int(v), 128) for v in unsigned]
    with pytest.raises(ValueError):
        key_groups(np.array([2**63], dtype=np.uint64), 128)
    with pytest.raises(ValueError):
        key_groups(np.array([2**40], dtype=np.int64), 128, ["int"])
    # types without a vectorised path fall back to the scalar loop
    assert key_groups(ints, 128, ["double"]) == [key_group(int(v), 128, ["double"]) for v in ints]


# ---------------------------------------------------------------------------------------------------------
# Flink key-group range formulas
# ---------------------------------------------------------------------------------------------------------


def _ranges(maxp: int, p: int) -> list[tuple[int, int]]:
    return [(r.start, r.stop - 1) for r in (key_group_range(maxp, p, i) for i in range(p))]


def test_range_examples() -> None:
    assert _ranges(128, 3) == [(0, 42), (43, 85), (86, 127)]
    assert _ranges(10, 3) == [(0, 3), (4, 6), (7, 9)]
    assert _ranges(128, 1) == [(0, 127)]
    assert _ranges(4, 4) == [(0, 0), (1, 1), (2, 2), (3, 3)]
    assert key_group_range(128, 3, 1) == range(43, 86)


def test_subtask_examples() -> None:
    assert subtask_for_key_group(128, 3, 42) == 0
    assert subtask_for_key_group(128, 3, 43) == 1
    assert subtask_for_key_group(128, 3, 127) == 2
    assert subtask_for_key_group(10, 3, 3) == 0
    assert subtask_for_key_group(10, 3, 4) == 1


@pytest.mark.parametrize(
    ("p", "expected"),
    [
        (1, 128),
        (2, 128),
        (85, 128),
        (86, 256),
        (100, 256),
        (1000, 2048),
        (21845, 32768),
        (21846, 32768),
        (32768, 32768),
    ],
)
def test_default_max_parallelism(p: int, expected: int) -> None:
    assert default_max_parallelism(p) == expected


def test_default_max_parallelism_errors() -> None:
    for bad in (0, -3, MAX_MAX_PARALLELISM + 1):
        with pytest.raises(ValueError, match="parallelism"):
            default_max_parallelism(bad)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, MAX_MAX_PARALLELISM).flatmap(lambda m: st.tuples(st.just(m), st.integers(1, min(m, 512)))))
def test_ranges_partition_key_groups(mp: tuple[int, int]) -> None:
    maxp, p = mp
    expected_start = 0
    for i in range(p):
        r = key_group_range(maxp, p, i)
        assert r.step == 1
        assert r.start == expected_start
        assert len(r) >= 1
        expected_start = r.stop
        for kg in (r.start, r.stop - 1, (r.start + r.stop) // 2):
            assert subtask_for_key_group(maxp, p, kg) == i
    assert expected_start == maxp


@pytest.mark.parametrize(("maxp", "p"), [(128, 3), (10, 3), (7, 7), (1, 1), (1000, 999), (32768, 3)])
def test_every_key_group_maps_back_to_its_range(maxp: int, p: int) -> None:
    owner = {}
    for i in range(p):
        for kg in key_group_range(maxp, p, i):
            assert kg not in owner
            owner[kg] = i
    assert sorted(owner) == list(range(maxp))
    assert all(subtask_for_key_group(maxp, p, kg) == i for kg, i in owner.items())


@pytest.mark.parametrize(
    ("maxp", "p", "i"),
    [(0, 1, 0), (MAX_MAX_PARALLELISM + 1, 1, 0), (128, 0, 0), (128, 129, 0), (128, -1, 0), (128, 3, 3), (128, 3, -1)],
)
def test_range_errors(maxp: int, p: int, i: int) -> None:
    with pytest.raises(ValueError):
        key_group_range(maxp, p, i)


@pytest.mark.parametrize(("maxp", "p", "kg"), [(128, 3, 128), (128, 3, -1), (128, 200, 5), (0, 1, 0)])
def test_subtask_errors(maxp: int, p: int, kg: int) -> None:
    with pytest.raises(ValueError):
        subtask_for_key_group(maxp, p, kg)


def test_non_int_arguments() -> None:
    with pytest.raises(TypeError):
        key_group_range(128.0, 3, 0)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        subtask_for_key_group(128, 3, 1.0)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        default_max_parallelism(True)
