"""What Spark's Python worker does with a ``transformWithState`` batch, on the installed pyspark: the settings it
reads from the session (:class:`PythonWorkerConf`), how a key's input rows reach ``handleInputRows`` (pandas
DataFrames or ``Row`` objects, timestamps in the session time zone) and how yielded DataFrames become Arrow.

The conversions call pyspark's own functions, whose home moved between minor versions (the serializers of
``pyspark.sql.pandas.serializers`` in 4.0 and 4.1, ``pyspark.sql.conversion`` from 4.2 on): this module is the
one place that knows where, so the adapter gets the installed version's result. What each version does:

- **pandas input.** Spark converts each Arrow column to pandas (timestamps to naive nanosecond values in the
  session time zone, dates to ``datetime.date``, structs to dicts, maps to dicts, arrays to numpy arrays). From
  4.1 on it then rebuilds each key's chunk from the rows (``pd.DataFrame(rows)`` over ``itertuples``), which
  renames columns that are not identifiers (``_1``) and re-infers extension dtypes; 4.0 keeps the columns.
  Chunks hold at most ``maxRecordsPerBatch`` rows and, from 4.1 on, about ``maxBytesPerBatch`` bytes.
- **Row input** (4.1 on): each value is Arrow's ``as_py()`` of a column whose timestamps carry the session time
  zone, so a ``datetime`` is aware, in that zone.
- **pandas output**: the session time zone, checked casts and int-to-decimal coercion as the session says.
"""

from __future__ import annotations

import collections
import inspect
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, cast

import pyarrow as pa

from spate.runtime.output_values import PandasConversion

_NO_LIMIT = 2**31 - 1
_RUNNER_CONF = "org.apache.spark.sql.execution.python.ArrowPythonRunner"
_SIZE = re.compile(r"^\s*(\d+)\s*([kmgt]?)i?b?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


@dataclass(frozen=True)
class PythonWorkerConf:
    """The settings Spark's Python worker runs a ``transformWithState`` batch with (its "runner conf"), read
    from the session on the driver (:meth:`of_session`) and shipped to the executors with the processor.

    The defaults are Spark 4's with ANSI mode on."""

    timezone: str = "UTC"
    safecheck: bool = True  # spark.sql.execution.pandas.convertToArrowArraySafely (ANSI mode: on)
    int_to_decimal: bool = False  # spark.sql.execution.pythonUDF.pandas.intToDecimalCoercionEnabled
    assign_columns_by_name: bool = True  # spark.sql.legacy.execution.pandas.groupedMap.assignColumnsByName
    prefer_int_ext_dtype: bool = False  # spark.sql.execution.pythonUDF.pandas.preferIntExtensionDtype
    max_records_per_batch: int = 10_000  # spark.sql.execution.arrow.maxRecordsPerBatch (0 or less: no limit)
    max_bytes_per_batch: int = _NO_LIMIT  # spark.sql.execution.arrow.maxBytesPerBatch

    @staticmethod
    def of_session(spark: Any) -> PythonWorkerConf:
        """What the session's Python workers would get: the JVM's own runner conf where the installed Spark
        exposes it (the session time zone resolved as Spark resolves it, safe casts following ANSI mode),
        else the session conf with Spark's defaults."""
        conf = _runner_conf(spark)

        def flag(key: str, default: bool) -> bool:
            value = conf.get(key)
            if value is None:
                value = _session_conf(spark, key)
            return default if value is None else str(value).strip().lower() == "true"

        records = int(_session_conf(spark, "spark.sql.execution.arrow.maxRecordsPerBatch") or 10_000)
        max_bytes = _jvm_max_bytes(spark) or _bytes(_session_conf(spark, "spark.sql.execution.arrow.maxBytesPerBatch"))
        return PythonWorkerConf(
            timezone=conf.get("spark.sql.session.timeZone") or _session_conf(spark, "spark.sql.session.timeZone")
            or "UTC",
            safecheck=flag("spark.sql.execution.pandas.convertToArrowArraySafely", True),
            int_to_decimal=flag("spark.sql.execution.pythonUDF.pandas.intToDecimalCoercionEnabled", False),
            assign_columns_by_name=flag("spark.sql.legacy.execution.pandas.groupedMap.assignColumnsByName", True),
            prefer_int_ext_dtype=flag("spark.sql.execution.pythonUDF.pandas.preferIntExtensionDtype", False),
            max_records_per_batch=records if records > 0 else _NO_LIMIT,
            max_bytes_per_batch=max_bytes if max_bytes and max_bytes > 0 else _NO_LIMIT)

    @property
    def output(self) -> PandasOutput:
        """How yielded DataFrames are converted to Arrow with these settings."""
        return PandasOutput(self.timezone, self.safecheck, self.int_to_decimal, self.assign_columns_by_name)


def _runner_conf(spark: Any) -> dict[str, str]:
    """The JVM's ``ArrowPythonRunner.getPythonRunnerConfMap`` for the session ({} where it is not there)."""
    try:
        jmap = getattr(spark._jvm, _RUNNER_CONF).getPythonRunnerConfMap(  # noqa: SLF001
            spark._jsparkSession.sessionState().conf())  # noqa: SLF001
        keys = jmap.keys().toList()
        return {str(keys.apply(i)): str(jmap.apply(keys.apply(i))) for i in range(keys.size())}
    except Exception:  # not in this Spark (or not a classic session): the session conf gives the same values
        return {}


def _jvm_max_bytes(spark: Any) -> int | None:
    try:
        return int(spark._jsparkSession.sessionState().conf().arrowMaxBytesPerBatch())  # noqa: SLF001
    except Exception:
        return None


def _session_conf(spark: Any, key: str) -> str | None:
    try:
        return spark.conf.get(key)
    except Exception:  # a key this Spark does not know
        return None


def _bytes(text: str | None) -> int | None:
    """A Spark size setting ("64m", "67108864b", "1024") in bytes."""
    m = _SIZE.match(text or "")
    return int(m.group(1)) * _UNITS[m.group(2).lower()] if m else None


@dataclass(frozen=True)
class PandasOutput(PandasConversion):
    """:class:`~spate.runtime.output_values.PandasConversion` with the installed pyspark's own conversion."""

    def array(self, values: Any, field: pa.Field) -> pa.Array:
        import pandas as pd

        series = values if isinstance(values, pd.Series) else pd.Series(values)
        column = _pandas_to_arrow(series, field, self)
        return column if column.type == field.type else column.cast(field.type)


# -- input -------------------------------------------------------------------------------------------------

def pandas_input(table: pa.Table, conf: PythonWorkerConf) -> Any:
    """A subtask's rows (Arrow) as the pandas DataFrame Spark's worker makes of its Arrow batches."""
    import pandas as pd

    series = _arrow_to_pandas(in_session_zone(table, conf), conf)
    if not series:
        return pd.DataFrame(index=pd.RangeIndex(table.num_rows))
    frame = pd.concat(series, axis=1)
    frame.columns = table.column_names
    return frame


def rebuilds_chunks() -> bool:
    """Whether the installed Spark rebuilds each key's chunk from rows (``pd.DataFrame(itertuples)``, 4.1 on)."""
    return _version() >= (4, 1)


def pandas_chunks(frame: Any, conf: PythonWorkerConf, row_bytes: float) -> Iterator[Any]:
    """A key's rows (a slice of :func:`pandas_input`'s frame) in the DataFrames ``handleInputRows`` gets: at
    most ``max_records_per_batch`` rows each (and, from 4.1 on, about ``max_bytes_per_batch`` bytes, at
    ``row_bytes`` bytes per Arrow row), each indexed from 0, rebuilt from rows where Spark rebuilds them."""
    import pandas as pd

    size = conf.max_records_per_batch
    if conf.max_bytes_per_batch != _NO_LIMIT and row_bytes > 0 and rebuilds_chunks():
        size = max(1, min(size, math.ceil(conf.max_bytes_per_batch / row_bytes)))  # Spark: rows × size ≥ limit
    rebuild = rebuilds_chunks()
    for start in range(0, len(frame), size):
        chunk = frame.iloc[start:start + size]
        if rebuild:
            yield _rebuilt(chunk)
        else:
            chunk = chunk.copy(deep=False)
            chunk.index = pd.RangeIndex(len(chunk))
            yield chunk


def _rebuilt(chunk: Any) -> Any:
    """``pd.DataFrame(list(chunk.itertuples(index=False)))``, as Spark 4.1+ builds a chunk: columns that are
    not identifiers renamed as ``namedtuple`` renames them; the values of a numpy-typed column (object ones
    included: strings, dates, decimals, dicts, arrays) come back as they were, so only extension dtypes need the
    rows themselves, whose dtype pandas infers again from the values."""
    import numpy as np
    import pandas as pd

    row = cast(Any, collections.namedtuple("Pandas", [str(c) for c in chunk.columns], rename=True))  # run-time fields
    names: list[str] = list(row._fields)
    if all(isinstance(dtype, np.dtype) for dtype in chunk.dtypes):
        out = chunk.copy(deep=False)
        out.index = pd.RangeIndex(len(out))
    else:
        out = pd.DataFrame(list(chunk.itertuples(index=False)))
    out.columns = names
    return out


def in_session_zone(table: pa.Table, conf: PythonWorkerConf) -> pa.Table:
    """``table`` with its timestamp columns labelled with the session time zone, as the JVM writes the Arrow
    batches a Python worker reads (the instants stay; Arrow's ``as_py`` then gives the aware ``datetime`` of
    Spark's Row flavour, and the pandas conversion the local wall time)."""
    for i, f in enumerate(table.schema):
        if pa.types.is_timestamp(f.type) and f.type.tz is not None and f.type.tz != conf.timezone:
            table = table.set_column(i, f.name, table.column(i).cast(pa.timestamp(f.type.unit, tz=conf.timezone)))
    return table


# -- the installed pyspark's functions ---------------------------------------------------------------------

def _version() -> tuple[int, int]:
    import pyspark

    major, minor = pyspark.__version__.split(".")[:2]
    return int(major), int(minor)


def arrow_schema(schema: Any) -> pa.Schema:
    """Spark's Arrow schema for a ``StructType``, timestamps in UTC (``to_arrow_schema``, whose arguments changed
    in pyspark 4.2)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    parameters = inspect.signature(to_arrow_schema).parameters
    if "timezone" in parameters:
        return to_arrow_schema(schema, timezone="UTC")
    options: dict[str, Any] = {"timestamp_utc": True} if "timestamp_utc" in parameters else {}
    return to_arrow_schema(schema, **options)


def _arrow_to_pandas(table: pa.Table, conf: PythonWorkerConf) -> list[Any]:
    from pyspark.sql import conversion

    transformer = getattr(conversion, "ArrowBatchTransformer", None)
    if transformer is not None and hasattr(transformer, "to_pandas"):  # 4.2 on
        return list(transformer.to_pandas(table, timezone=conf.timezone, **_accepted(
            transformer.to_pandas, prefer_int_ext_dtype=conf.prefer_int_ext_dtype)))
    serializer = _tws_serializer(conf)
    takes_index = "idx" in inspect.signature(serializer.arrow_to_pandas).parameters
    return [serializer.arrow_to_pandas(col, i) if takes_index else serializer.arrow_to_pandas(col)
            for i, col in enumerate(table.itercolumns())]


def _pandas_to_arrow(series: Any, field: pa.Field, out: PandasConversion) -> pa.Array:
    from pyspark.sql import conversion
    from pyspark.sql.pandas.types import from_arrow_type
    from pyspark.sql.types import StructField, StructType

    spark_type = from_arrow_type(field.type)
    converter = getattr(conversion, "PandasToArrowConversion", None)
    if converter is not None:  # 4.2 on
        schema = StructType([StructField(field.name, spark_type, field.nullable)])
        batch = converter.convert([series], schema, timezone=out.timezone, safecheck=out.safecheck, arrow_cast=True,
                                  **_accepted(converter.convert, int_to_decimal_coercion_enabled=out.int_to_decimal))
        return batch.column(0)
    from pyspark.sql.pandas.serializers import ArrowStreamPandasSerializer  # type: ignore[attr-defined]  # pyspark < 4.2 only

    serializer = ArrowStreamPandasSerializer(**_accepted(
        ArrowStreamPandasSerializer.__init__, timezone=out.timezone, safecheck=out.safecheck,
        int_to_decimal_coercion_enabled=out.int_to_decimal))
    return serializer._create_array(series, field.type, spark_type=spark_type, arrow_cast=True)  # noqa: SLF001


def _tws_serializer(conf: PythonWorkerConf) -> Any:
    from pyspark.sql.pandas.serializers import (  # type: ignore[attr-defined]  # pyspark < 4.2 only
        TransformWithStateInPandasSerializer as Serializer,
    )

    return Serializer(**_accepted(
        Serializer.__init__, timezone=conf.timezone, safecheck=conf.safecheck,
        assign_cols_by_name=conf.assign_columns_by_name, arrow_max_records_per_batch=conf.max_records_per_batch,
        arrow_max_bytes_per_batch=conf.max_bytes_per_batch, int_to_decimal_coercion_enabled=conf.int_to_decimal,
        prefer_int_ext_dtype=conf.prefer_int_ext_dtype))


def _accepted(function: Any, **arguments: Any) -> dict[str, Any]:
    """The ``arguments`` ``function`` takes (its parameters differ between pyspark versions)."""
    parameters = inspect.signature(function).parameters
    return {k: v for k, v in arguments.items() if k in parameters}


__all__ = ["PandasOutput", "PythonWorkerConf", "arrow_schema", "in_session_zone", "pandas_chunks", "pandas_input",
           "rebuilds_chunks"]
