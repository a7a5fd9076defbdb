"""What a :class:`~spate.spark.stream.StatefulStream` is given, checked once when it is built: the streaming
DataFrame and its key columns, the output schema, and the settings (the Spark conf's ``spark.spate.*``, the
arguments over them)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from spate.errors import SettingError
from spate.spark.sessions import session_conf
from spate.spark.settings import SpateSettings


def key_columns_of(df: Any, key: str | Sequence[str]) -> tuple[str, ...]:
    """The key columns of the streaming DataFrame ``df``.

    Raises:
        SettingError: ``df`` is not streaming, or a key column is not one of its columns."""
    if not df.isStreaming:
        raise SettingError("StatefulStream needs a streaming DataFrame (spark.readStream...); for a batch "
                           "DataFrame use LocalRunner")
    columns = (key,) if isinstance(key, str) else tuple(key)
    missing = [c for c in columns if c not in df.columns]
    if not columns or missing:
        raise SettingError(f"key columns {missing or '(none)'} are not columns of the stream {df.columns}: pass "
                           "key= one of them (or a list of them)")
    return columns


def output_schema_of(output_schema: Any) -> Any:
    """``output_schema`` (a ``StructType`` or a DDL string) as a ``StructType``.

    Raises:
        SettingError: it is neither."""
    from pyspark.sql.types import StructType, _parse_datatype_string

    schema = _parse_datatype_string(output_schema) if isinstance(output_schema, str) else output_schema
    if not isinstance(schema, StructType):
        raise SettingError(f"output_schema must be a StructType or a DDL string such as \"k string, n long\", got "
                           f"{output_schema!r}")
    return schema


def settings_of(spark: Any, settings: SpateSettings | None, overrides: dict[str, Any]) -> SpateSettings:
    """``settings`` with ``overrides`` applied; without ``settings``, the session's conf (:func:`session_conf`)
    with the overrides over it."""
    if settings is None:
        return SpateSettings.from_conf(session_conf(spark), **overrides)
    return settings.replace(**overrides) if overrides else settings
