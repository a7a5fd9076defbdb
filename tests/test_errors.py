"""Typed errors: every error a user or an operator can cause is a ``SpateError`` subclass that is also the builtin
exception callers may already catch, and says what is wrong and how to fix it.

(a) Builtin exceptions are raised in the library only for internal invariants: their raises are counted here (at
most ``BUDGET``, each listed when the test fails). (b) Every error class is a ``SpateError`` with the builtin bases
its table below names, and every exception class any library module defines is a ``SpateError``. (c) Mistakes a
user makes through the public API raise the typed error, still the builtin the code raised before, with a
message naming the fix."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
import sys
from pathlib import Path

import pyarrow as pa
import pytest

import spate
import spate.errors as errors
from spate import (
    AutoscalePolicy,
    ChangelogConfig,
    CheckpointStorage,
    Coordinator,
    FileMergingConfig,
    IcebergSink,
    ListStateDescriptor,
    LocalRunner,
    ParquetSink,
    Processor,
    ReducingStateDescriptor,
    SlidingWindows,
    TumblingWindows,
    ValueStateDescriptor,
    WindowedProcessor,
    default_max_parallelism,
    key_group,
    key_group_range,
    subtask_for_key_group,
)
from spate.pacing import Pace
from spate.runtime.batch import BatchProcessor
from spate.runtime.settings import SpateSettings

SRC = Path(spate.__file__).resolve().parent

# -- (a) the builtin raises left ----------------------------------------------------------------------------

BUDGET = 30
BUILTINS = ("ValueError", "TypeError", "RuntimeError", "KeyError", "LookupError", "IndexError", "OSError",
            "IOError", "AssertionError", "FileNotFoundError", "FileExistsError", "PermissionError",
            "NotImplementedError", "ArithmeticError", "ZeroDivisionError", "OverflowError", "Exception")
# ``raise ValueError(...)`` and also ``return ValueError(...)``: an error made by a helper for its caller to raise.
# AttributeError is left out: ``__getattr__`` must raise it for ``hasattr`` and ``getattr(x, n, default)``.
BUILTIN_RAISE = re.compile(r"(?:^|:)[ \t]*(?:raise|return)[ \t]+(?:builtins\.)?(" + "|".join(BUILTINS) + r")\b",
                           re.MULTILINE)


def builtin_raises() -> list[str]:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        text = path.read_text()
        for m in BUILTIN_RAISE.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            found.append(f"{path.relative_to(SRC.parent)}:{line}: {text.splitlines()[line - 1].strip()}")
    return found


def test_the_regex_finds_builtin_raises_and_not_spates_own():
    sample = ("    raise ValueError('x')\n        return TypeError(f'y')\n    raise SettingError('z')\n"
              "    raise InvalidKeyError('k')\n    # raise KeyError in a comment\n    raise OSError(2, 'gone')\n"
              "    if not ok: raise RuntimeError\n    raise ValueErrors('not a builtin')\n")
    found = [m.group(1) for m in BUILTIN_RAISE.finditer(sample)]
    assert found == ["ValueError", "TypeError", "OSError", "RuntimeError"]


def test_few_builtin_raises_are_left_in_the_library():
    left = builtin_raises()
    print(f"{len(left)} builtin raises left in src/spate (internal invariants):", *left, sep="\n  ")
    assert len(left) <= BUDGET, (f"{len(left)} raises of builtin exceptions in src/spate (at most {BUDGET}): a "
                                 "mistake a user or operator can make raises a SpateError subclass from "
                                 "spate.errors that keeps the builtin as a base:\n" + "\n".join(left))


# -- (b) the hierarchy --------------------------------------------------------------------------------------

# class -> the builtin exceptions it must stay an instance of (what callers may already catch)
BUILTIN_BASES: dict[str, tuple[type[BaseException], ...]] = {
    "SpateError": (),
    "CorruptFileError": (),
    "MissingFileError": (),
    "IncompatibleStateError": (),
    "FencedError": (),
    "CheckpointError": (),
    "NotARootError": (),
    "SerializationError": (TypeError,),
    "SettingError": (TypeError, ValueError),
    "OutputError": (TypeError,),
    "InvalidKeyError": (TypeError, ValueError),
    "StorageError": (OSError,),
    "DiskFullError": (OSError,),
    "MissingPackageError": (RuntimeError,),
    "InvalidParallelismError": (TypeError, ValueError),
    "StateDescriptorError": (TypeError, ValueError),
    "StateAccessError": (RuntimeError, TypeError, ValueError),
    "ProcessorError": (TypeError, ValueError),
    "EventTimeError": (TypeError, ValueError),
    "WindowError": (ValueError,),
    "TableSinkError": (ValueError,),
}


def error_classes() -> dict[str, type[BaseException]]:
    return {name: c for name, c in vars(errors).items()
            if inspect.isclass(c) and issubclass(c, BaseException) and c.__module__ == errors.__name__}


def test_every_error_class_is_listed_here_with_its_builtin_bases():
    assert sorted(error_classes()) == sorted(BUILTIN_BASES), "a class was added to spate.errors: list it above"


@pytest.mark.parametrize("name", sorted(BUILTIN_BASES))
def test_every_error_class_is_a_spate_error_and_its_builtins(name):
    cls = error_classes()[name]
    error = cls(2, "a message") if issubclass(cls, OSError) else cls("a message")
    assert isinstance(error, errors.SpateError)
    for builtin in BUILTIN_BASES[name]:
        assert isinstance(error, builtin), f"{name} is no longer a {builtin.__name__}"
    builtins_now = {b for b in cls.__mro__ if b.__module__ == "builtins" and b not in (BaseException, Exception,
                                                                                         object)}
    expected = {b2 for b in BUILTIN_BASES[name] for b2 in b.__mro__} - {BaseException, Exception, object}
    assert builtins_now == expected, f"{name}: builtin bases {builtins_now}, the table says {expected}"


def test_every_error_class_is_exported_by_spate():
    assert set(error_classes()) <= set(spate.__all__)
    assert all(getattr(spate, name) is cls for name, cls in error_classes().items())


def _library_modules() -> list[str]:
    names = ["spate"]
    for info in pkgutil.walk_packages([str(SRC)], prefix="spate."):
        names.append(info.name)
    return names


def test_every_exception_class_the_library_defines_is_a_spate_error():
    pytest.importorskip("pyspark")
    strays = []
    for name in _library_modules():
        module = importlib.import_module(name)
        for attr, value in vars(module).items():
            if (inspect.isclass(value) and issubclass(value, BaseException) and value.__module__ == name
                    and not attr.startswith("_") and not issubclass(value, errors.SpateError)):
                strays.append(f"{name}.{attr}")
    assert strays == [], f"exception classes that are not SpateErrors: {strays}"


# -- (c) user mistakes through the public API ---------------------------------------------------------------

COUNT = ValueStateDescriptor("count", default=0)


class Count(Processor):
    def open(self, ctx):
        self.count = ctx.state(COUNT)

    def process(self, key, rows, ctx):
        self.count.update(self.count.value() + len(rows))
        yield {"user": key, "count": self.count.value()}


class StateInOpen(Processor):
    def open(self, ctx):
        ctx.state(COUNT).value()  # no key is current in open()

    def process(self, key, rows, ctx):
        return None


class TimerInEndBatch(Count):
    def end_batch(self, ctx):
        ctx.register_processing_time_timer(1_000)  # timers belong to a key


class TimerAtHalfPast(Count):
    def process(self, key, rows, ctx):
        ctx.register_event_time_timer(1.5)
        return None


class PutTooFew(BatchProcessor):
    def open(self, ctx):
        self.count = ctx.bulk_state(COUNT)

    def process_batch(self, batch, ctx):
        self.count.put_many(batch, [1] * (len(batch.keys) + 1))


class ReducingInBulk(BatchProcessor):
    def open(self, ctx):
        ctx.bulk_state(ReducingStateDescriptor("sum", reduce_fn=lambda a, b: a + b))

    def process_batch(self, batch, ctx):
        return None


class UnknownSerializer(Processor):
    def open(self, ctx):
        ctx.state(ValueStateDescriptor("v", serializer="yaml"))

    def process(self, key, rows, ctx):
        return None


def _runner(tmp_path, processor=Count, **kwargs):
    return LocalRunner(processor, key=kwargs.pop("key", "user"), checkpoint_root=str(tmp_path / "root"), **kwargs)


def _run(tmp_path, processor, rows=({"user": "a"},), **kwargs):
    with _runner(tmp_path, processor, **kwargs) as runner:
        runner.run_batch(0, list(rows))


def _savepoint_inside_the_root(tmp_path):
    with _runner(tmp_path) as runner:
        runner.run_batch(0, [{"user": "a"}])
        runner.savepoint(str(tmp_path / "root" / "mine"))


def _without_boto3(monkeypatch):
    from spate import objectstore

    monkeypatch.setitem(sys.modules, "boto3", None)  # import boto3 fails as if it were not installed
    objectstore._s3_client.cache_clear()
    try:
        objectstore._s3_client((("endpoint_override", "test-errors:1"),))
    finally:
        objectstore._s3_client.cache_clear()


# (what, the mistake, the error, the builtin it raised before, what the message must say: the thing and the fix)
MISTAKES = [
    # parallelism and key groups
    ("parallelism 0", lambda t, m: _runner(t, parallelism=0), errors.InvalidParallelismError, ValueError,
     r"parallelism must be >= 1, got 0: pass the number of subtasks as a positive int"),
    ("max parallelism too large", lambda t, m: _runner(t, max_parallelism=40_000), errors.InvalidParallelismError,
     ValueError, r"max_parallelism must be in 1\.\.32768, got 40000: pass a number of key groups in that range"),
    ("subtask index out of range", lambda t, m: key_group_range(128, 4, 4), errors.InvalidParallelismError,
     ValueError, r"subtask index must be in 0\.\.3, got 4: a query at parallelism 4 has subtasks 0\.\.3"),
    ("key group as text", lambda t, m: subtask_for_key_group(128, 4, "7"), errors.InvalidParallelismError,
     TypeError, r"key_group must be an int, got str: pass a key group"),
    ("default max parallelism of text", lambda t, m: default_max_parallelism("2"), errors.InvalidParallelismError,
     TypeError, r"parallelism must be an int, got str: pass the number of subtasks as an int"),
    ("autoscale minimum 0", lambda t, m: AutoscalePolicy(0, 4, target_batch_ms=100),
     errors.InvalidParallelismError, ValueError, r"min_parallelism must be >= 1, got 0: pass a positive number"),
    ("coordinator parallelism 0", lambda t, m: Coordinator(str(t / "root")).start(0), errors.InvalidParallelismError,
     ValueError, r"parallelism must be >= 1, got 0: pass the number of subtasks"),
    # settings
    ("unknown table", lambda t, m: _runner(t, table="rocksdb"), errors.SettingError, ValueError,
     r"unknown state table 'rocksdb': use one of \('heap', 'lmdb'\)"),
    ("unknown conf key", lambda t, m: SpateSettings.from_conf({"spark.spate.paralelism": "2"}), errors.SettingError,
     ValueError, r"unknown setting spark\.spate\.paralelism; known: \[.*'spark\.spate\.parallelism'"),
    ("conf value not a bool", lambda t, m: SpateSettings.from_conf({"spark.spate.changelog": "yes"},
                                                                    checkpoint_root="r"),
     errors.SettingError, ValueError, r"spark\.spate\.changelog='yes': expected true or false, got 'yes': set it"),
    ("file merging mode", lambda t, m: FileMergingConfig(mode="always"), errors.SettingError, ValueError,
     r"file-merging mode 'always' is unknown: use 'within' or 'across'"),
    ("file merging of another type", lambda t, m: _runner(t, file_merging=3), errors.SettingError, TypeError,
     r"file_merging must be a bool, 'off', 'within', 'across' or a FileMergingConfig, got 3"),
    ("changelog interval 0", lambda t, m: ChangelogConfig(materialization_interval_ms=0), errors.SettingError,
     ValueError, r"materialization_interval_ms must be > 0, got 0: pass a positive number of milliseconds"),
    ("materialization pace 0", lambda t, m: ChangelogConfig(materialization_write_mb_per_s=0), errors.SettingError,
     ValueError, r"materialization_write_mb_per_s must be > 0 or None, got 0: pass a positive number of MB a second"),
    ("materialization part 0", lambda t, m: ChangelogConfig(materialization_part_mb=0), errors.SettingError,
     ValueError, r"materialization_part_mb must be > 0 or None, got 0: pass a positive number of MB"),
    ("pace of -1 B/s", lambda t, m: Pace(-1), errors.SettingError, ValueError,
     r"a pace must be a positive number of bytes a second, got -1: pass a positive rate, or None"),
    ("retained 0", lambda t, m: Coordinator(str(t / "root"), retained=0), errors.SettingError, ValueError,
     r"retained must be >= 1, got 0: keep at least one complete checkpoint"),
    ("key types of a list of lists", lambda t, m: _runner(t, key_types=[["string"]]), errors.SettingError,
     TypeError, r"key type must be a Spark DDL type name or a pyspark DataType, got list: .*pass e\.g\. key_types="),
    ("unknown key type", lambda t, m: key_group("a", 128, key_types="varchar2"), errors.SettingError, TypeError,
     r"unsupported Spark key type 'varchar2'; supported types: int/integer"),
    ("savepoint inside the root", lambda t, m: _savepoint_inside_the_root(t), errors.SettingError, ValueError,
     r"savepoint target .*mine is inside the checkpoint root .*use a directory under savepoints/ or outside"),
    ("storage path out of the root", lambda t, m: CheckpointStorage(str(t)).read("../etc/passwd"),
     errors.SettingError, ValueError, r"invalid storage path '\.\./etc/passwd': escapes the checkpoint root; name"),
    ("unknown serializer", lambda t, m: _run(t, UnknownSerializer), errors.SettingError, ValueError,
     r"unknown serializer 'yaml': use 'msgpack' \(default\), 'pickle' or a Serializer"),
    # state descriptors
    ("state without a name", lambda t, m: ValueStateDescriptor(""), errors.StateDescriptorError, ValueError,
     r"state name must be a non-empty string, got '': name the state"),
    ("TTL of zero", lambda t, m: ListStateDescriptor("log", ttl_ms=0), errors.StateDescriptorError, ValueError,
     r"state 'log': ttl_ms must be a positive int \(milliseconds\), got 0: pass e\.g\. ttl_ms=60_000"),
    ("reducing state without its function", lambda t, m: ReducingStateDescriptor("sum"),
     errors.StateDescriptorError, ValueError, r"reducing state 'sum' needs reduce_fn=callable\(acc, value\)"),
    ("bulk state of reducing state", lambda t, m: _run(t, ReducingInBulk), errors.StateDescriptorError, TypeError,
     r"bulk_state supports value, list and map state; 'sum' is ReducingStateDescriptor: use state\(descriptor\)"),
    # keys
    ("a str key as an int", lambda t, m: key_group("a", 128, key_types="int"), errors.InvalidKeyError, TypeError,
     r"cannot hash str value 'a' as Spark type 'int': give the key column values of that type"),
    ("an int key out of range", lambda t, m: key_group(2**40, 128, key_types="int"), errors.InvalidKeyError,
     ValueError, r"value 1099511627776 out of range for Spark type 'int' .*pass key_types with a wider type"),
    ("a two-column key of one value", lambda t, m: key_group("a", 128, key_types=["string", "int"]),
     errors.InvalidKeyError, ValueError, r"expected a 2-column key \(tuple\), got 'a': give a tuple of 2 values"),
    ("a key spate does not key by", lambda t, m: _run(t, Count, rows=[{"user": object()}]),
     errors.InvalidKeyError, TypeError, r"cannot infer a Spark type for key value of type object; .*pass key_types"),
    # state handles and timers
    ("keyed state outside a key", lambda t, m: _run(t, StateInOpen), errors.StateAccessError, RuntimeError,
     r"keyed state 'count' used outside a key: .*use operator state in open\(\) and end_batch\(\)"),
    ("a timer outside a key", lambda t, m: _run(t, TimerInEndBatch), errors.StateAccessError, RuntimeError,
     r"timers belong to a key: register and delete them in process\(\) or on_timer\(\)"),
    ("a timer at a float time", lambda t, m: _run(t, TimerAtHalfPast), errors.StateAccessError, TypeError,
     r"timer timestamp must be an int \(ms\), got 1\.5: pass epoch milliseconds as an int"),
    ("more values than keys", lambda t, m: _run(t, PutTooFew), errors.StateAccessError, ValueError,
     r"put_many on state 'count': 2 values for 1 keys: pass one value per key, in the keys' order"),
    # processors
    ("not a processor", lambda t, m: _runner(t, 42), errors.ProcessorError, TypeError,
     r"processor must be a Processor, a Processor class or a factory, got 42: pass an instance or subclass"),
    ("initial state without process_initial", lambda t, m: _run(t, Count, initial_state=[{"user": "a", "n": 1}]),
     errors.ProcessorError, ValueError, r"Count does not override process_initial.*or drop initial_state"),
    # windows and event time
    ("a window of size 0", lambda t, m: TumblingWindows(0), errors.WindowError, ValueError,
     r"size_ms must be a positive int \(milliseconds\), got 0: pass e\.g\. size_ms=60_000"),
    ("a slide larger than the window", lambda t, m: SlidingWindows(1_000, 2_000), errors.WindowError, ValueError,
     r"slide_ms \(2000\) larger than size_ms \(1000\) leaves gaps: use a slide at most the size"),
    ("event-time windows without their column", lambda t, m: WindowedProcessor(TumblingWindows(1_000), reduce=max),
     errors.WindowError, ValueError, r"event-time windows need timestamp= \(the event-time column"),
    ("a row without its event time", lambda t, m: _run(t, WindowedProcessor(TumblingWindows(1_000), timestamp="ts",
                                                                          reduce=max), rows=[{"user": "a"}]),
     errors.EventTimeError, ValueError, r"has no event time in column 'ts': give every row a value there"),
    ("an event time in float seconds", lambda t, m: _run(t, WindowedProcessor(TumblingWindows(1_000), timestamp="ts",
                                                                             reduce=max),
                                                         rows=[{"user": "a", "ts": 1.5}]),
     errors.EventTimeError, TypeError, r"event time must be int milliseconds or a datetime, got float: give"),
    # table sinks
    ("a table sink without a location", lambda t, m: ParquetSink(""), errors.TableSinkError, None,
     r"ParquetSink needs the table's location \(a path or URI\), got '': pass the table's directory"),
    ("a table sink without an output schema", lambda t, m: _runner(t, sink=ParquetSink(str(t / "table"))),
     errors.TableSinkError, None, r"writes the outputs to a table: pass output_schema=pyarrow\.schema"),
    ("an Iceberg table without a namespace", lambda t, m: IcebergSink("clicks", warehouse=str(t / "wh")),
     errors.TableSinkError, None, r"IcebergSink needs a table identifier 'namespace\.name', got 'clicks'"),
    ("a table sink nobody opened", lambda t, m: ParquetSink(str(t / "table")).write(pa.table({"a": [1]}), 0, 0),
     errors.TableSinkError, None, r"was not opened by the query's driver .*give the sink to LocalRunner"),
    # packages
    ("an S3 root without boto3", lambda t, m: _without_boto3(m), errors.MissingPackageError, RuntimeError,
     r"checkpoints on S3 need boto3 .*pip install 'spate\[s3\]'"),
]


@pytest.mark.parametrize(("mistake", "expected", "builtin", "says"), [m[1:] for m in MISTAKES],
                         ids=[m[0] for m in MISTAKES])
def test_a_user_mistake_raises_a_typed_error_naming_the_fix(tmp_path, monkeypatch, mistake, expected, builtin, says):
    with pytest.raises(errors.SpateError) as caught:
        mistake(tmp_path, monkeypatch)
    error = caught.value
    assert type(error) is expected, f"{type(error).__name__}: {error}"
    if builtin is not None:
        assert isinstance(error, builtin), f"{type(error).__name__} is not the {builtin.__name__} it was"
    assert re.search(says, str(error)), str(error)


def test_old_except_clauses_still_catch_the_typed_errors(tmp_path):
    """What a caller wrote before the errors were typed still works."""
    with pytest.raises(ValueError, match="parallelism must be >= 1"):
        _runner(tmp_path, parallelism=0)
    with pytest.raises(TypeError, match="cannot hash str value"):
        key_group("a", 128, key_types="int")
    with pytest.raises(RuntimeError, match="used outside a key"):
        _run(tmp_path, StateInOpen)
    try:
        ValueStateDescriptor("")
    except ValueError as e:
        assert isinstance(e, spate.StateDescriptorError)
    else:
        pytest.fail("no error")


def test_a_state_value_that_cannot_be_encoded_is_a_serialization_error(tmp_path):
    class Stores(Processor):
        def open(self, ctx):
            self.v = ctx.state(ValueStateDescriptor("v"))

        def process(self, key, rows, ctx):
            self.v.update(object())

    with pytest.raises(spate.SerializationError, match=r"state 'v': cannot serialize value of type object with "
                                                       r"msgpack \(cannot encode object with msgpack: convert it"):
        _run(tmp_path, Stores)
