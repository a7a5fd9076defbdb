"""The names spate writes under a checkpoint root, and nothing else.

spate deletes only files whose names match this layout: a user's file, a file another tool put into the
root, or anything reached through a symbolic link is never touched. ``docs/formats.md`` lists the layout.
"""

from __future__ import annotations

import re

_HEX = r"[0-9a-f]{32}"
_TEMP = rf"(?:\.{_HEX}\.tmp)?"  # a marker's temporary file, written before the atomic rename/link
_FILES = re.compile("|".join(rf"(?:{p})" for p in (
    rf"_query{_TEMP}",
    rf"_delivered{_TEMP}",
    r"_epochs/\d+",
    rf"_epochs/\d+\.(?:seal|completed){_TEMP}",
    rf"chk-\d+/_metadata{_TEMP}",
    rf"chk-\d+/_delivered{_TEMP}",
    rf"chk-\d+/{_HEX}\.op",
    rf"shared/subtask-\d+-\d+/{_HEX}\.(?:kg|seg)",
    rf"shared/changelog/{_HEX}\.chg",
    rf"taskowned/[0-9A-Za-z_-]+/{_HEX}\.seg",
    rf"staged/\d+/{_HEX}\.out",
)))
_DIRS = re.compile(r"_epochs|chk-\d+|shared|shared/subtask-\d+-\d+|shared/changelog|taskowned|"
                   r"taskowned/[0-9A-Za-z_-]+|staged|staged/\d+")


def is_spate_file(rel: str) -> bool:
    """Whether ``rel`` (relative to a checkpoint root) is a name spate writes there."""
    return _FILES.fullmatch(rel) is not None


def is_spate_dir(rel: str) -> bool:
    """Whether ``rel`` is a directory spate creates under a checkpoint root."""
    return _DIRS.fullmatch(rel) is not None


def is_marker(rel: str) -> bool:
    """Whether ``rel`` is a marker (``_query``, ``_metadata``, ``_epochs/...``) rather than a data file."""
    return rel.rpartition("/")[2].startswith("_") or rel.startswith("_epochs/")


def is_engine_owned(rel: str) -> bool:
    """Top-level directories whose names start with ``_`` (other than spate's ``_epochs``) belong to the engine
    that runs spate (Spark's own checkpoint, ``_spark``): spate neither reads nor deletes them."""
    top, sep, _rest = rel.partition("/")
    return bool(sep) and top.startswith("_") and top != "_epochs"
