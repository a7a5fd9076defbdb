"""Outputs of a pyspark ``StatefulProcessor`` run through spate's adapter are coerced to the output schema as
Spark coerces them (the same values, side by side with real Spark on the same input files) or fail the batch
where Spark fails, with an ``OutputError`` naming the field; what Spark would fill with nulls fails too.

Spark's conversions (Spark 4.3 worker.py): DataFrames of ``transformWithStateInPandas`` go through
``PandasToArrowConversion.convert`` (columns by name, extra columns ignored, checked Arrow casts as
``spark.sql.execution.pandas.convertToArrowArraySafely`` follows ANSI mode, on by default); Rows of
``transformWithState`` through ``Row.asDict(True)`` and ``pa.RecordBatch.from_pylist`` on the output schema.
A few failing cases run on real Spark; the rest are checked against those conversion functions, called as the
worker calls them (``spark_converts``).
"""

from __future__ import annotations

import datetime as dt
import sys
from decimal import Decimal

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from pyspark import cloudpickle
from pyspark.sql import Row
from pyspark.sql.streaming import StatefulProcessor

from helpers.file_source import write_files
from helpers.spark_query import drain
from spate import LocalRunner
from spate.errors import OutputError
from spate.spark.adapter import StatefulProcessorAdapter
from spate.spark.stream import transform_with_state

pytestmark = pytest.mark.spark
cloudpickle.register_pickle_by_value(sys.modules[__name__])

ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
MISSING = "<missing>"  # the case's column is left out of what the processor yields
T = dt.datetime(2026, 1, 2, 3, 4, 5, 123456)
PLUS2 = dt.timezone(dt.timedelta(hours=2))
STRUCT, MAP = "struct<a:bigint,b:string>", "map<string,bigint>"

# case: (field type, the two values yielded in the case's column)
PANDAS_COERCED = {
    "int_to_double": ("double", [1, 2]),
    "int_to_float": ("float", [1, 3]),
    "whole_float_to_long": ("bigint", [1.0, -2.0]),
    "whole_float_none_to_int": ("int", [1.0, None]),
    "np_int64_to_int": ("int", [np.int64(3), np.int64(-4)]),
    "str_to_long": ("bigint", ["5", "-6"]),
    "bool_to_long": ("bigint", [True, False]),
    "float_to_decimal": ("decimal(10,2)", [1.5, 2.25]),
    "str_to_double": ("double", ["1.5", "2"]),
    "bytes_to_string": ("string", [b"ab", None]),
    "int_to_boolean": ("boolean", [1, 0]),
    "str_to_boolean": ("boolean", ["true", "false"]),
    "naive_to_timestamp": ("timestamp", [T, pd.Timestamp(T)]),
    "aware_to_timestamp": ("timestamp", [T.replace(tzinfo=PLUS2), None]),
    "paris_to_timestamp": ("timestamp", [pd.Timestamp(T, tz="Europe/Paris")] * 2),
    "int_to_timestamp": ("timestamp", [1767322000, 0]),
    "datetime_to_date": ("date", [T, pd.Timestamp(T)]),
    "str_to_binary": ("binary", ["ab", b"cd"]),
    "int_to_binary": ("binary", [1, 2]),
    "sequences_to_array": ("array<bigint>", [(1, 2), np.array([3])]),
    "floats_to_array": ("array<bigint>", [[1.5], [None, -2.5]]),
    "strs_to_array": ("array<bigint>", [["1"], ["2", None]]),
    "struct_extra_or_tuple": (STRUCT, [{"a": 1, "b": "x", "c": 2}, (1, "y")]),
    "struct_coerced": (STRUCT, [{"a": 1.5, "b": "x"}, {"a": -2.5, "b": None}]),
    "struct_strs_coerced": (STRUCT, [{"a": "1", "b": "x"}, {"a": "2", "b": None}]),
    "map_coerced": (MAP, [{"k": 1.5}, {"k": None}]),
    "all_none": ("bigint", [None, None]),
}
ROW_COERCED = {
    "int_to_decimal": ("decimal(10,2)", [1, -2]),
    "int_to_double": ("double", [1, 2**53]),
    "bool_to_double": ("double", [True, False]),
    "float_to_long": ("bigint", [1.5, -2.7]),
    "np_ints_to_int": ("int", [np.int64(3), np.int32(4)]),
    "decimal_to_long": ("bigint", [Decimal("3"), None]),
    "float_to_float": ("float", [1.1, None]),
    "bytes_to_string": ("string", [b"ab", None]),
    "naive_to_timestamp": ("timestamp", [T, pd.Timestamp(T)]),
    "aware_to_timestamp": ("timestamp", [T.replace(tzinfo=PLUS2), pd.Timestamp(T, tz="Europe/Paris")]),
    "int_to_timestamp": ("timestamp", [1767322000, 0]),
    "datetime_to_date": ("date", [T, pd.Timestamp(T)]),
    "int_to_date": ("date", [20000, 0]),
    "str_to_binary": ("binary", ["ab", bytearray(b"cd")]),
    "sequences_to_array": ("array<bigint>", [(1, 2), np.array([3])]),
    "floats_to_array": ("array<bigint>", [[1.5], [None]]),
    "struct_extra": (STRUCT, [{"a": 1, "b": "x", "c": 2}, {"a": 2, "b": None}]),
    "struct_tuples": (STRUCT, [(1, "y"), (2, None)]),
    "struct_rows_by_name": (STRUCT, [Row(b="x", a=1), Row(a=2.5, b=None)]),
    "map_coerced": (MAP, [{"k": 1.5}, {}]),
    "all_none": ("bigint", [None, None]),
}
PANDAS_FAILING = {  # checked casts: spark.sql.execution.pandas.convertToArrowArraySafely follows ANSI mode (on)
    "float_to_long": ("bigint", [1.0, -2.7]),
    "float_none_to_int": ("int", [1.5, None]),
    "overflow_to_int": ("int", [2**40, 2**31]),
    "decimal_too_precise": ("decimal(10,2)", [Decimal("1.234"), None]),
    "inexact_double": ("double", [2**60 + 1, 1]),
    "int_to_decimal": ("decimal(10,2)", [1, 2]),
    "str_to_decimal": ("decimal(10,2)", ["1.5", "2"]),
    "int_to_string": ("string", [1, 2]),
    "bool_to_string": ("string", [True, False]),
    "date_to_timestamp": ("timestamp", [T.date(), T.date()]),
    "str_to_timestamp": ("timestamp", ["2026-01-02", "x"]),
    "str_to_date": ("date", ["2026-01-02", "x"]),
    "int_to_date": ("date", [20000, 0]),
    "int_to_array": ("array<bigint>", [1, 2]),
    "int_key_map": (MAP, [{1: 1}, {2: 2}]),
    "pairs_to_map": (MAP, [[("k", 1)], [("j", 2)]]),
    "missing_column": ("bigint", MISSING),
}
ROW_FAILING = {
    "float_to_decimal": ("decimal(10,2)", [1.5, 2.0]),
    "decimal_too_precise": ("decimal(10,2)", [Decimal("1.234"), None]),
    "decimal_too_large": ("decimal(10,2)", [Decimal("123456789.5"), None]),
    "str_to_long": ("bigint", ["5", "6"]),
    "bool_to_long": ("bigint", [True, False]),
    "overflow_to_int": ("int", [2**40, 1]),
    "overflow_to_long": ("bigint", [2**63, 1]),
    "inexact_double": ("double", [2**60 + 1, 1]),
    "int_to_boolean": ("boolean", [1, 0]),
    "int_to_string": ("string", [1, 2]),
    "date_to_timestamp": ("timestamp", [T.date(), None]),
    "str_to_date": ("date", ["2026-01-02", None]),
}
# what Spark fills with nulls (spate refuses it)
PANDAS_NULL_FILLED = {"struct_missing_key": (STRUCT, [{"a": 1}, {"a": 2}])}
ROW_NULL_FILLED = {"missing_field": ("bigint", MISSING), "struct_missing_key": (STRUCT, [{"a": 1}, {"a": 2}])}


class Emit(StatefulProcessor):
    """Yields, per key, two rows: the key and each case's two values (columns in reverse order, plus a column
    the schema does not have), or ``raw`` items as they are."""

    def __init__(self, cases, flavour, raw=None):
        self.cases, self.flavour, self.raw = cases, flavour, raw

    def init(self, handle):
        pass

    def handleInputRows(self, key, rows, timerValues):  # noqa: N802,N803
        for _ in rows:
            pass
        if self.raw is not None:
            yield self.raw
            return
        columns = {name: values for name, (_, values) in reversed(self.cases.items()) if values != MISSING}
        columns |= {"k": [key[0]] * 2, "extra": [0, 0]}
        if self.flavour == "pandas":
            yield pd.DataFrame(columns)
        else:
            yield from (Row(**{name: values[i] for name, values in columns.items()}) for i in range(2))

    def close(self):
        pass


def ddl(cases):
    return ", ".join(["k string", *(f"{name} {t}" for name, (t, _) in cases.items())])


def canonical(rows):
    """Collected rows as a comparable multiset."""
    return sorted(repr(r) for r in rows)


def collect(outputs):
    def sink(df, batch_id):
        outputs.setdefault(batch_id, []).extend(canonical(df.collect()))

    return sink


def run_spark(spark, source, tmp_path, cases, flavour, raw=None):
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", ROCKSDB)  # the only store TWS supports
    grouped = spark.readStream.schema("k string").option("maxFilesPerTrigger", 1).json(source).groupBy("k")
    apply = grouped.transformWithStateInPandas if flavour == "pandas" else grouped.transformWithState
    outputs: dict = {}
    drain(lambda: apply(Emit(cases, flavour, raw), ddl(cases), "Update", "None").writeStream.foreachBatch(
        collect(outputs)).option("checkpointLocation", str(tmp_path / f"spark-{flavour}")).start())
    return outputs


def run_spate(spark, source, tmp_path, cases, flavour):
    df = spark.readStream.schema("k string").option("maxFilesPerTrigger", 1).json(source)
    stream = transform_with_state(df, "k", Emit(cases, flavour), ddl(cases), flavour=flavour, parallelism=2,
                                  checkpoint_root=str(tmp_path / f"spate-{flavour}"),
                                  local_dir=str(tmp_path / f"local-{flavour}"))
    outputs: dict = {}
    stream.start(collect(outputs), trigger={"availableNow": True}).awaitTermination()
    stream.close()
    return outputs


def spark_converts(spark, cases, flavour, raw=None):
    """What Spark's Python worker makes of one key's output, by the conversion it runs (worker.py)."""
    from pyspark.sql.conversion import PandasToArrowConversion
    from pyspark.sql.pandas.types import to_arrow_type
    from pyspark.sql.types import StructField, StructType, _parse_datatype_string

    schema = _parse_datatype_string(ddl(cases))
    items = list(Emit(cases, flavour, raw).handleInputRows(("a",), iter([None]), None))
    if flavour == "pandas":
        return [PandasToArrowConversion.convert(
            [frame], StructType([StructField("_0", schema)]), timezone="UTC", safecheck=True, arrow_cast=True,
            assign_cols_by_name=True, int_to_decimal_coercion_enabled=False).column(0).to_pylist()
            for frame in items]
    arrow_schema = pa.schema(list(to_arrow_type(schema, timezone="UTC", prefers_large_types=False)))
    return pa.RecordBatch.from_pylist([row.asDict(True) for row in items], schema=arrow_schema).to_pylist()


def spate_converts(spark, tmp_path, cases, flavour, raw=None):
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import _parse_datatype_string

    schema = to_arrow_schema(_parse_datatype_string(ddl(cases)), timezone="UTC")
    with LocalRunner(StatefulProcessorAdapter(Emit(cases, flavour, raw), flavour), key="k", output_schema=schema,
                     checkpoint_root=str(tmp_path / "local")) as runner:
        return runner.run_batch(0, [{"k": "a"}]).outputs


@pytest.mark.parametrize("flavour,cases", [("pandas", PANDAS_COERCED), ("row", ROW_COERCED)])
def test_coerced_as_on_spark(spark, tmp_path, flavour, cases):
    source = str(tmp_path / "in")
    write_files(source, [[{"k": "a"}, {"k": "b"}], [{"k": "b"}, {"k": "c"}, {"k": "d"}]])
    want = run_spark(spark, source, tmp_path, cases, flavour)
    got = run_spate(spark, source, tmp_path, cases, flavour)
    assert want == got
    assert sum(map(len, want.values())) == 10


@pytest.mark.parametrize("flavour,cases", [*((("pandas", {n: c}) for n, c in PANDAS_FAILING.items())),
                                           *((("row", {n: c}) for n, c in ROW_FAILING.items()))],
                         ids=[*(f"pandas-{n}" for n in PANDAS_FAILING), *(f"row-{n}" for n in ROW_FAILING)])
def test_fails_as_on_spark(spark, tmp_path, flavour, cases):
    with pytest.raises(Exception):  # noqa: B017 - Spark raises whatever its conversion raises
        spark_converts(spark, cases, flavour)
    name = next(iter(cases))
    with pytest.raises(OutputError, match=rf"Emit.process for key 'a' .*'{name}'"):
        spate_converts(spark, tmp_path, cases, flavour)


@pytest.mark.parametrize("flavour,name,field,spark_value", [
    ("pandas", "struct_missing_key", "b", {"a": 1, "b": None}),
    ("row", "missing_field", "missing_field", None),
    ("row", "struct_missing_key", "b", {"a": 1, "b": None})])
def test_what_spark_fills_with_nulls_fails(spark, tmp_path, flavour, name, field, spark_value):
    cases = {name: (PANDAS_NULL_FILLED if flavour == "pandas" else ROW_NULL_FILLED)[name]}
    converted = spark_converts(spark, cases, flavour)
    assert (converted[0] if flavour == "pandas" else converted)[0] == {"k": "a", name: spark_value}
    with pytest.raises(OutputError, match=rf"Emit.process for key 'a' .*'{field}'.*Spark would fill"):
        spate_converts(spark, tmp_path, cases, flavour)


@pytest.mark.parametrize("flavour,raw,problem", [
    ("pandas", {"k": ["a"]}, "yielded dict .*, not a pandas DataFrame"),
    ("pandas", pd.DataFrame([["a"]]), "a DataFrame with 1 unnamed columns for the 2 of the output schema"),
    ("row", {"k": "a"}, "yielded dict .*, not a Row with named fields"),
    ("row", Row("a", 1), "yielded Row .*, not a Row with named fields")])
def test_what_is_not_a_dataframe_or_named_row_fails(spark, tmp_path, flavour, raw, problem):
    cases = {"v": ("bigint", [1, 2])}
    with pytest.raises(Exception):  # noqa: B017
        spark_converts(spark, cases, flavour, raw)
    with pytest.raises(OutputError, match=problem):
        spate_converts(spark, tmp_path, cases, flavour, raw)


@pytest.mark.parametrize("flavour,name,spark_says", [
    ("pandas", "int_to_decimal", "'int_to_decimal' with type 'int64' to Arrow type 'decimal128"),
    ("pandas", "float_to_long", "Float value -2.700000 was truncated"),  # checked casts, as ANSI mode is on
    ("row", "str_to_long", "Could not convert '5' with type str: tried to convert to int64"),
    ("row", "overflow_to_int", "Value 1099511627776 too large to fit in C integer type")])
def test_real_spark_fails_where_spate_does(spark, tmp_path, flavour, name, spark_says):
    """The conversion model above is what Spark runs: a failing case fails a real query too."""
    source = str(tmp_path / "in")
    write_files(source, [[{"k": "a"}]])
    cases = {name: (PANDAS_FAILING if flavour == "pandas" else ROW_FAILING)[name]}
    with pytest.raises(Exception, match=spark_says):  # noqa: B017 - a StreamingQueryException
        run_spark(spark, source, tmp_path, cases, flavour)


def test_real_spark_fills_a_missing_row_field_with_null(spark, tmp_path):
    source = str(tmp_path / "in")
    write_files(source, [[{"k": "a"}]])
    got = run_spark(spark, source, tmp_path, ROW_NULL_FILLED, "row")
    assert got == {0: canonical([Row(k="a", missing_field=None, struct_missing_key=Row(a=a, b=None))
                                 for a in (1, 2)])}
