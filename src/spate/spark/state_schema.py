"""Schemas of a ``StatefulProcessor``'s states, as Spark's transformWithState treats them.

A state value is stored as ``[version, *fields]``: the fields in Spark's internal form for the state's schema
(``StructType.toInternal``: nested structs as tuples, timestamps as microseconds, dates as days) and
``version`` the index of the schema it was written with in the state's schema history. The history of every
state lives in the checkpoint, in the broadcast operator state :data:`SCHEMAS_STATE`, so a restarted query
with a changed schema reads old values by field name: added fields read as null, removed fields are dropped,
reordered fields follow their names and widened numbers are widened (Spark's Avro schema-resolution rules for
transformWithState). A narrowing change is refused when the query starts.

Values come back as Spark returns them: the top level as a tuple, nested structs as ``Row``.

The DDL parser here needs no JVM, so executors (and :class:`~spate.LocalRunner`) parse schema strings
themselves.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pyspark.errors import PySparkRuntimeError
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    Row,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from spate.errors import SparkErrorClass, SpateError
from spate.spark.state_values import spark_internal

SCHEMAS_STATE = "spark.state_schemas"
"""Broadcast operator state holding each state's schema history (state name → :class:`StateSchemaRecord`)."""

_PRIMITIVES: dict[str, Callable[[], DataType]] = {
    "string": StringType, "varchar": StringType, "char": StringType, "long": LongType, "bigint": LongType,
    "int": IntegerType, "integer": IntegerType, "short": ShortType, "smallint": ShortType, "byte": ByteType,
    "tinyint": ByteType, "double": DoubleType, "float": FloatType, "real": FloatType, "boolean": BooleanType,
    "bool": BooleanType, "binary": BinaryType, "date": DateType, "timestamp": TimestampType,
    "timestamp_ltz": TimestampType, "timestamp_ntz": TimestampNTZType,
}
# Avro's schema resolution: a value written as the key type may be read as any of the listed types
_WIDENINGS: dict[type, tuple[type, ...]] = {
    ByteType: (ShortType, IntegerType, LongType, FloatType, DoubleType),
    ShortType: (IntegerType, LongType, FloatType, DoubleType),
    IntegerType: (LongType, FloatType, DoubleType),
    LongType: (FloatType, DoubleType),
    FloatType: (DoubleType,),
}


class StateSchemaError(SparkErrorClass, SpateError):
    """A state's schema is not allowed, or cannot be evolved from the one in the checkpoint."""


class SchemaSyntaxError(StateSchemaError, PySparkRuntimeError):
    """A schema string that does not parse: Spark's error class and the message its Python client raises
    (``PySparkRuntimeError``, which a processor on Spark would catch), then what spate found."""

    def __init__(self, error_class: str, spark_message: str, detail: str) -> None:
        PySparkRuntimeError.__init__(
            self, message=f"Error parsing string schema: \n[{error_class}] {spark_message} ({detail})")


def _syntax_error(text: str, near: str | None, detail: str) -> SchemaSyntaxError:
    where = "end of input" if near is None else f"'{near}'"
    return SchemaSyntaxError("PARSE_SYNTAX_ERROR", f"Syntax error at or near {where}.",
                             f"cannot parse schema {text!r}: {detail}")


# -- DDL ------------------------------------------------------------------------------------------------

class _Tokens:
    _TOKEN = re.compile(r"\s*(`(?:[^`]|``)*`|[A-Za-z_][A-Za-z0-9_]*|\d+|'(?:[^'\\]|\\.)*'|[<>(),:])")

    def __init__(self, text: str) -> None:
        self.text, self.items, pos = text, [], 0
        while pos < len(text):
            m = self._TOKEN.match(text, pos)
            if m is None:
                if text[pos:].strip():
                    raise _syntax_error(text, text[pos:pos + 1], f"at {text[pos:pos + 20]!r}")
                break
            self.items.append(m.group(1))
            pos = m.end()
        self.pos = 0

    def peek(self) -> str | None:
        return self.items[self.pos] if self.pos < len(self.items) else None

    def take(self, expected: str | None = None) -> str:
        tok = self.peek()
        if tok is None or (expected is not None and tok.lower() != expected):
            raise _syntax_error(self.text, tok, f"expected {expected or 'more'}, got {tok!r}")
        self.pos += 1
        return tok


def parse_schema(schema: str | StructType) -> StructType:
    """A state or output schema as a ``StructType``: DDL (``"a long, s struct<x: int>"``) or a ``StructType``."""
    if isinstance(schema, StructType):
        return schema
    if not isinstance(schema, str):
        raise StateSchemaError(f"a schema must be a DDL string or a StructType, got {type(schema).__name__}")
    tokens = _Tokens(schema)
    fields = _fields(tokens, end=None)
    if tokens.peek() is not None:
        raise _syntax_error(schema, tokens.peek(), f"unexpected {tokens.peek()!r}")
    return StructType(fields)


def _fields(tokens: _Tokens, end: str | None) -> list[StructField]:
    fields = [_field(tokens)]
    while tokens.peek() == ",":
        tokens.take(",")
        fields.append(_field(tokens))
    if end is not None:
        tokens.take(end)
    return fields


def _field(tokens: _Tokens) -> StructField:
    name = tokens.take()
    if name.startswith("`"):
        name = name[1:-1].replace("``", "`")
    if tokens.peek() == ":":
        tokens.take(":")
    dtype = _type(tokens)
    nullable = True
    if (tokens.peek() or "").lower() == "not":
        tokens.take("not")
        tokens.take("null")
        nullable = False
    if (tokens.peek() or "").lower() == "comment":
        tokens.take("comment")
        tokens.take()
    return StructField(name, dtype, nullable)


def _type(tokens: _Tokens) -> DataType:
    word = tokens.take().lower()
    if word == "array":
        tokens.take("<")
        element = _type(tokens)
        tokens.take(">")
        return ArrayType(element, True)
    if word == "map":
        tokens.take("<")
        key = _type(tokens)
        tokens.take(",")
        value = _type(tokens)
        tokens.take(">")
        return MapType(key, value, True)
    if word == "struct":
        tokens.take("<")
        return StructType(_fields(tokens, end=">"))
    if word in ("decimal", "dec", "numeric"):
        if tokens.peek() != "(":
            return DecimalType(10, 0)
        tokens.take("(")
        precision, scale = int(tokens.take()), 0
        if tokens.peek() == ",":
            tokens.take(",")
            scale = int(tokens.take())
        tokens.take(")")
        return DecimalType(precision, scale)
    if word in ("varchar", "char") and tokens.peek() == "(":
        tokens.take("(")
        tokens.take()
        tokens.take(")")
    make = _PRIMITIVES.get(word)
    if make is None:
        raise SchemaSyntaxError("UNSUPPORTED_DATATYPE", f'Unsupported data type "{word.upper()}".',
                                f"cannot parse schema {tokens.text!r}: unknown type {word!r}")
    return make()


# -- rules -----------------------------------------------------------------------------------------------

def non_nullable_fields(schema: StructType, prefix: str = "") -> list[str]:
    """Paths of the fields (at any depth) declared NOT NULL."""
    out: list[str] = []
    for f in schema.fields:
        path = f"{prefix}{f.name}"
        if not f.nullable:
            out.append(path)
        out += _non_nullable_inside(f.dataType, path)
    return out


def _non_nullable_inside(dtype: DataType, path: str) -> list[str]:
    if isinstance(dtype, StructType):
        return non_nullable_fields(dtype, path + ".")
    if isinstance(dtype, ArrayType):
        return ([f"{path}[]"] if not dtype.containsNull else []) + _non_nullable_inside(dtype.elementType,
                                                                                          path + "[]")
    if isinstance(dtype, MapType):
        return ([f"{path}{{}}"] if not dtype.valueContainsNull else []) + _non_nullable_inside(
            dtype.valueType, path + "{}")
    return []


def check_nullable(state: str, schema: StructType) -> None:
    """Spark's rule for transformWithState state schemas (they must be evolvable): every field nullable."""
    bad = non_nullable_fields(schema)
    if bad:
        raise StateSchemaError(
            f"[TRANSFORM_WITH_STATE_SCHEMA_MUST_BE_NULLABLE] If Avro encoding is enabled, all the fields in the "
            f"schema for column family {state} must be nullable when using the TransformWithState operator. Please "
            f"make the schema nullable. Current schema: {schema.simpleString()} ({', '.join(bad)} "
            f"{'is' if len(bad) == 1 else 'are'} NOT NULL: drop NOT NULL)")


def evolution_problem(old: DataType, new: DataType, path: str = "value") -> str | None:
    """Why a value written as ``old`` cannot be read as ``new`` (None if it can)."""
    if isinstance(old, StructType) and isinstance(new, StructType):
        before = {f.name: f.dataType for f in old.fields}
        for f in new.fields:
            if f.name in before:
                problem = evolution_problem(before[f.name], f.dataType, f"{path}.{f.name}")
                if problem:
                    return problem
        return None
    if isinstance(old, ArrayType) and isinstance(new, ArrayType):
        return evolution_problem(old.elementType, new.elementType, path + "[]")
    if isinstance(old, MapType) and isinstance(new, MapType):
        return (evolution_problem(old.keyType, new.keyType, path + "{key}")
                or evolution_problem(old.valueType, new.valueType, path + "{}"))
    if old == new or type(new) in _WIDENINGS.get(type(old), ()):
        return None
    return f"{path} changes from {old.simpleString()} to {new.simpleString()}"


def check_evolution(state: str, old: StructType, new: StructType) -> None:
    problem = evolution_problem(old, new)
    if problem:
        raise StateSchemaError(
            f"[STATE_STORE_INVALID_VALUE_SCHEMA_EVOLUTION] state {state!r} cannot be read with its new schema: "
            f"{problem}, which loses data. Fields may be added, removed or reordered and numbers widened "
            f"(int → long → double); keep the old type, or use a new state name. Old: {old.simpleString()}, "
            f"new: {new.simpleString()}")


# -- values ----------------------------------------------------------------------------------------------

def _external(value: Any, dtype: DataType) -> Any:
    """Spark's Python value for internal ``value`` (structs as ``Row``)."""
    if value is None:
        return None
    if isinstance(dtype, StructType):
        return Row(**{f.name: _external(v, f.dataType) for v, f in zip(value, dtype.fields, strict=True)})
    if isinstance(dtype, ArrayType):
        return [_external(v, dtype.elementType) for v in value]
    if isinstance(dtype, MapType):
        return {_external(k, dtype.keyType): _external(v, dtype.valueType) for k, v in value}
    if dtype.needConversion() and not isinstance(dtype, DecimalType):
        return dtype.fromInternal(value)
    return value


def _resolve(value: Any, old: DataType, new: DataType) -> Any:
    """Internal ``value`` written as ``old`` read as ``new`` (by field name, widening numbers)."""
    if value is None or old == new:
        return value
    if isinstance(old, StructType) and isinstance(new, StructType):
        by_name = dict(zip(old.names, zip(value, old.fields, strict=True), strict=True))
        return tuple(_resolve(by_name[f.name][0], by_name[f.name][1].dataType, f.dataType) if f.name in by_name
                     else None for f in new.fields)
    if isinstance(old, ArrayType) and isinstance(new, ArrayType):
        return [_resolve(v, old.elementType, new.elementType) for v in value]
    if isinstance(old, MapType) and isinstance(new, MapType):
        return [(_resolve(k, old.keyType, new.keyType), _resolve(v, old.valueType, new.valueType)) for k, v in value]
    if isinstance(new, (FloatType, DoubleType)):
        return float(value)
    return value


@dataclass
class StateCodec:
    """Converts one state's values between what the processor gives/gets and what is stored."""

    name: str
    versions: list[StructType]

    @property
    def schema(self) -> StructType:
        return self.versions[-1]

    def stored(self, value: Any) -> list[Any]:
        """``value`` as stored, with the meaning Spark gives it (:func:`~spate.spark.state_values.spark_internal`:
        iterated into the schema's fields, values of another type null, wrong arity refused)."""
        return [len(self.versions) - 1, *spark_internal(value, self.schema, f"state {self.name!r}")]

    def row(self, stored: list[Any]) -> Row:
        """A stored value as a ``Row`` of the current schema."""
        version, fields = stored[0], tuple(stored[1:])
        if version != len(self.versions) - 1:
            fields = _resolve(fields, self.versions[version], self.schema)
        return _external(fields, self.schema)

    def value(self, stored: list[Any]) -> tuple:
        """A stored value as Spark's ``get`` returns it: a tuple (nested structs as ``Row``)."""
        return tuple(self.row(stored))


@dataclass
class KeyCodec:
    """Map-state user keys: stored as internal tuples (plain, hashable), returned as tuples."""

    schema: StructType

    def stored(self, key: Any, state: str) -> tuple:
        return _hashable(spark_internal(key, self.schema, f"map state {state!r} key"))

    def value(self, stored: Any) -> tuple:
        return tuple(_external(_listy(stored, self.schema), self.schema))


def _hashable(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, tuple):
        return tuple(_hashable(v) for v in value)
    return value


def _listy(value: Any, dtype: DataType) -> Any:
    """Undo :func:`_hashable` for arrays and maps inside a key."""
    if value is None:
        return None
    if isinstance(dtype, StructType):
        return tuple(_listy(v, f.dataType) for v, f in zip(value, dtype.fields, strict=True))
    if isinstance(dtype, ArrayType):
        return [_listy(v, dtype.elementType) for v in value]
    if isinstance(dtype, MapType):
        return [(_listy(k, dtype.keyType), _listy(v, dtype.valueType)) for k, v in value]
    return value


@dataclass
class StateSchemaRecord:
    """What the checkpoint records about one state: its kind, every value schema it had (oldest first), the
    map-state key schema, its TTL."""

    kind: str
    versions: list[str]
    key: str | None = None
    ttl_ms: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "versions": self.versions, "key": self.key, "ttl_ms": self.ttl_ms}

    @staticmethod
    def from_dict(data: dict[str, Any]) -> StateSchemaRecord:
        return StateSchemaRecord(data["kind"], list(data["versions"]), data.get("key"), data.get("ttl_ms"))

    def codec(self, name: str) -> StateCodec:
        return StateCodec(name, [StructType.fromJson(_json(v)) for v in self.versions])

    def key_codec(self) -> KeyCodec | None:
        return KeyCodec(StructType.fromJson(_json(self.key))) if self.key else None


def _json(text: str) -> dict[str, Any]:
    import json

    return json.loads(text)


@dataclass(frozen=True)
class StateDeclaration:
    """A state as a processor declares it through its handle (``getValueState``, ``getListState``,
    ``getMapState``): its name, its kind (``"value"``, ``"list"`` or ``"map"``), the schema of its values and of a
    map's user keys as given (a ``StructType`` or a DDL string), and its TTL in ms (None: none)."""

    name: str
    kind: str
    schema: Any
    key_schema: Any = None
    ttl_ms: int | None = None


def evolve(declared: StateDeclaration, recorded: StateSchemaRecord | None) -> StateSchemaRecord:
    """The record of a state after this run declares it (its schemas parsed, and checked against ``recorded``)."""
    name, kind, ttl_ms = declared.name, declared.kind, declared.ttl_ms
    schema = parse_schema(declared.schema)
    key = parse_schema(declared.key_schema) if declared.key_schema is not None else None
    check_nullable(name, schema)
    current = schema.json()
    if recorded is None or recorded.kind != kind:
        return StateSchemaRecord(kind, [current], key.json() if key else None, ttl_ms)
    if key is not None and recorded.key is not None and StructType.fromJson(_json(recorded.key)) != key:
        raise StateSchemaError(
            f"[STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE] map state {name!r} has user keys of schema "
            f"{StructType.fromJson(_json(recorded.key)).simpleString()} in the checkpoint; the processor now "
            f"declares {key.simpleString()}. Key schemas cannot change: keep it, or use a new state name")
    if recorded.versions[-1] == current:
        return StateSchemaRecord(kind, recorded.versions, recorded.key, ttl_ms)
    check_evolution(name, StructType.fromJson(_json(recorded.versions[-1])), schema)
    return StateSchemaRecord(kind, [*recorded.versions, current], recorded.key, ttl_ms)


__all__ = ["SCHEMAS_STATE", "KeyCodec", "StateCodec", "StateDeclaration", "StateSchemaError", "StateSchemaRecord",
           "check_evolution", "check_nullable", "evolve", "parse_schema"]
