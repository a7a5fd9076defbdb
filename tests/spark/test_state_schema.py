"""State schemas of the StatefulProcessor adapter: values round-trip as Spark returns them, evolution reads old
values by field name as a model says, the documented bytes are the real ones, the DDL parser agrees with Spark's."""

from __future__ import annotations

import datetime as dt
import decimal
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.errors import PySparkValueError
from pyspark.sql.types import Row, StructType

from spate import LocalRunner
from spate.serde import resolve_serializer
from spate.spark.state_schema import (
    StateDeclaration,
    StateSchemaError,
    evolve,
    parse_schema,
)
from spate.spark.state_values import StateValueError

SIMPLE_TYPES = {"long": st.integers(-2**63, 2**63 - 1), "int": st.integers(-2**31, 2**31 - 1),
                "double": st.floats(allow_nan=False), "string": st.text(max_size=5), "boolean": st.booleans(),
                "binary": st.binary(max_size=4)}


@st.composite
def schemas_and_values(draw):
    names = draw(st.lists(st.sampled_from("abcdefg"), min_size=1, max_size=5, unique=True))
    types = [draw(st.sampled_from(sorted(SIMPLE_TYPES))) for _ in names]
    values = tuple(draw(st.none() | SIMPLE_TYPES[t]) for t in types)
    return names, types, values


def _ddl(names, types):
    return ", ".join(f"{n} {t}" for n, t in zip(names, types, strict=True))


@settings(max_examples=150, deadline=None)
@given(schemas_and_values())
def test_values_round_trip(case):
    names, types, values = case
    codec = evolve(StateDeclaration("s", "value", parse_schema(_ddl(names, types))), None).codec("s")
    stored = codec.stored(values)
    ser = resolve_serializer(None)
    assert codec.value(ser.loads(ser.dumps(stored))) == values
    assert codec.row(stored) == Row(**dict(zip(names, values, strict=True)))


@settings(max_examples=150, deadline=None)
@given(schemas_and_values(), st.data())
def test_evolution_reads_old_values_by_field_name(case, data):
    """Model: the new schema keeps some old fields (reordered, ints widened to long or double) and adds others;
    an old value reads as the new schema's fields looked up by name, null where the old schema has none."""
    names, types, values = case
    kept = data.draw(st.lists(st.sampled_from(names), unique=True))
    added = list("uvw"[:data.draw(st.integers(0 if kept else 1, 2))])  # a schema has at least one field
    widened = {n: data.draw(st.sampled_from(["long", "double"])) if t == "int" else t
               for n, t in zip(names, types, strict=True)}
    old_record = evolve(StateDeclaration("s", "value", parse_schema(_ddl(names, types))), None)
    stored = old_record.codec("s").stored(values)
    new_names = kept + added
    new_types = [widened[n] for n in kept] + ["string"] * len(added)
    new_record = evolve(StateDeclaration("s", "value", parse_schema(_ddl(new_names, new_types))), old_record)
    old = dict(zip(names, values, strict=True))
    want = tuple(None if n not in old or old[n] is None else
                 float(old[n]) if widened.get(n) == "double" else old[n] for n in new_names)
    assert new_record.codec("s").value(stored) == want
    assert len(new_record.versions) == (1 if new_names == names and new_types == types else 2)


@pytest.mark.parametrize("old,new,problem", [
    ("a long", "a int", "value.a changes from bigint to int"),
    ("a double", "a long", "value.a changes from double to bigint"),
    ("a string", "a long", "value.a changes from string to bigint"),
    ("s struct<x: long>", "s struct<x: int>", "value.s.x changes from bigint to int"),
    ("m map<string, long>", "m map<string, int>", "value.m{} changes from bigint to int"),
])
def test_narrowing_is_refused(old, new, problem):
    recorded = evolve(StateDeclaration("s", "value", parse_schema(old)), None)
    with pytest.raises(StateSchemaError, match=re.escape(problem)) as e:
        evolve(StateDeclaration("s", "value", parse_schema(new)), recorded)
    assert "STATE_STORE_INVALID_VALUE_SCHEMA_EVOLUTION" in str(e.value)


def test_map_key_schema_cannot_change():
    recorded = evolve(StateDeclaration("m", "map", parse_schema("v long"), parse_schema("k string")), None)
    with pytest.raises(StateSchemaError, match="STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE"):
        evolve(StateDeclaration("m", "map", parse_schema("v long"), parse_schema("k long")), recorded)


def test_not_null_fields_are_refused():
    with pytest.raises(StateSchemaError, match=r"TRANSFORM_WITH_STATE_SCHEMA_MUST_BE_NULLABLE.*s\.x is NOT NULL"):
        evolve(StateDeclaration("v", "value", parse_schema("a long, s struct<x: int NOT NULL>")), None)


def test_nested_values_come_back_as_spark_gives_them():
    codec = evolve(StateDeclaration("v", "value", parse_schema(
        "s struct<x: int, y: string>, arr array<struct<p: long>>, m map<string, long>, d decimal(10,2), "
        "dt date, ts timestamp")), None).codec("v")
    value = ({"x": 2, "y": "y"}, [(7,)], {"k": 3}, decimal.Decimal("1.5"), dt.date(2026, 1, 2),
             dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC))
    assert codec.value(codec.stored(value)) == (
        Row(x=2, y="y"), [Row(p=7)], {"k": 3}, decimal.Decimal("1.50"), dt.date(2026, 1, 2),
        dt.datetime(2026, 1, 2, 3, 4, 5))  # naive, in the process's time zone (UTC here), as Spark returns it
    with pytest.raises(PySparkValueError, match="UNEXPECTED_TUPLE_WITH_STRUCT"):  # Spark's client: 1 is no struct
        codec.stored((1, 2))
    with pytest.raises(StateValueError, match=r"\[STRUCT_ARRAY_LENGTH_MISMATCH\].*2 fields are required while 3"):
        evolve(StateDeclaration("w", "value", parse_schema("a long, b long")), None).codec("w").stored((1, 2, 3))


def test_documented_bytes_are_real(tmp_path):
    """docs/formats.md's example of a schema'd state value, through the adapter into a real state table."""
    import pandas as pd
    from pyspark.sql.streaming import StatefulProcessor

    from spate.spark.adapter import StatefulProcessorAdapter
    from spate.state.layout import U16

    doc = (Path(__file__).resolve().parents[2] / "docs" / "formats.md").read_text()
    section = doc[doc.index("## State values of a `StatefulProcessor`"):doc.index("## State table keys")]
    value_hex, key_hex = re.findall(r"`((?:[0-9a-f]{2} )+[0-9a-f]{2})`", section)[:2]

    class Store(StatefulProcessor):
        def init(self, handle):
            self.v = handle.getValueState("v", "a long, s struct<x: int, y: string>, ts timestamp")
            self.m = handle.getMapState("m", "k string, k2 long", "v double")

        def handleInputRows(self, key, rows, timerValues):
            self.v.update((1, (2, "y"), dt.datetime(2026, 1, 1, tzinfo=dt.UTC)))
            self.m.updateValue(("a", 1), (0.5,))
            return iter([pd.DataFrame({"user": [key[0]]})])

        def close(self):
            pass

    with LocalRunner(StatefulProcessorAdapter(Store()), key="user", checkpoint_root=str(tmp_path)) as runner:
        runner.run_batch(0, [{"user": "u"}])
        keyed = runner.subtasks[0].keyed
        sids = {m.name: m.sid for m in keyed.state_metas}
        values = {name: (uk, raw) for kg in keyed.key_groups for name, sid in sids.items()
                  for _p, uk, raw in keyed.table.state_entries(kg, U16.pack(sid))}
    assert values["v"][1].hex(" ") == value_hex
    assert values["m"][0].hex(" ") == key_hex


DDL = ["a long, b string", "count long NOT NULL", "s struct<x: int, y: string>, arr array<long>",
       "m map<string, struct<p: double>>, d decimal(10,2), dt date, ts timestamp, b binary, f float",
       "`odd name` int, t tinyint, sm smallint, bi bigint, r real, ntz timestamp_ntz, dec decimal",
       "nested array<map<string, array<struct<q: boolean>>>> COMMENT 'deep'"]


@pytest.mark.spark
@pytest.mark.parametrize("ddl", DDL)
def test_ddl_parser_agrees_with_spark(spark, ddl):
    from pyspark.sql.types import _parse_datatype_string

    theirs = _parse_datatype_string(ddl)
    ours = parse_schema(ddl)
    assert isinstance(ours, StructType)
    assert [(f.name, f.dataType, f.nullable) for f in ours.fields] == \
        [(f.name, f.dataType, f.nullable) for f in theirs.fields]


def test_a_schema_string_that_does_not_parse_raises_what_sparks_client_raises():
    """A processor on Spark catching the failure of getValueState(name, "int") gets a PySparkRuntimeError
    with Spark's error class; spate's names what it found as well."""
    from pyspark.errors import PySparkRuntimeError

    with pytest.raises(PySparkRuntimeError, match=re.escape(
            "Error parsing string schema: \n[PARSE_SYNTAX_ERROR] Syntax error at or near end of input.")) as e:
        parse_schema("int")
    assert isinstance(e.value, StateSchemaError) and "cannot parse schema 'int'" in str(e.value)
    with pytest.raises(PySparkRuntimeError, match=r"\[PARSE_SYNTAX_ERROR\] Syntax error at or near '\)'"):
        parse_schema("a int)")
    with pytest.raises(PySparkRuntimeError, match=r'\[UNSUPPORTED_DATATYPE\] Unsupported data type "FOO"'):
        parse_schema("a foo")
