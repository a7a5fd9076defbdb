"""Exceptions raised by spate. Every message names the thing that is wrong and how to fix it."""

from __future__ import annotations

import contextlib
import errno
import re
from collections.abc import Iterator

RESTORE_ADVICE = ("restore an older checkpoint into a new checkpoint root (restore_from='<root>/chk-<n>'; "
                  "`spate checkpoints list <root>` shows which are left) or a savepoint (restore_from='<directory>')")


class SpateError(Exception):
    """Base class of every error spate raises on purpose."""


_ERROR_CLASS = re.compile(r"\[([A-Z][A-Z0-9_]*(?:\.[A-Z][A-Z0-9_]*)*)\]")


def error_class_of(message: str) -> str | None:
    """The first Spark error class ``message`` names (``"[STREAM_FAILED] ..."`` → ``STREAM_FAILED``), or None."""
    found = _ERROR_CLASS.search(message)
    return found.group(1) if found else None


class SparkErrorClass:
    """Mixin of a :class:`SpateError` that Spark raises with an error class (its message names it,
    ``"[CLASS] ..."``): ``getCondition()`` and ``getErrorClass()`` give the class as pyspark's
    ``PySparkException`` does, so code that checks it on Spark works on spate; ``str()`` is the message as is."""

    def _spark_message(self) -> str:
        message = getattr(self, "_message", None)  # a PySparkException keeps its message there
        if isinstance(message, str):
            return message
        args = getattr(self, "args", ())
        return str(args[0]) if args else ""

    def getCondition(self) -> str | None:  # noqa: N802 - pyspark's name
        """Spark's error class of this error (e.g. ``STATEFUL_PROCESSOR_INCORRECT_TIME_MODE_TO_ASSIGN_TTL``)."""
        return error_class_of(self._spark_message())

    def getErrorClass(self) -> str | None:  # noqa: N802 - pyspark's name (deprecated there for getCondition)
        return self.getCondition()

    def getMessage(self) -> str:  # noqa: N802 - pyspark's name
        return self._spark_message()

    def __str__(self) -> str:
        return self._spark_message()


class CorruptFileError(SpateError):
    """A checkpoint file failed its checksum, framing or format-version check."""


class MissingFileError(SpateError):
    """A file that a checkpoint references does not exist."""


class IncompatibleStateError(SpateError):
    """Stored state cannot be used with the current settings (max parallelism, state kind, ...)."""


class FencedError(SpateError):
    """Another driver has taken over this checkpoint root; this one must stop."""


class SerializationError(SpateError, TypeError):
    """A value could not be encoded or decoded by the state's serializer."""


class CheckpointError(SpateError):
    """A checkpoint could not be taken, completed or found."""


class NotARootError(CheckpointError):
    """The folder given as a checkpoint root was never a spate root (no ``_query``, no ``_epochs/``) and holds
    files: spate refuses it without writing or deleting anything (it would delete files it does not reference)."""


class SettingError(SpateError, TypeError, ValueError):
    """An argument or setting that cannot work (a wrong type, a root that is a file, a URI pyarrow cannot
    open), named with the fix."""


class OutputError(SpateError, TypeError):
    """A processor produced something that is not a valid output row (names the processor, key and field)."""


class InvalidKeyError(SpateError, TypeError, ValueError):
    """A key cannot be used: a type spate does not key by, types mixed within one key column, or a value that
    cannot be encoded (a string with lone surrogates). Names the key column and the fix."""


class StorageError(CheckpointError, OSError):
    """Checkpoint storage failed a write spate needed (a change set that could not be uploaded after its
    retries); names what was lost and the way back. An ``OSError`` too, as the storage's own errors are."""


class DiskFullError(StorageError):
    """Storage ran out of space (``ENOSPC``/``EDQUOT``) while writing a checkpoint file; names the file and the
    checkpoint. An ``OSError`` too, so retry policies treat it like the error it wraps."""


class MissingPackageError(SpateError, RuntimeError):
    """An optional package a feature needs is not installed (boto3 for an S3 root, deltalake, pyiceberg);
    names the ``pip install`` that adds it."""


class InvalidParallelismError(SettingError):
    """A parallelism, max parallelism, subtask index or key group that is not an int in its range (a
    ``TypeError`` for a wrong type, a ``ValueError`` for a value out of range: it is both); names the range."""


class StateDescriptorError(SpateError, TypeError, ValueError):
    """A state descriptor that cannot work (an empty name, a TTL that is not a positive int, a reducing or
    aggregating state without its function), or one an API does not take (``bulk_state`` of reducing state)."""


class StateAccessError(SpateError, RuntimeError, TypeError, ValueError):
    """Keyed state, bulk state or timers used in a way that cannot work: outside a key, values that do not
    match the keys they are for, a timer timestamp that is not an int, an unknown time domain."""


class ProcessorError(SpateError, TypeError, ValueError):
    """A processor the query cannot run: not a processor at all, or without the hook the query needs
    (``process_initial``/``handleInitialState`` when given an initial state)."""


class EventTimeError(SpateError, TypeError, ValueError):
    """An event-time value that is missing from its row or is not a time (int milliseconds or a datetime)."""


class WindowError(SpateError, ValueError):
    """A window or windowed processor defined with arguments that cannot work (a size that is not a positive
    int, a slide larger than the size, no or several window functions, lateness for processing time, ...)."""


class TableSinkError(SpateError, ValueError):
    """A table sink that cannot write or commit as configured: no location or table identifier, no output
    schema, a table whose columns differ from the query's output schema, a sink the query's driver did not
    open."""


_DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
_REPR_LIMIT = 80


def short_repr(value: object, limit: int = _REPR_LIMIT) -> str:
    """``repr(value)`` cut to at most ``limit`` characters (ending in "…"): keys quoted in error messages."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 1] + "…"


@contextlib.contextmanager
def naming_disk_full(path: str, checkpoint_id: int | None) -> Iterator[None]:
    """Re-raise a disk-full ``OSError`` raised inside as a :class:`DiskFullError` naming ``path`` (the file
    being written) and the checkpoint it belongs to; any other error passes unchanged."""
    try:
        yield
    except DiskFullError:
        raise
    except OSError as e:
        if e.errno not in _DISK_FULL_ERRNOS:
            raise
        checkpoint = f" of checkpoint {checkpoint_id}" if checkpoint_id is not None else ""
        raise DiskFullError(e.errno, f"{path}: no space left on the checkpoint storage while writing this file"
                                     f"{checkpoint} ({e.strerror or e}); free space or move the checkpoint root, "
                                     "then restart: the query resumes from its last complete checkpoint") from e
