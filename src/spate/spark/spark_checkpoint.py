"""Where Spark's own streaming checkpoint goes, and the mirror that keeps it in spate's checkpoint root.

Spark's checkpoint (``metadata``, ``offsets/<n>``, ``commits/<n>``, ``sources/<i>/<n>``) is written by the driver
only, through Hadoop. Hadoop opens a local path, ``file://`` and ``hdfs://``/``viewfs://`` URIs without options,
so for those roots it is ``<root>/_spark``, as always. Every other root — ``s3://``, ``gs://``, ``abfs://``, any
URI with ``?options`` — is a ``pyarrow.fs`` URI that Hadoop cannot open as written (there is no ``s3`` scheme,
and ``?endpoint_override=`` is not a Hadoop path). For those, Spark writes its checkpoint to a driver-local
directory, ``~/.spate/spark-checkpoints/<query id>/checkpoint`` (``start(spark_checkpoint_cache=DIR)`` changes
the base), and :class:`SparkCheckpointMirror` keeps a copy of it at ``<root>/_spark/``, with the root's own
credentials and options, in the same layout Spark writes (so a later run may also point Spark's S3A file system
at it directly). ``_spark`` is an engine directory of spate's layout: spate's cleanup never deletes it and the
mirror deletes a file there only when Spark removed it from the local copy (:meth:`SparkCheckpointMirror.sync`).

Why not S3A when hadoop-aws happens to be on the classpath: one tested path whatever the classpath (the
behaviour of a query does not change when a jar is added), one place for endpoint and credentials (the root's
URI; S3A has no equivalent for some of pyarrow's options), and fewer requests per batch (three small
conditional PUTs instead of S3A's write-rename-check sequence per log entry). A Hadoop location can still be
given explicitly: ``start(spark_checkpoint="s3a://...")``; a location Hadoop cannot open is refused before
anything is written.

**Ordering: why a driver restarted anywhere neither loses nor duplicates a batch.** For micro-batch *n* Spark
writes ``sources/<i>/<n>`` and ``offsets/<n>`` (its write-ahead log: what batch *n* reads) locally, then calls
``foreachBatch(df, n)``, and writes ``commits/<n>`` after it returned. spate's checkpoint *n* completes inside
``foreachBatch``, and a batch Spark runs again after spate's checkpoint *n* completed is skipped (its outputs are
re-delivered from the checkpoint if the sink had not confirmed them). The mirror runs first thing in
``foreachBatch(n)`` — before spate plans, let alone completes, checkpoint *n* — and uploads what is new:
``commits/<n-1>``, ``sources/<i>/<n>`` and then ``offsets/<n>``. So:

1. *spate's checkpoint n complete ⇒ ``<root>/_spark/offsets/<n>`` exists* (the upload precedes the completion,
   and a failed upload fails the batch before it is planned). A driver restarted on a fresh machine restores
   Spark's checkpoint from the root: the newest offsets it finds are *m ≥ n*, so Spark either re-runs a batch
   ≤ n with exactly the offsets it had logged (spate skips it: no duplicate) or re-runs or constructs a batch
   > n, which spate has not checkpointed and processes (no loss). Spark never constructs a new, different
   batch under an id spate already completed — which is what would lose rows if the offsets were uploaded
   after the checkpoint (a crash in between makes a restarted Spark compute batch n again from the source's
   newest position, and spate skip it as done).
2. *``offsets/<n>`` present but spate's checkpoint n not complete* (the driver died in between): Spark re-runs
   batch n from the logged offsets, spate processes it once. The source log entries are uploaded before the
   offsets that refer to them.
3. ``commits/<n>`` of the last batch before a stop reaches the root at the next start (same machine) or never
   (the machine is gone): Spark then re-runs batch n, which spate skips. Harmless either way.

**No stale or foreign copy is ever resumed from.** Spark never rewrites a log entry, so the mirror creates every
file with put-if-absent (a conditional PUT on S3); finding a different file already there means another driver
wrote this query's log since this one started, and the batch fails with an error instead of mixing the two.
The local directory records (``mirror.json``) what the root held after this machine's last upload. On start the
local copy is used only when the root still holds exactly that (names and sizes: nobody else ran the query
since) and every recorded file is still there locally, unchanged; otherwise it is replaced by the root's copy
(downloaded into a new directory, swapped in). Files Spark wrote after the last upload are then uploaded. A
root whose latest complete checkpoint is newer than the offsets in its Spark checkpoint (its Spark checkpoint
was lost, or the query ran with another ``spark_checkpoint``) is refused, mirrored or written by Spark under the
root alike (:func:`check_not_behind`): Spark would re-read its sources from an older position and spate would
skip those batches as done.

Links are never followed (the local copy is read with ``O_NOFOLLOW``; links and dot-files, such as Hadoop's
``.crc`` checksums, are not mirrored).

Not covered: Spark's own stateful operators upstream of spate (a streaming aggregation or deduplication in the
DataFrame given to the stream) keep their state in Spark's checkpoint, written by the executors; on a cluster
that needs a location every executor can reach, so such a query passes ``spark_checkpoint`` (e.g. ``s3a://``).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import stat
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from spate.checkpoint.coordinator import Coordinator
from spate.errors import CheckpointError, SettingError
from spate.fs import CheckpointStorage, join_uri, validate_relative_path
from spate.spark.jvm_class import jvm_class
from spate.spark.sessions import is_connect

log = logging.getLogger(__name__)

SPARK_CHECKPOINT_DIR = "_spark"  # Spark's own checkpoint (offsets, commits) under spate's root
HADOOP_SCHEMES = ("file", "hdfs", "viewfs")  # roots Spark opens as written (when they carry no ?options)
MANIFEST = "mirror.json"
LOCAL_CHECKPOINT = "checkpoint"
_MANIFEST_VERSION = 1
_ENTRY = re.compile(r"(\d+)(?:\.[A-Za-z0-9]+)?")  # a numbered log entry: offsets/7, sources/0/19.compact
_DOWNLOAD_THREADS = 8


def default_cache_dir() -> str:
    """Base of the driver-local copies of Spark's checkpoint: ``~/.spate/spark-checkpoints``."""
    return os.path.join(os.path.expanduser("~"), ".spate", "spark-checkpoints")


class QueryFolder:
    """This query's driver-local folder, ``<cache>/<query id>`` (Spark's checkpoint copy for an object-store root,
    the wake file of batches without input), and which of it and its parents this run creates. A run that fails
    before any batch completed removes what it created (:meth:`remove_created`), so a failed first batch leaves
    nothing in the user's home directory; a folder that existed before is never removed."""

    def __init__(self, cache_dir: str | None, query_id: str) -> None:
        self.path = os.path.abspath(os.path.join(cache_dir or default_cache_dir(), query_id))
        self.created: list[str] = []  # the folder and its parents that do not exist yet, innermost first
        folder = self.path
        while not os.path.lexists(folder) and os.path.dirname(folder) != folder:
            self.created.append(folder)
            folder = os.path.dirname(folder)

    def remove_created(self) -> None:
        """Remove the folder if this run created it (only spate's files are in it), then each parent this run
        created that is empty now."""
        if not self.created:
            return
        _remove_tree(self.path)
        for folder in self.created[1:]:
            try:
                os.rmdir(folder)
            except OSError:  # not empty (someone else's files), or gone
                break
        log.info("removed %s: the query failed before any batch completed", self.path)


def hadoop_opens(root: str) -> bool:
    """Whether Spark (Hadoop) opens the checkpoint root as written: a local path, or a ``file``, ``hdfs`` or
    ``viewfs`` URI without ``?options``."""
    if "://" not in root:
        return True
    parts = urlsplit(root)
    return parts.scheme in HADOOP_SCHEMES and not parts.query


def check_locations(spark: Any, root: str, spark_checkpoint: str | None, cache_dir: str | None) -> None:
    """Refuse, with the fix, a root or Spark checkpoint location that cannot work; nothing is written yet."""
    scheme = urlsplit(root).scheme if "://" in root else ""
    if scheme in ("s3a", "s3n"):
        raise SettingError(f"checkpoint_root {_redact(root)!r} is a Hadoop URI; spate's root is a pyarrow.fs URI: "
                           f"use {_redact('s3://' + root.split('://', 1)[1])} (add "
                           "?endpoint_override=HOST:PORT&scheme=http for an S3-compatible server)")
    if spark_checkpoint is None:
        return
    if cache_dir is not None:
        raise SettingError("give spark_checkpoint (a location Spark writes itself) or spark_checkpoint_cache (a "
                           "driver-local directory spate mirrors into the root), not both")
    if "://" in spark_checkpoint and urlsplit(spark_checkpoint).query:
        raise SettingError(f"spark_checkpoint {_redact(spark_checkpoint)!r} carries ?options, which Spark (Hadoop) "
                           "does not read: set the endpoint and credentials in the Hadoop conf "
                           "(spark.hadoop.fs.s3a.endpoint, ...) and pass a plain s3a:// path, or omit "
                           "spark_checkpoint: spate then keeps Spark's checkpoint in a driver-local directory and "
                           "copies it to <checkpoint_root>/_spark with the root's own options")
    ckpt_scheme = urlsplit(spark_checkpoint).scheme if "://" in spark_checkpoint else ""
    if ckpt_scheme and not _hadoop_has_scheme(spark, ckpt_scheme):
        hint = (' (for S3 Hadoop\'s scheme is "s3a://", which needs the hadoop-aws jar and its fs.s3a.* settings)'
                if ckpt_scheme in ("s3", "s3a", "s3n") else "")
        raise SettingError(f"Spark cannot open spark_checkpoint {_redact(spark_checkpoint)!r}: Hadoop has no file "
                           f"system for the scheme {ckpt_scheme!r} in this Spark{hint}. Omit spark_checkpoint: spate "
                           "then keeps Spark's checkpoint in a driver-local directory and copies it to "
                           "<checkpoint_root>/_spark")


def _hadoop_has_scheme(spark: Any, scheme: str) -> bool:
    if is_connect(spark):  # no py4j gateway: Spark itself will tell
        return True
    sc = spark.sparkContext
    jvm = getattr(sc, "_jvm", None)
    if jvm is None:
        return True
    try:
        jvm_class(jvm, "org.apache.hadoop.fs.FileSystem").getFileSystemClass(scheme, sc._jsc.hadoopConfiguration())
    except Exception:  # py4j's Py4JJavaError: UnsupportedFileSystemException
        return False
    return True


@dataclass
class SparkCheckpoint:
    """Spark's checkpoint location for one run of a stream, the mirror that copies it into the root (None
    when Spark writes it under the root itself), and the same directory as spate reads it (None: a location
    given to ``start(spark_checkpoint=...)``, which only Hadoop may open)."""

    location: str
    mirror: SparkCheckpointMirror | None = None
    readable: CheckpointStorage | None = None

    def sync(self) -> None:
        """Call first thing in every ``foreachBatch``: copies what Spark wrote since into the root."""
        if self.mirror is not None:
            self.mirror.sync()

    def newest_offsets(self) -> list[str] | None:
        """The source offsets Spark logged for its newest batch (one JSON line per source, in the query's
        order), or None if it logged none or spate cannot read the location."""
        if self.readable is None or (newest := max(_offsets_in(self.readable), default=None)) is None:
            return None
        return self.readable.read(f"offsets/{newest}").decode().splitlines()[2:]  # after the version, metadata


def check_not_behind(latest_checkpoint_id: int | None, offsets: list[int], where: str, note: str = "") -> None:
    """Refuse a root whose Spark checkpoint (at ``where``, holding the batches ``offsets``) is older than spate's
    latest complete checkpoint: Spark would re-read its sources from an older position and spate would skip
    those batches as done."""
    newest = max(offsets, default=None)
    if latest_checkpoint_id is None or (newest is not None and newest >= latest_checkpoint_id):
        return
    found = "holds no offsets" if newest is None else f"ends at batch {newest}"
    raise CheckpointError(
        f"the checkpoint root has complete checkpoint {latest_checkpoint_id}, but Spark's own checkpoint in it "
        f"({_redact(where)}) {found}{note}: Spark would read its sources again "
        "from an older position and spate would skip those batches as done, losing their rows. If this query "
        "ran with start(spark_checkpoint=...), pass that location again; otherwise put Spark's checkpoint back "
        "into <checkpoint_root>/_spark (from a backup), or start the query on a new checkpoint root")


def _offsets(files: Iterable[str]) -> list[int]:
    """The batch numbers of the ``offsets/<n>`` entries among ``files`` (paths relative to Spark's checkpoint)."""
    return [int(m.group(1)) for rel in files
            if rel.startswith("offsets/") and (m := _ENTRY.fullmatch(rel[len("offsets/"):]))]


def _offsets_in(spark_dir: CheckpointStorage) -> list[int]:
    """The offsets entries Spark wrote in its checkpoint directory ``spark_dir`` (none if it does not exist)."""
    try:
        return _offsets(f.path for f in spark_dir.stat_files())
    except FileNotFoundError:
        return []


def open_spark_checkpoint(spark: Any, coordinator: Coordinator, spark_checkpoint: str | None = None,
                          cache_dir: str | None = None) -> SparkCheckpoint:
    """Spark's checkpoint for a stream whose coordinator has started (it knows the query id, the fencing epoch
    and the latest complete checkpoint): ``spark_checkpoint`` if given, ``<root>/_spark`` if Hadoop opens the
    root, else a driver-local directory mirrored into the root, restored from it first when needed."""
    storage: CheckpointStorage = coordinator.storage
    if spark_checkpoint is not None:
        return SparkCheckpoint(spark_checkpoint)
    latest = coordinator.latest
    if hadoop_opens(storage.uri):  # Spark writes it under the root: refused as the mirror's if it is behind
        spark_dir = storage.sub(SPARK_CHECKPOINT_DIR)
        check_not_behind(latest.checkpoint_id if latest is not None else None, _offsets_in(spark_dir), spark_dir.uri)
        return SparkCheckpoint(join_uri(storage.uri, SPARK_CHECKPOINT_DIR), readable=spark_dir)
    query = coordinator.query
    assert query is not None, "the coordinator has started"
    mirror = SparkCheckpointMirror(storage.sub(SPARK_CHECKPOINT_DIR),
                                   os.path.join(cache_dir or default_cache_dir(), query.query_id),
                                   fence=lambda: coordinator.epochs.check(query.epoch))
    mirror.open(latest.checkpoint_id if latest is not None else None)
    return SparkCheckpoint(Path(mirror.local_checkpoint).resolve().as_uri(), mirror,
                           CheckpointStorage(mirror.local_checkpoint))


class SparkCheckpointMirror:
    """Keeps ``remote`` (``<root>/_spark``) equal to Spark's checkpoint in ``<local_dir>/checkpoint``.

    Args:
        remote: storage rooted at ``<root>/_spark``.
        local_dir: this query's driver-local directory (holds ``checkpoint/`` and ``mirror.json``).
        fence: raises if this driver was fenced; called before anything is written to the root.
    """

    def __init__(self, remote: CheckpointStorage, local_dir: str, fence: Callable[[], None] | None = None) -> None:
        self.remote = remote
        self.local_dir = os.path.abspath(local_dir)
        self.local_checkpoint = os.path.join(self.local_dir, LOCAL_CHECKPOINT)
        self.fence = fence or (lambda: None)
        self.files: dict[str, tuple[int, int]] = {}  # in the root as in the local copy: rel -> (size, local mtime)
        self.uploaded = 0
        self.deleted = 0
        self.downloaded = 0
        self.reused_local = False

    # -- start --------------------------------------------------------------------------------------------
    def open(self, latest_checkpoint_id: int | None) -> None:
        """Make the local copy the root's (restore it when missing, stale or foreign), refuse a Spark
        checkpoint that is behind spate's, then upload what Spark wrote locally since the last upload."""
        self._prepare_local_dir()
        remote = self._remote_files()
        self._check_not_behind(latest_checkpoint_id, remote)  # before the local copy is touched
        manifest = self._read_manifest()
        self.reused_local = manifest is not None and self._local_is_current(manifest, remote)
        if self.reused_local:
            assert manifest is not None
            self.files = manifest
        else:
            self._restore(remote)
        self.sync()

    def _prepare_local_dir(self) -> None:
        try:
            os.makedirs(self.local_dir, exist_ok=True)
        except OSError as e:
            raise CheckpointError(f"cannot create {self.local_dir} for Spark's own checkpoint ({e}): pass "
                                  "start(spark_checkpoint_cache=DIR) with a writable driver-local directory") from e
        for name in os.listdir(self.local_dir):  # leftovers of an interrupted restore: our own names only
            if re.fullmatch(rf"{LOCAL_CHECKPOINT}\.[0-9a-f]{{32}}\.(?:tmp|old)|{MANIFEST}\.[0-9a-f]{{32}}\.tmp", name):
                _remove_tree(os.path.join(self.local_dir, name))
        if os.path.islink(self.local_checkpoint):
            raise CheckpointError(f"{self.local_checkpoint} is a symbolic link; spate never follows links there. "
                                  "Remove it (it is a cache of <checkpoint_root>/_spark)")

    def _remote_files(self) -> dict[str, int]:
        files = {}
        for f in self.remote.stat_files():
            if _mirrored_name(f.path):
                files[validate_relative_path(f.path)] = f.size
        return files

    def _local_is_current(self, manifest: dict[str, tuple[int, int]], remote: dict[str, int]) -> bool:
        if {rel: size for rel, (size, _mtime) in manifest.items()} != remote:
            log.info("Spark's checkpoint in %s changed since this machine last wrote it: restoring it", self.remote)
            return False
        local = self._local_files()
        return all(local.get(rel) == stamp for rel, stamp in manifest.items())

    def _restore(self, remote: dict[str, int]) -> None:
        """Replace the local copy by the root's: download into a new directory, then swap it in."""
        fresh = os.path.join(self.local_dir, f"{LOCAL_CHECKPOINT}.{uuid.uuid4().hex}.tmp")
        os.makedirs(fresh)

        def download(rel: str) -> None:
            data = self.remote.read(rel, "Spark's checkpoint")
            path = os.path.join(fresh, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "xb") as out:
                out.write(data)

        with ThreadPoolExecutor(_DOWNLOAD_THREADS) as pool:
            list(pool.map(download, sorted(remote)))
        if os.path.lexists(self.local_checkpoint):
            old = os.path.join(self.local_dir, f"{LOCAL_CHECKPOINT}.{uuid.uuid4().hex}.old")
            os.rename(self.local_checkpoint, old)
            os.rename(fresh, self.local_checkpoint)
            _remove_tree(old)
        else:
            os.rename(fresh, self.local_checkpoint)
        self.files = self._local_files()
        self.downloaded += len(remote)
        self._write_manifest()
        if remote:
            log.info("restored Spark's checkpoint (%d files) from %s into %s", len(remote), self.remote,
                     self.local_checkpoint)

    def _check_not_behind(self, latest_checkpoint_id: int | None, remote: dict[str, int]) -> None:
        """Refuse a root whose Spark checkpoint is older than spate's latest complete checkpoint."""
        local = (f"; this machine's copy of it, {self.local_checkpoint}, was left as it was (copy it there if it "
                 "is the newest)" if os.path.isdir(self.local_checkpoint) else "")
        check_not_behind(latest_checkpoint_id, _offsets(remote), self.remote.uri, local)

    # -- every batch --------------------------------------------------------------------------------------
    def sync(self) -> None:
        """Upload the files Spark wrote locally since the last call (source logs before the offsets that refer
        to them), then delete from the root the log entries Spark purged locally; write the manifest."""
        local = self._local_files()
        new = sorted((rel for rel in local if rel not in self.files), key=_upload_order)
        changed = sorted((rel for rel in local if rel in self.files and local[rel] != self.files[rel]),
                         key=_upload_order)
        gone = sorted(rel for rel in self.files if rel not in local and _purged_by_spark(rel, local))
        if not (new or changed or gone):
            return
        self.fence()
        for rel in new:
            self._upload(rel, local[rel], exclusive=True)
        for rel in changed:
            self._upload(rel, local[rel], exclusive=False)
        for rel in gone:
            self.remote.delete(rel)
            del self.files[rel]
            self.deleted += 1
        self._write_manifest()

    def _upload(self, rel: str, stamp: tuple[int, int], exclusive: bool) -> None:
        data = _read_no_follow(os.path.join(self.local_checkpoint, rel))
        if exclusive:
            try:
                self.remote.create_exclusive(rel, data)
            except FileExistsError:
                if self.remote.read(rel, "Spark's checkpoint") != data:
                    raise CheckpointError(
                        f"{_redact(self.remote.uri)}/{rel}: Spark's checkpoint in the checkpoint root differs from "
                        f"this driver's copy ({os.path.join(self.local_checkpoint, rel)}): another driver ran this "
                        "query since this one started. Stop this driver; a restart resumes from the root") from None
        else:
            self.remote.replace(rel, data)
        self.files[rel] = (len(data), stamp[1])
        self.uploaded += 1

    # -- local files and the manifest -------------------------------------------------------------------------
    def _local_files(self) -> dict[str, tuple[int, int]]:
        """Regular files of the local copy (no links, no dot-files) → (size, mtime_ns)."""
        out: dict[str, tuple[int, int]] = {}
        base = self.local_checkpoint
        if not os.path.isdir(base) or os.path.islink(base):
            return out
        for directory, dirs, files in os.walk(base, followlinks=False):
            dirs[:] = [d for d in dirs if not d.startswith(".")]
            for name in files:
                full = os.path.join(directory, name)
                rel = os.path.relpath(full, base).replace(os.sep, "/")
                if not _mirrored_name(rel):
                    continue
                try:
                    st = os.lstat(full)
                except FileNotFoundError:
                    continue
                if stat.S_ISREG(st.st_mode):
                    out[rel] = (st.st_size, st.st_mtime_ns)
        return out

    def _identity(self) -> str:
        return f"{self.remote.fs.type_name}:{self.remote.root}"

    def _read_manifest(self) -> dict[str, tuple[int, int]] | None:
        path = os.path.join(self.local_dir, MANIFEST)
        try:
            with open(path) as f:
                doc = json.load(f)
            if doc.get("version") != _MANIFEST_VERSION or doc.get("root") != self._identity():
                return None
            return {validate_relative_path(rel): (int(size), int(mtime)) for rel, (size, mtime) in
                    doc["files"].items()}
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as e:
            log.warning("ignoring %s (%s): restoring Spark's checkpoint from the root", path, e)
            return None

    def _write_manifest(self) -> None:
        path = os.path.join(self.local_dir, MANIFEST)
        tmp = f"{path}.{uuid.uuid4().hex}.tmp"
        with open(tmp, "w") as f:
            json.dump({"version": _MANIFEST_VERSION, "root": self._identity(),
                       "files": {rel: list(stamp) for rel, stamp in sorted(self.files.items())}}, f)
        os.replace(tmp, path)


def _mirrored_name(rel: str) -> bool:
    """Spark's files, not Hadoop's ``.crc`` checksums or temporary files (dot-files)."""
    return bool(rel) and not any(part.startswith(".") for part in rel.split("/"))


def _upload_order(rel: str) -> tuple[int, int, str]:
    """``metadata`` first, then source logs and everything else, then offsets, then commits; by batch id."""
    top = rel.partition("/")[0]
    rank = {"metadata": 0, "offsets": 2, "commits": 3}.get(top, 1)
    m = _ENTRY.fullmatch(rel.rpartition("/")[2])
    return rank, int(m.group(1)) if m else -1, rel


def _purged_by_spark(rel: str, local: dict[str, tuple[int, int]]) -> bool:
    """Whether the local copy lost ``rel`` the way Spark purges its logs: a numbered entry of a directory that
    still holds a newer numbered entry (``metadata`` and newest entries are never deleted from the root, so a
    local copy damaged by hand or by a temp-file cleaner cannot empty the root's)."""
    directory, _, name = rel.rpartition("/")
    m = _ENTRY.fullmatch(name)
    if not directory or m is None:
        return False
    number = int(m.group(1))
    for other in local:
        d, _, n = other.rpartition("/")
        if d == directory and (o := _ENTRY.fullmatch(n)) is not None and int(o.group(1)) > number:
            return True
    return False


def _read_no_follow(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    with os.fdopen(fd, "rb") as f:
        return f.read()


def _remove_tree(path: str) -> None:
    """Remove a directory of spate's own making (links inside are removed, never followed)."""
    if os.path.islink(path):
        os.unlink(path)
    else:
        shutil.rmtree(path, ignore_errors=True)


def _redact(uri: str) -> str:
    """``uri`` without credentials (``s3://KEY:SECRET@bucket`` → ``s3://***@bucket``), for messages."""
    if "://" not in uri:
        return uri
    scheme, rest = uri.split("://", 1)
    netloc, sep, tail = rest.partition("/")
    if "@" in netloc:
        netloc = "***@" + netloc.rpartition("@")[2]
    query_free, qsep, query = tail.partition("?")
    if query:
        secret = ("access_key", "secret_key", "session_token")
        query = "&".join(f"{p.split('=', 1)[0]}=***" if p.split("=", 1)[0] in secret else p
                         for p in query.split("&"))
    return f"{scheme}://{netloc}{sep}{query_free}{qsep}{query}"
