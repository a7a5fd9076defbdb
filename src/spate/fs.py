"""Checkpoint storage I/O on ``pyarrow.fs`` URIs: one interface, :class:`CheckpointStorage`, with an
implementation per kind of file system, as pyiceberg's ``FileIO`` has.

- :class:`LocalStorage`: a local disk. Real directories; files are created exclusively by hard-linking an
  fsynced temporary file into place and replaced by renaming one; spate never reads, writes or deletes
  through a symbolic link below the root; listings walk the disk.
- :class:`ObjectStoreStorage`: S3, GCS, HDFS and the like. No directories to create or remove; exclusive
  create is a conditional write where the store has one (S3), best effort elsewhere.

``CheckpointStorage(uri)`` (or ``storage_for(uri)``, cached per process) picks the implementation for the URI.
Paths handed to a storage are relative to its root and validated so that nothing read from metadata can point
outside the root. The frame format spate files are made of is :mod:`spate.frames`.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import os
import posixpath
import stat
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from spate.errors import RESTORE_ADVICE, CheckpointError, CorruptFileError, MissingFileError, SettingError
from spate.file_counts import FileCounts
from spate.layout import is_spate_dir, is_spate_file
from spate.local_file_io import read_once, write_synced_temp
from spate.objectstore import put_if_absent
from spate.storage_paths import join_uri, validate_relative_path
from spate.write_behind import WriteBehindFile

log = logging.getLogger(__name__)
# a hard link cannot be made there (another file system; one without links): the file is copied instead
_NO_LINK = frozenset({errno.EXDEV, errno.EPERM, errno.EMLINK, errno.EOPNOTSUPP, errno.ENOTSUP})


class CheckpointStorage(ABC):
    """Files under one root URI: a local path, ``file://``, ``s3://``, ``gs://`` or ``hdfs://``.

    ``CheckpointStorage(uri, filesystem=None)`` makes the implementation for the URI's file system
    (:class:`LocalStorage` or :class:`ObjectStoreStorage`); calling an implementation directly checks that the
    file system is of its kind. The file system is resolved once, when the storage is made.

    Raises:
        SettingError: a ``uri`` that is not a string, names a file, or that pyarrow cannot open (the message
            names the fix); a relative path that is absolute or escapes the root.
        MissingFileError / CorruptFileError: a file read is gone, truncated or reached through a link.
        FileExistsError: ``create_exclusive`` of a file that exists (a builtin: the put-if-absent's answer).
    """

    has_directories: bool  # real directories, which stay when emptied (``remove_empty_dirs`` removes them)
    open_files_readable: bool  # bytes written to a file of ``open_new`` are readable before it is closed
    opens_with_a_request: bool  # opening a file to read asks the store its size (S3: a HEAD): see spate.open_files

    @staticmethod
    @abstractmethod
    def written_before(mtime_ns: int, instant_ns: int) -> bool:
        """Whether a file whose modification time is ``mtime_ns`` was certainly written before ``instant_ns``
        (at the storage's resolution)."""

    def __new__(cls, uri: str, filesystem: pafs.FileSystem | None = None) -> CheckpointStorage:
        if not isinstance(uri, str):
            raise SettingError(f"checkpoint root must be a path or URI string, got {uri!r}")
        fs, root = _resolve_filesystem(uri, filesystem)
        kind = LocalStorage if isinstance(fs, pafs.LocalFileSystem) else ObjectStoreStorage
        if kind is LocalStorage and os.path.isfile(root):
            raise SettingError(f"checkpoint root {uri} is a file; a root is a directory (spate creates it and "
                               "writes only its own files there): pass a directory path")
        if cls is CheckpointStorage:
            cls = kind
        elif not issubclass(cls, kind):
            raise SettingError(f"{uri}: a {cls.__name__} cannot hold a root on {type(fs).__name__}: use "
                               "CheckpointStorage(uri), which picks the implementation")
        storage = super().__new__(cls)
        storage._attach(uri, fs, root)
        return storage

    def _attach(self, uri: str, fs: pafs.FileSystem, root: str) -> None:
        """Set the storage up at ``root`` of ``fs`` (``uri`` names it)."""
        self.uri, self.fs, self.root = uri, fs, root
        self.counts = FileCounts()

    def __repr__(self) -> str:
        return f"CheckpointStorage({self.uri!r})"

    def path(self, rel: str) -> str:
        return f"{self.root}/{validate_relative_path(rel)}"

    def _base(self, rel: str) -> str:
        """The full path of the directory ``rel`` ("": the root)."""
        return self.path(rel) if rel else self.root

    def sub(self, rel: str) -> CheckpointStorage:
        """A storage of the same kind rooted at ``rel`` below this one, on the same file system."""
        sub = object.__new__(type(self))
        sub._attach(join_uri(self.uri, rel), self.fs, self.path(rel))
        return sub

    # -- writing ---------------------------------------------------------------------------------------------
    def write(self, rel: str, data: bytes) -> None:
        """Write a new file (callers use random names; no atomicity needed)."""
        self.write_parts(rel, (data,))

    def write_parts(self, rel: str, parts: Iterable[bytes]) -> int:
        """Write a new file from ``parts`` as they come, never holding it whole; returns its size."""
        size = 0
        with self.open_new(rel) as out:
            for part in parts:
                view = memoryview(part)
                while view:  # an unbuffered local file may take part of a write
                    n = out.write(view)
                    view = view[n if n is not None else len(view):]
                size += len(part)
                del part, view  # not kept while the next part is made (a large state's key group)
        self.counts.add(rel, written=size)
        return size

    def open_new(self, rel: str) -> Any:
        """A stream writing the new file ``rel`` (the caller closes it); ``open_files_readable`` tells whether
        what was written is readable before it is closed."""
        full = self.path(rel)
        self.counts.add(rel, created=1)
        return self._open_new(rel, full)

    @abstractmethod
    def _open_new(self, rel: str, full: str) -> Any: ...

    def link_in(self, rel: str, local_path: str) -> int | None:
        """Make the finished local file ``local_path`` the new file ``rel`` without copying it (a hard link; the
        caller never writes ``local_path`` again); returns its size, or None where the storage cannot (an object
        store, another file system): the caller writes it with :meth:`write_parts` then."""
        size = self._link_in(rel, self.path(rel), local_path)
        if size is not None:
            self.counts.add(rel, created=1, written=size)
        return size

    def _link_in(self, rel: str, full: str, local_path: str) -> int | None:
        return None

    def create_exclusive(self, rel: str, data: bytes) -> None:
        """Atomically create ``rel`` with ``data``; raise ``FileExistsError`` if it exists (put-if-absent)."""
        self._create_exclusive(rel, self.path(rel), data)
        self.counts.add(rel, created=1, written=len(data))  # markers are not counted; data files are

    @abstractmethod
    def _create_exclusive(self, rel: str, full: str, data: bytes) -> None: ...

    def replace(self, rel: str, data: bytes) -> None:
        """Atomically write or overwrite ``rel``."""
        self._replace(rel, self.path(rel), data)

    @abstractmethod
    def _replace(self, rel: str, full: str, data: bytes) -> None: ...

    def move(self, rel: str, to: str) -> None:
        """Move file ``rel`` to ``to`` (replacing it): a rename where the file system has one, else a copy
        and a delete (object stores: the file appears at ``to`` in one piece, then leaves ``rel``)."""
        self._refuse_writing_through_links(rel)
        self._refuse_writing_through_links(to)
        self._move(self.path(rel), self.path(to))

    @abstractmethod
    def _move(self, full: str, to_full: str) -> None: ...

    # -- reading ---------------------------------------------------------------------------------------------
    def read(self, rel: str, context: str = "") -> bytes:
        self._refuse_links(rel, context)
        try:
            with self.fs.open_input_stream(self.path(rel)) as f:
                return f.read()
        except FileNotFoundError as e:
            raise self._missing(rel, context) from e

    def read_range(self, rel: str, offset: int, length: int, context: str = "") -> bytes:
        self._refuse_links(rel, context)
        try:
            data = self._read_at(self.path(rel), offset, length)
        except FileNotFoundError as e:
            raise self._missing(rel, context) from e
        return whole_range(self.path(rel), context, offset, length, data)

    def _read_at(self, full: str, offset: int, length: int) -> bytes:
        with self.fs.open_input_file(full) as f:
            return f.read_at(length, offset)

    def exists(self, rel: str) -> bool:
        return self.fs.get_file_info(self.path(rel)).type != pafs.FileType.NotFound

    def size(self, rel: str) -> int:
        return self._info(rel).size

    def mtime_ns(self, rel: str) -> int:
        """Modification time of ``rel`` in nanoseconds (as the storage's clock tells it)."""
        return self._info(rel).mtime_ns or 0

    def _info(self, rel: str) -> pafs.FileInfo:
        info = self.fs.get_file_info(self.path(rel))
        if info.type == pafs.FileType.NotFound:
            raise self._missing(rel, "")
        return info

    # -- symbolic links --------------------------------------------------------------------------------------
    @abstractmethod
    def through_link(self, rel: str) -> bool:
        """Whether the path ``rel`` passes through a symbolic link below the root: spate never reads, writes or
        deletes through one."""

    def _refuse_writing_through_links(self, rel: str) -> None:
        if self.through_link(rel):
            raise CheckpointError(f"{self.path(rel)}: the path passes through a symbolic link inside the "
                                  "checkpoint root; spate never writes through links there. Remove the link")

    def _refuse_links(self, rel: str, context: str) -> None:
        if self.through_link(rel):
            raise CorruptFileError(f"{self.path(rel)}{_ctx(context)}: the path passes through a symbolic link "
                                   "inside the checkpoint root; spate never follows links there (the file may "
                                   "resolve outside the root). Replace the link with the real file")

    def _missing(self, rel: str, context: str) -> MissingFileError:
        return MissingFileError(f"{self.path(rel)}{_ctx(context)}: file is missing; it was deleted outside "
                                f"spate or the storage is incomplete: {RESTORE_ADVICE}")

    # -- deleting --------------------------------------------------------------------------------------------
    def delete(self, rel: str) -> bool:
        """Delete a file; return False if it did not exist. A path through a symbolic link is never deleted
        (logged instead). Callers that take names from listings or metadata check them against spate's
        layout first (:func:`spate.layout.is_spate_file`)."""
        if self.through_link(rel):
            log.warning("not deleting %s: it passes through a symbolic link", self.path(rel))
            return False
        try:
            self.fs.delete_file(self.path(rel))
        except FileNotFoundError:
            return False
        self.counts.add(rel, deleted=1)
        return True

    def delete_dir(self, rel: str) -> None:
        """Delete the files spate wrote below ``rel``, then the directories this leaves empty. Other files, and
        the directories holding them, stay; links are never followed."""
        for path, _size in self.list_files(rel):
            if is_spate_file(path):
                self.delete(path)
        self.remove_empty_dirs(rel)

    @abstractmethod
    def remove_empty_dirs(self, rel: str = "") -> None:
        """Remove the empty directories of spate's layout below ``rel`` (and ``rel``), deepest first."""

    # -- listing ---------------------------------------------------------------------------------------------
    def list_files(self, rel: str = "") -> list[tuple[str, int]]:
        """Every file below ``rel`` (recursive) as (path relative to the root, size). Links are not followed
        and not listed."""
        return [(f.path, f.size) for f in self.stat_files(rel)]

    @abstractmethod
    def stat_files(self, rel: str = "") -> list[FileStat]:
        """Every file below ``rel`` (recursive) with size and modification time; links are not followed."""

    @abstractmethod
    def list_dirs(self, rel: str = "") -> list[str]:
        """Immediate sub-directories of ``rel`` (names only); links to directories are not listed."""

    @abstractmethod
    def list_entries(self) -> list[str]:
        """Names directly under the root (files and directories; links too)."""


class LocalStorage(CheckpointStorage):
    """A checkpoint root on a local disk: files are created exclusively and written unbuffered, markers are
    written to an fsynced temporary file and linked (exclusive) or renamed (replace) into place, and nothing
    passing through a symbolic link below the root is read, written or deleted."""

    has_directories = True
    open_files_readable = True  # unbuffered writes
    opens_with_a_request = False

    @staticmethod
    def written_before(mtime_ns: int, instant_ns: int) -> bool:
        """Whether a file with modification time ``mtime_ns`` was written at or before ``instant_ns``."""
        return mtime_ns <= instant_ns

    def _attach(self, uri: str, fs: pafs.FileSystem, root: str) -> None:
        super()._attach(uri, fs, root)
        self.real_root = os.path.realpath(root)
        self._linkless_dirs: set[str] = set()

    def _open_new(self, rel: str, full: str) -> Any:
        self._refuse_writing_through_links(rel)
        os.makedirs(posixpath.dirname(full), exist_ok=True)
        # read again only by a restore: out of the page cache once on disk, where the table's pages are wanted
        return WriteBehindFile(open(full, "xb", buffering=0), drop_behind=True)  # noqa: SIM115 - the caller closes it

    def _read_at(self, full: str, offset: int, length: int) -> bytes:
        return read_once(full, offset, length)  # its pages out of the page cache after: a checkpoint file is read once

    def _link_in(self, rel: str, full: str, local_path: str) -> int | None:
        self._refuse_writing_through_links(rel)
        os.makedirs(posixpath.dirname(full), exist_ok=True)
        try:
            os.link(local_path, full, follow_symlinks=False)
        except OSError as e:
            if e.errno in _NO_LINK:
                return None
            raise
        return os.stat(full, follow_symlinks=False).st_size

    def _create_exclusive(self, rel: str, full: str, data: bytes) -> None:
        """Write a temporary file and hard-link it into place: atomic, never overwriting."""
        self._refuse_writing_through_links(rel)
        tmp = write_synced_temp(full, data)
        try:
            os.link(tmp, full)
        finally:
            os.unlink(tmp)

    def _replace(self, rel: str, full: str, data: bytes) -> None:
        """An fsynced temporary file renamed into place."""
        self._refuse_writing_through_links(rel)
        os.replace(write_synced_temp(full, data), full)

    def _move(self, full: str, to_full: str) -> None:
        os.makedirs(posixpath.dirname(to_full), exist_ok=True)
        os.replace(full, to_full)

    def through_link(self, rel: str) -> bool:
        """A directory found free of links is remembered, so a hot read costs one ``lstat``."""
        norm = validate_relative_path(rel)
        parent = posixpath.dirname(norm)
        if parent and parent not in self._linkless_dirs:
            if os.path.realpath(f"{self.root}/{parent}") != f"{self.real_root.rstrip('/')}/{parent}":
                return True
            if os.path.isdir(f"{self.root}/{parent}"):
                self._linkless_dirs.add(parent)
        return os.path.islink(f"{self.root}/{norm}")

    def remove_empty_dirs(self, rel: str = "") -> None:
        """Links are not followed; a directory holding anything else stays."""
        if rel and self.through_link(rel):
            return
        prefix = len(self.root.rstrip("/")) + 1
        for directory, _dirs, _files in os.walk(self._base(rel), topdown=False, followlinks=False):
            if is_spate_dir(directory[prefix:]) and not os.path.islink(directory):
                with contextlib.suppress(OSError):  # not empty: it holds files that are not spate's
                    os.rmdir(directory)

    def stat_files(self, rel: str = "") -> list[FileStat]:
        if rel and self.through_link(rel):
            return []
        prefix = len(self.root.rstrip("/")) + 1
        out = []
        for directory, _dirs, files in os.walk(self._base(rel), followlinks=False):
            for name in files:
                full = os.path.join(directory, name)
                try:
                    st = os.lstat(full)
                except FileNotFoundError:  # deleted while listing
                    continue
                if stat.S_ISREG(st.st_mode):  # not a link, not a socket
                    out.append(FileStat(full[prefix:], st.st_size, st.st_mtime_ns))
        return sorted(out)

    def list_dirs(self, rel: str = "") -> list[str]:
        if rel and self.through_link(rel):
            return []
        try:
            with os.scandir(self._base(rel)) as entries:
                return sorted(e.name for e in entries if e.is_dir(follow_symlinks=False))
        except (FileNotFoundError, NotADirectoryError):
            return []

    def list_entries(self) -> list[str]:
        try:
            return sorted(os.listdir(self.root))
        except (FileNotFoundError, NotADirectoryError):
            return []


class ObjectStoreStorage(CheckpointStorage):
    """A checkpoint root on an object store (S3, GCS) or another remote file system: no directories to create
    or remove, no links; an object becomes visible whole when its stream closes. Exclusive create is a
    conditional PUT (``If-None-Match: *``) on S3; other stores have no conditional write that ``pyarrow.fs``
    can send, so there a single PUT is atomic in visibility and the existence check before it best effort."""

    has_directories = False
    open_files_readable = False  # readable once closed
    opens_with_a_request = True

    @staticmethod
    def written_before(mtime_ns: int, instant_ns: int) -> bool:
        """Object stores keep whole seconds: a file of ``instant_ns``'s second may have been written after it."""
        return mtime_ns < instant_ns

    def _open_new(self, rel: str, full: str) -> Any:
        return self.fs.open_output_stream(full)  # no directories: creating markers costs requests

    def _create_exclusive(self, rel: str, full: str, data: bytes) -> None:
        if put_if_absent(self.uri, full, data):
            return
        _warn_no_conditional_write(self.uri)
        if self.exists(rel):
            raise FileExistsError(full)
        self.write(rel, data)

    def _replace(self, rel: str, full: str, data: bytes) -> None:
        """One PUT: atomic in visibility."""
        self.write(rel, data)

    def _move(self, full: str, to_full: str) -> None:
        self.fs.copy_file(full, to_full)
        self.fs.delete_file(full)

    def through_link(self, rel: str) -> bool:
        return False

    def remove_empty_dirs(self, rel: str = "") -> None:
        """Object stores have no directories."""

    def stat_files(self, rel: str = "") -> list[FileStat]:
        prefix = self.root.rstrip("/") + "/"
        return sorted(FileStat(i.path[len(prefix):], i.size, i.mtime_ns or 0)
                      for i in self._infos(self._base(rel), recursive=True) if i.type == pafs.FileType.File)

    def list_dirs(self, rel: str = "") -> list[str]:
        return sorted(i.base_name for i in self._infos(self._base(rel)) if i.type == pafs.FileType.Directory)

    def list_entries(self) -> list[str]:
        return sorted(i.base_name for i in self._infos(self.root))

    def _infos(self, base: str, recursive: bool = False) -> list[pafs.FileInfo]:
        return self.fs.get_file_info(pafs.FileSelector(base, recursive=recursive, allow_not_found=True))


def _resolve_filesystem(uri: str, filesystem: pafs.FileSystem | None) -> tuple[pafs.FileSystem, str]:
    """The file system ``uri`` names (or ``filesystem``, with ``uri`` its root path) and the root on it."""
    if filesystem is not None:
        fs, root = filesystem, uri.rstrip("/")
    elif "://" in uri:
        try:
            fs, root = pafs.FileSystem.from_uri(uri)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
            raise SettingError(f"checkpoint root {uri}: pyarrow opens no file system for it ({e}); use a local path, "
                               "file://, s3:// (not s3a://: that is Hadoop's name for S3), gs:// or hdfs://") from e
    else:
        fs, root = pafs.LocalFileSystem(), os.path.abspath(uri)
    return fs, root.rstrip("/") or "/"


@dataclass(frozen=True, order=True)
class FileStat:
    """A file under a checkpoint root: path relative to the root, size, modification time (ns)."""

    path: str
    size: int
    mtime_ns: int


@functools.lru_cache(maxsize=32)
def storage_for(uri: str) -> CheckpointStorage:
    """One storage object per URI and process: file-system clients (S3, GCS) are costly to create, and a
    subtask needs its checkpoint storage every batch."""
    return CheckpointStorage(uri)


@functools.lru_cache(maxsize=32)
def _warn_no_conditional_write(uri: str) -> None:
    log.warning("%s: this store has no conditional write that spate can send, so creating a file only if it "
                "does not exist is best effort there; two drivers started at the same moment on this root may "
                "not be told apart. Use a local file system or S3 for exclusive take-over", uri)


def whole_range(path: str, context: str, offset: int, length: int, data: bytes) -> bytes:
    """``data``, read as ``length`` bytes at ``offset`` of ``path``, if all of them came.

    Raises:
        CorruptFileError: fewer came: the file is truncated.
    """
    if len(data) != length:
        raise CorruptFileError(f"{path}{_ctx(context)}: truncated, wanted {length} bytes at offset {offset}, "
                               f"got {len(data)}")
    return data


def _ctx(context: str) -> str:
    return f" ({context})" if context else ""
