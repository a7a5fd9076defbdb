"""State as a DataFrame, both ways (Spark's ``statestore`` data source, Flink's State Processor API).

:func:`read_state` reads one keyed state of a checkpoint (or savepoint) as a DataFrame: one Spark task per
subtask of the checkpoint, each opening the root itself and rebuilding that subtask's state exactly as a
restore would (materialized snapshots, then the changelog), so the rows are what a restarted query would see.

:func:`write_savepoint` bootstraps state for a new query from a batch DataFrame: it runs one spate batch of a
bootstrap processor over the DataFrame (the same Spark job a micro-batch runs: rows routed to subtasks by key
group, state written through spate's own state objects, a checkpoint taken) and copies that checkpoint to the
target as a savepoint, which any query restores at any parallelism (``restore_from=``).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Any

from spate.checkpoint.discovery import open_root
from spate.checkpoint.inspect import (
    check_keyed_state,
    keyed_state_names,
    load_checkpoint,
    operator_state_elements,
    operator_state_names,
    subtask_state_records,
)
from spate.checkpoint.metadata import CheckpointMetadata
from spate.errors import CheckpointError, InvalidKeyError, ProcessorError, SettingError
from spate.fs import CheckpointStorage, join_uri
from spate.layout import METADATA_FILE
from spate.runtime.processor import Context, Processor, Row
from spate.runtime.subtask import ProcessorFactory, processor_factory
from spate.spark.adapter import StatefulProcessorAdapter
from spate.spark.sessions import is_connect
from spate.spark.state_rows_arrow import ArrowStateRows
from spate.spark.state_schema import SCHEMAS_STATE, StateSchemaRecord

INFER_SAMPLE = 100  # rows read to infer the types of the columns no schema describes
_NO_OUTPUT_SCHEMA = "bootstrap int"  # a bootstrap processor emits nothing


# -- reading -----------------------------------------------------------------------------------------------

def read_state(spark: Any, root: str, state: str, checkpoint_id: int | None = None, *, key_schema: Any = None,
               value_schema: Any = None, allow_pickle: bool = False, now_ms: int | None = None) -> Any:
    """Keyed state ``state`` of a checkpoint as a DataFrame, read on the executors (one task per subtask).

    On a Spark Connect session the tasks run in ``mapInArrow`` (no RDDs there), and the sample of rows the
    columns' types are inferred from is read by the client, which opens the root too (as for the metadata).

    Args:
        spark: the ``SparkSession``.
        root: the checkpoint root or a savepoint directory (path or ``pyarrow.fs`` URI, e.g. ``s3://...``).
        state: the state's name (a ``StatefulProcessor``'s state variable name, or a spate descriptor's name).
        checkpoint_id: default the latest complete checkpoint (or the savepoint).
        key_schema: the grouping key's columns as DDL (``"user string"``) or ``StructType``; default: inferred
            from the keys, with fields ``_1``, ``_2``, ...
        value_schema: for states without a recorded schema (spate's own processors): the ``value`` column's
            type as DDL or a ``DataType`` (``"count long, total double"`` for a struct, ``"long"``); default:
            inferred from the values (dicts as structs). A ``StatefulProcessor``'s states are typed by the
            schema recorded in the checkpoint.
        allow_pickle: decode values stored with the pickle serializer.
        now_ms: entries whose TTL expired at this time (default: now) are left out, as a restore would.

    Returns:
        A DataFrame with columns ``key`` (struct of the grouping key's columns), ``user_key`` (map state: the
        entry's key, a struct for a ``StatefulProcessor``'s map state; null otherwise), ``value`` (a map entry's
        value, a list element, or the value), ``list_index`` (list state only: the element's position),
        ``key_group``, ``expires_at_ms`` (TTL expiry in ms, processing time; null without TTL) and, for
        states kept in namespaces (windows), ``namespace``. List state has one row per element.

    Raises:
        CheckpointError: the root does not exist or has no complete checkpoint, ``checkpoint_id`` does not
            exist, or the checkpoint has no keyed state ``state`` (the message lists those it has).
        SettingError: a schema that is not DDL or a ``DataType``, a ``value_schema`` for a state with a recorded
            schema, or values of no common type without a ``value_schema``.
        InvalidKeyError: a key with another number of columns than ``key_schema`` (while the rows are read).
        SerializationError: pickled values without ``allow_pickle``.
    """
    storage = open_root(root)
    meta = load_checkpoint(storage, checkpoint_id)
    check_keyed_state(meta, state)
    info = _StateInfo(state, keyed_state_names(meta)[state], _schema_record(storage, meta, state))
    reader = _SubtaskReader(storage.uri, meta, state, info, allow_pickle,
                            int(time.time() * 1000) if now_ms is None else now_ms)
    subtasks = len(meta.subtasks)
    if is_connect(spark):  # no RDDs: a task per subtask through mapInArrow, the sample read by the client
        schema = _frame_schema(spark, lambda: list(islice(reader(range(subtasks)), INFER_SAMPLE)), info,
                               key_schema, value_schema)
        from pyspark.sql.pandas.types import to_arrow_schema

        rows = ArrowStateRows(reader, _RowShaper(schema), schema, to_arrow_schema(schema))
        return spark.range(0, subtasks, 1, subtasks).mapInArrow(rows, schema)
    rdd = spark.sparkContext.parallelize(range(subtasks), subtasks).mapPartitions(reader)
    schema = _frame_schema(spark, lambda: rdd.take(INFER_SAMPLE), info, key_schema, value_schema)
    return spark.createDataFrame(rdd.map(_RowShaper(schema)), schema)


def _schema_record(storage: CheckpointStorage, meta: CheckpointMetadata, state: str) -> StateSchemaRecord | None:
    """The schema history a ``StatefulProcessor`` recorded for ``state`` (None for spate's own states)."""
    if SCHEMAS_STATE not in operator_state_names(meta):
        return None
    for pairs in operator_state_elements(storage, meta, SCHEMAS_STATE):  # broadcast: the same on every subtask
        if pairs:
            recorded = dict(pairs).get(state)
            return StateSchemaRecord.from_dict(recorded) if recorded is not None else None
    return None


@dataclass
class _StateInfo:
    """What :func:`read_state` knows of one state's stored form: its kind and recorded schema, if any."""

    name: str
    kind: str
    record: StateSchemaRecord | None  # a StatefulProcessor's state: its schema history

    def value_type(self) -> Any:
        """The value column's type where the checkpoint records it, else None."""
        return self.record.codec(self.name).schema if self.record is not None else None

    def user_key_type(self) -> Any:
        """A map state's user-key type where the checkpoint records it, else None."""
        codec = self.record.key_codec() if self.record is not None else None
        return codec.schema if codec is not None else None


# (key, user_key, value, index, key_group, expires_at_ms, namespace), as read on an executor
RawRow = tuple[tuple, Any, Any, int | None, int, int | None, Any]


@dataclass
class _SubtaskReader:
    """The Spark task of :func:`read_state`: the rows of the subtasks it is given, from checkpoint storage."""

    uri: str
    meta: CheckpointMetadata
    state: str
    info: _StateInfo
    allow_pickle: bool
    now_ms: int

    def __call__(self, subtasks: Iterable[int]) -> Iterator[RawRow]:
        storage = CheckpointStorage(self.uri)
        codec = self._codecs()
        for subtask in subtasks:
            for r in subtask_state_records(storage, self.meta, self.state, subtask, self.allow_pickle,
                                           self.now_ms):
                yield (r.key if isinstance(r.key, tuple) else (r.key,), codec[1](r.user_key), codec[0](r.value),
                       r.index, r.key_group, r.expires_at_ms, r.namespace)

    def _codecs(self) -> tuple[Callable[[Any], Any], Callable[[Any], Any]]:
        """Decoders of values and user keys, made once per task (the schema parsed once)."""
        record = self.info.record
        if record is None:
            return (lambda v: v), (lambda k: k)
        values, keys = record.codec(self.state), record.key_codec()
        return values.row, (lambda k: None if k is None or keys is None else keys.value(k))


def _frame_schema(spark: Any, sample_rows: Callable[[], list[RawRow]], info: _StateInfo, key_schema: Any,
                  value_schema: Any) -> Any:
    """The DataFrame's schema: recorded and given schemas, the rest inferred from a sample of the rows."""
    from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

    recorded_value, user_key_type = info.value_type(), info.user_key_type()
    if recorded_value is not None and value_schema is not None:
        raise SettingError(f"state {info.name!r} has the schema {recorded_value.simpleString()} recorded in the "
                           "checkpoint; value_schema is only for states without one")
    key_type = _parse_type(spark, key_schema, struct=True) if key_schema is not None else None
    value_type = recorded_value or (_parse_type(spark, value_schema) if value_schema is not None else None)
    # a StatefulProcessor's states need no sample once the key is typed; spate's own may hold namespaces
    sample = [] if key_type and recorded_value else sample_rows()
    key_type = key_type or _infer_key(sample)
    value_type = value_type or _infer(info.name, "values", [r[2] for r in sample], "value_schema")
    if info.kind == "map":
        user_key_type = user_key_type or _infer(info.name, "map keys", [r[1] for r in sample], None)
    fields = [StructField("key", key_type), StructField("user_key", user_key_type or StringType()),
              StructField("value", value_type)]
    if info.kind == "list":
        fields.append(StructField("list_index", IntegerType()))
    fields += [StructField("key_group", IntegerType()), StructField("expires_at_ms", LongType())]
    if any(r[6] is not None for r in sample):
        fields.append(StructField("namespace", _infer(info.name, "namespaces", [r[6] for r in sample], None)))
    return StructType(fields)


def _parse_type(spark: Any, schema: Any, struct: bool = False) -> Any:
    """A DDL string or ``DataType`` as a ``DataType`` (``struct``: a single type becomes one field ``_1``)."""
    from pyspark.sql.types import DataType, StructField, StructType

    if not isinstance(schema, (str, DataType)):
        raise SettingError(f"a schema must be a DDL string or a pyspark DataType, got {schema!r}")
    parsed = spark._parse_ddl(schema) if isinstance(schema, str) else schema  # the session's own parser
    if struct and not isinstance(parsed, StructType):
        return StructType([StructField("_1", parsed)])
    return parsed


def _infer_key(sample: list[RawRow]) -> Any:
    from pyspark.sql.types import StringType, StructField, StructType

    width = max((len(r[0]) for r in sample), default=1)
    return StructType([StructField(f"_{i + 1}", _infer("key", f"key column {i + 1}",
                                                       [r[0][i] for r in sample if len(r[0]) > i], None)
                                   or StringType()) for i in range(width)])


def _infer(state: str, what: str, values: list[Any], option: str | None) -> Any:
    """One type for ``values`` (dicts as structs, as Spark infers Rows); string when there are none."""
    from pyspark.sql.types import NullType, StringType, _infer_type, _merge_type

    found: Any = NullType()
    try:
        for v in values:
            found = _merge_type(found, _infer_type(v, infer_dict_as_struct=True))
    except (TypeError, ValueError) as e:
        hint = f"; pass {option}= to read them as one type" if option else ""
        raise SettingError(f"state {state!r}: the {what} have no common type ({e}){hint}") from e
    return StringType() if isinstance(found, NullType) else found


@dataclass
class _RowShaper:
    """A raw row as a tuple in the DataFrame's column order, values shaped to their types (a scalar read as a
    one-field struct, a list as a struct's fields)."""

    schema: Any

    def __call__(self, row: RawRow) -> tuple:
        key, user_key, value, index, key_group, expires, namespace = row
        types = {f.name: f.dataType for f in self.schema.fields}
        if len(key) != len(types["key"].fields):
            raise InvalidKeyError(f"key {key!r} has {len(key)} column(s), key_schema "
                                  f"{types['key'].simpleString()} has {len(types['key'].fields)}")
        out = [_shape(key, types["key"]), _shape(user_key, types["user_key"]), _shape(value, types["value"])]
        if "list_index" in types:
            out.append(index)
        out += [key_group, expires]
        if "namespace" in types:
            out.append(namespace)
        return tuple(out)


def _shape(value: Any, dtype: Any) -> Any:
    from pyspark.sql.types import StructType

    if value is None or not isinstance(dtype, StructType) or isinstance(value, (dict, tuple)):
        return value
    if isinstance(value, list):
        return tuple(value)
    return (value,)


# -- writing ---------------------------------------------------------------------------------------------

def write_savepoint(df: Any, key: str | Sequence[str], target: str, processor: Any, *,
                    parallelism: int | None = None, max_parallelism: int | None = None, flavour: str = "pandas",
                    time_mode: str = "None", **settings: Any) -> CheckpointMetadata:
    """Bootstrap state for a new query from the batch DataFrame ``df``: a savepoint at ``target`` that any
    query keyed by the same columns restores at any parallelism (``restore_from=target``).

    ``processor`` writes each key's state from its rows, as Flink's ``KeyedStateBootstrapFunction``:

    - a spate :class:`Processor` (instance, class or factory): ``process(key, rows, ctx)`` runs once per key with
      all of its rows and writes state through ``ctx.state(...)`` (and operator state in ``end_batch``); what
      it yields is dropped;
    - a pyspark ``StatefulProcessor``: ``init`` declares its states (their schemas are recorded in the
      savepoint, as a query running the processor records them) and ``handleInitialState(key, initialState,
      timerValues)`` writes them, called as Spark calls it for ``transformWithState``'s initial state (pandas
      flavour: the key's rows as DataFrames; ``flavour="row"``: once per ``Row``). Give the ``time_mode`` the
      query will run with (TTL states need ``"ProcessingTime"`` or ``"EventTime"``; their expiry counts from
      now).

    The key columns must have the same types as the query's (a key's key group is Spark's ``hash()`` of them).
    The state is written with ``parallelism`` subtasks (default: the session's ``spark.spate.parallelism``) into
    ``max_parallelism`` key groups, which the restoring query keeps; ``settings`` are further
    :class:`SpateSettings` (``table``, ``local_dir``, ...). The work is done in a checkpoint root under
    ``target``, removed once the savepoint is written. Returns the savepoint's metadata.

    Raises:
        SettingError: ``df`` is a stream, or a setting that cannot work (see :class:`SpateSettings`).
        CheckpointError: ``target`` already holds a savepoint or other files.
        ProcessorError: ``processor`` is neither a spate processor nor a ``StatefulProcessor``, or a
            ``StatefulProcessor`` without ``handleInitialState``.
        ExecutorPythonError: the executors cannot run spate.
    """
    from pyspark.sql.streaming import StatefulProcessor

    from spate.spark.executors import check_executor_python

    if df.isStreaming:
        raise SettingError("write_savepoint bootstraps state from a batch DataFrame (spark.read...), not a stream")
    target_storage = CheckpointStorage(target)
    if target_storage.exists(METADATA_FILE):
        raise CheckpointError(f"{target} already holds a savepoint; write to a new directory")
    held = target_storage.list_entries()
    if held:
        raise CheckpointError(f"{target} is not empty (it holds {held[:5]}); a savepoint is written to a new or "
                              "empty directory, so nothing else there is overwritten or deleted")
    if isinstance(processor, StatefulProcessor):
        bootstrap: Processor = InitialStateBootstrap(processor, flavour, time_mode)
    else:
        bootstrap = Bootstrap(processor_factory(processor))
    if not is_connect(df.sparkSession):  # on Connect an executor that cannot import spate fails the job itself
        check_executor_python(df.sparkSession)
    work = f"_bootstrap-{uuid.uuid4().hex[:8]}"
    overrides = {"checkpoint_root": join_uri(target, work), "parallelism": parallelism,
                 "max_parallelism": max_parallelism, **settings}
    try:
        _run_once(df, key, bootstrap, {k: v for k, v in overrides.items() if v is not None}, target)
    finally:
        _remove_work_root(target_storage, work)
    return load_checkpoint(target_storage)


def _remove_work_root(target: CheckpointStorage, work: str) -> None:
    """Delete the bootstrap's own checkpoint root (a directory with a random name only it wrote to)."""
    import pyarrow.fs as pafs

    path = target.path(work)
    if target.fs.get_file_info(path).type != pafs.FileType.NotFound:
        target.fs.delete_dir(path)


def _run_once(df: Any, key: str | Sequence[str], bootstrap: Processor, overrides: dict[str, Any],
              target: str) -> None:
    """One spate batch of ``bootstrap`` over ``df`` (the job a micro-batch runs), its checkpoint copied to
    ``target`` as a savepoint."""
    from spate.spark.stream import StatefulStream

    stream = StatefulStream(_BatchAsStream(df), key, bootstrap, _NO_OUTPUT_SCHEMA, **overrides)
    session = df.sparkSession
    adaptive = session.conf.get("spark.sql.adaptive.enabled", None)  # the batch job turns it off: restore it
    try:
        stream.run_one_batch(df, savepoint_to=target)
    finally:
        if adaptive is None:
            session.conf.unset("spark.sql.adaptive.enabled")
        else:
            session.conf.set("spark.sql.adaptive.enabled", adaptive)


class _BatchAsStream:
    """A batch DataFrame standing in for the stream of a :class:`StatefulStream` that runs one batch job and is
    never started."""

    isStreaming = True  # noqa: N815 - the DataFrame attribute it stands in for

    def __init__(self, df: Any) -> None:
        self._df = df

    def __getattr__(self, name: str) -> Any:
        return getattr(self._df, name)


class Bootstrap(Processor):
    """Runs a spate processor to write state only: its outputs are consumed and dropped."""

    def __init__(self, factory: ProcessorFactory) -> None:
        self.factory = factory
        self.inner: Processor | None = None

    def open(self, ctx: Context) -> None:
        inner = self.factory()
        if not isinstance(inner, Processor):
            raise ProcessorError(f"a bootstrap processor must be a spate Processor or a pyspark StatefulProcessor, got "
                                 f"{type(inner).__qualname__}")
        self.inner = inner
        inner.open(ctx)

    def start_batch(self, ctx: Context) -> None:
        assert self.inner is not None
        self.inner.start_batch(ctx)

    def process(self, key: Any, rows: Sequence[Row], ctx: Context) -> None:
        assert self.inner is not None
        _drain(self.inner.process(key, rows, ctx))

    def end_batch(self, ctx: Context) -> None:
        assert self.inner is not None
        _drain(self.inner.end_batch(ctx))

    def close(self) -> None:
        if self.inner is not None:
            self.inner.close()


def _drain(produced: Iterable[Row] | None) -> None:
    for _ in produced or ():
        pass


class InitialStateBootstrap(StatefulProcessorAdapter):
    """A ``StatefulProcessor`` writing its states from initial-state rows (``handleInitialState``), through the
    adapter's handle: values encoded and schemas recorded exactly as a query running the processor does."""

    def __init__(self, processor: Any, flavour: str = "pandas", time_mode: str = "None") -> None:
        from pyspark.sql.streaming import StatefulProcessor

        if type(processor).handleInitialState is StatefulProcessor.handleInitialState:
            raise ProcessorError(f"{type(processor).__qualname__} does not implement handleInitialState, which "
                                 "writes the bootstrapped state of a key from its rows")
        super().__init__(processor, flavour, time_mode)
        self.drop_late_rows = False  # initial state is never late

    def process(self, key: Any, rows: Sequence[Row], ctx: Context) -> Iterable[Row] | None:
        return self.process_initial(key, rows, ctx)


__all__ = ["Bootstrap", "InitialStateBootstrap", "read_state", "write_savepoint"]
