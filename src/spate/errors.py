"""Exceptions raised by spate. Every message names the thing that is wrong and how to fix it."""

from __future__ import annotations


class SpateError(Exception):
    """Base class of every error spate raises on purpose."""


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
