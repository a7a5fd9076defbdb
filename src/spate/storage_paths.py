"""Paths below a checkpoint root: a relative path that cannot escape the root, and a URI joined with one."""

from __future__ import annotations

import posixpath

from spate.errors import SettingError


def validate_relative_path(rel: str) -> str:
    """Return ``rel`` normalised, or raise :class:`SettingError` (a ``ValueError``) if it could escape the
    storage root (a path read from metadata is then a :class:`CorruptFileError`, see ``read_metadata``)."""
    if not isinstance(rel, str) or not rel:
        raise SettingError(f"invalid storage path {rel!r}: must be a non-empty relative path")
    if rel.startswith("/") or "\\" in rel or "://" in rel:
        raise SettingError(f"invalid storage path {rel!r}: must be relative to the checkpoint root")
    norm = posixpath.normpath(rel)
    if norm == "." or norm.startswith("../") or norm == ".." or "/../" in f"/{norm}/":
        raise SettingError(f"invalid storage path {rel!r}: escapes the checkpoint root; name a file below it")
    return norm


def join_uri(uri: str, rel: str) -> str:
    """``uri`` + ``/rel``, keeping a query string (``s3://b/p?endpoint_override=...``) at the end."""
    base, sep, query = uri.partition("?")
    return f"{base.rstrip('/')}/{validate_relative_path(rel)}{sep}{query}"
