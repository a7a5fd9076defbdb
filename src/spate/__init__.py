"""spate: Flink-grade state for PySpark streaming.

Keyed state in key groups (rescalable to any parallelism up to the max parallelism), operator state that
is split, unioned or broadcast on rescale (FLIP-8), checkpoints coordinated by a driver-side
:class:`Coordinator` (incremental with the changelog, FLIP-158; written as segments of few physical files
with file merging, FLIP-306), and a :class:`LocalRunner` that drives the same driver/task protocol
in-process.

Typical use::

    from spate import LocalRunner, Processor, ValueStateDescriptor

    class Count(Processor):
        def open(self, ctx):
            self.count = ctx.state(ValueStateDescriptor("count", default=0))

        def process(self, key, rows, ctx):
            self.count.update(self.count.value() + len(rows))
            yield {"user": key, "count": self.count.value()}

    runner = LocalRunner(Count, key="user", checkpoint_root="/tmp/ckpt", parallelism=2)
    runner.run([[{"user": "a"}, {"user": "b"}], [{"user": "a"}]])
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from spate.errors import (
    CheckpointError,
    CorruptFileError,
    DiskFullError,
    EventTimeError,
    FencedError,
    IncompatibleStateError,
    InvalidKeyError,
    InvalidParallelismError,
    MissingFileError,
    MissingPackageError,
    NotARootError,
    OutputError,
    ProcessorError,
    SerializationError,
    SettingError,
    SpateError,
    StateAccessError,
    StateDescriptorError,
    StorageError,
    TableSinkError,
    WindowError,
)

if TYPE_CHECKING:
    from spate.changelog.state import ChangelogConfig
    from spate.checkpoint.coordinator import Coordinator
    from spate.checkpoint.inspect import (
        keyed_state_entries,
        load_checkpoint,
        operator_state_elements,
        verify_checkpoint,
    )
    from spate.checkpoint.metadata import CheckpointMetadata
    from spate.filemerging.config import FileMergingConfig
    from spate.fs import CheckpointStorage
    from spate.keygroups import default_max_parallelism, key_group, key_group_range, subtask_for_key_group
    from spate.runtime.autoscale import AutoscalePolicy, ScalingDecision
    from spate.runtime.batch import BatchProcessor, KeyedBatch, KeyRows
    from spate.runtime.local import BatchResult, LocalRunner
    from spate.runtime.processor import Context, Processor
    from spate.sinks import DeltaSink, IcebergSink, ParquetSink, TableSink
    from spate.state.descriptors import (
        AggregateFunction,
        AggregatingStateDescriptor,
        ListStateDescriptor,
        MapStateDescriptor,
        ReducingStateDescriptor,
        StateDescriptor,
        ValueStateDescriptor,
    )
    from spate.windows import SessionWindows, SlidingWindows, TumblingWindows, Window, WindowedProcessor

# The rest of the public API, by the module that defines it, imported on first use: a process that needs one part
# of the library (a materialization's reader process, started for each materialization) does not import the rest.
# The names are the imports above, which type checkers read (tests/test_public_api.py checks the two agree).
_LAZY: dict[str, tuple[str, ...]] = {
    "spate.changelog.state": ("ChangelogConfig",),
    "spate.checkpoint.coordinator": ("Coordinator",),
    "spate.checkpoint.inspect": ("keyed_state_entries", "load_checkpoint", "operator_state_elements",
                                 "verify_checkpoint"),
    "spate.checkpoint.metadata": ("CheckpointMetadata",),
    "spate.filemerging.config": ("FileMergingConfig",),
    "spate.fs": ("CheckpointStorage",),
    "spate.keygroups": ("default_max_parallelism", "key_group", "key_group_range", "subtask_for_key_group"),
    "spate.runtime.autoscale": ("AutoscalePolicy", "ScalingDecision"),
    "spate.runtime.batch": ("BatchProcessor", "KeyedBatch", "KeyRows"),
    "spate.runtime.local": ("BatchResult", "LocalRunner"),
    "spate.runtime.processor": ("Context", "Processor"),
    "spate.sinks": ("DeltaSink", "IcebergSink", "ParquetSink", "TableSink"),
    "spate.state.descriptors": ("AggregateFunction", "AggregatingStateDescriptor", "ListStateDescriptor",
                                "MapStateDescriptor", "ReducingStateDescriptor", "StateDescriptor",
                                "ValueStateDescriptor"),
    "spate.windows": ("SessionWindows", "SlidingWindows", "TumblingWindows", "Window", "WindowedProcessor"),
}
_MODULE_OF = {name: module for module, names in _LAZY.items() for name in names}

if not TYPE_CHECKING:  # type checkers read the imports above, where a misspelt name stays an error

    def __getattr__(name: str) -> Any:
        module = _MODULE_OF.get(name)
        if module is None:
            raise AttributeError(f"module 'spate' has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        globals()[name] = value  # found directly from now on
        return value

    def __dir__() -> list[str]:
        return sorted({*globals(), *_MODULE_OF})


__version__ = "0.1.0"

__all__ = [
    "AggregateFunction", "AggregatingStateDescriptor", "BatchProcessor", "BatchResult", "ChangelogConfig",
    "CheckpointError", "KeyRows", "KeyedBatch",
    "CheckpointMetadata", "CheckpointStorage", "Context", "Coordinator", "CorruptFileError", "FencedError",
    "FileMergingConfig", "IncompatibleStateError",
    "ListStateDescriptor", "LocalRunner", "MapStateDescriptor", "MissingFileError", "Processor",
    "ReducingStateDescriptor", "SerializationError", "SpateError", "StateDescriptor", "ValueStateDescriptor",
    "default_max_parallelism", "key_group", "key_group_range", "keyed_state_entries", "load_checkpoint",
    "operator_state_elements", "subtask_for_key_group", "verify_checkpoint",
    "SessionWindows", "SlidingWindows", "TumblingWindows", "Window", "WindowedProcessor",
    "AutoscalePolicy", "ScalingDecision",
    "DeltaSink", "IcebergSink", "ParquetSink", "TableSink",
    "DiskFullError", "EventTimeError", "InvalidKeyError", "InvalidParallelismError", "MissingPackageError",
    "NotARootError", "OutputError", "ProcessorError", "SettingError", "StateAccessError", "StateDescriptorError",
    "StorageError", "TableSinkError", "WindowError",
]
