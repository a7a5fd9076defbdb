"""The physical floor the large-state benchmarks (``bench scale``, ``bench cluster --large``) hold recovery
against: the bytes a directory takes on disk (:func:`dir_bytes`) and the seconds the operating system takes to
copy given segments of files on the same disk (:func:`copy_floor`)."""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Callable, Sequence

from spate.errors import SpateError

COPY_BUFFER = 8 * 1024 * 1024


def dir_bytes(path: str) -> int:
    """Bytes the files under ``path`` take on disk (allocated blocks: lmdb's file may be sparse)."""
    total = 0
    for d, _, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(d, f)).st_blocks * 512
    return total


def copy_floor(segments: Sequence[tuple[str, int, int]], target: str,
               before_delete: Callable[[], None] | None = None) -> float:
    """Seconds for the operating system to copy ``segments`` (path, offset, length) into files under ``target``
    (the same disk), each file fsynced; the copy is deleted after (``before_delete`` is called first)."""
    os.makedirs(target)
    by_file: dict[str, list[tuple[int, int]]] = {}
    for path, offset, length in segments:
        by_file.setdefault(path, []).append((offset, length))
    buf = memoryview(bytearray(COPY_BUFFER))
    started = time.perf_counter()
    try:
        for n, (path, ranges) in enumerate(sorted(by_file.items())):
            with open(path, "rb", buffering=0) as src, open(f"{target}/{n}", "wb", buffering=0) as dst:
                for offset, length in sorted(ranges):
                    src.seek(offset)
                    while length > 0:
                        got = src.readinto(buf[:min(length, COPY_BUFFER)])
                        if not got:
                            raise SpateError(f"{path} ends before offset {offset} + {length}")
                        dst.write(buf[:got])
                        length -= got
                os.fsync(dst.fileno())
        elapsed = time.perf_counter() - started
        if before_delete is not None:
            before_delete()
        return elapsed
    finally:
        shutil.rmtree(target, ignore_errors=True)
