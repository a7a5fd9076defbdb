"""Rescale requests through the checkpoint root, for a driver the client cannot call: on Spark Connect the query
driver lives in the server's ``foreachBatch`` process, so :meth:`StatefulStream.rescale` on the client writes a
request file and the driver takes it before its next batch.

A request is ``_requests/rescale-<ns>-<id>.json`` (``<ns>``: the client's clock, zero-padded, so names sort in
the order they were sent), holding ``{"format_version": 1, "parallelism": P, "reason": "..."}``; it is created
put-if-absent and never rewritten. The driver reads the requests there before each batch, applies the newest
and deletes those it read. ``_requests`` is a top-level ``_`` directory of the Spark transport's, beside Spark's
own ``_spark``: spate's checkpoint cleanup never deletes it (:func:`spate.layout.is_engine_owned`).
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from dataclasses import dataclass

from spate.fs import CheckpointStorage

log = logging.getLogger(__name__)
REQUESTS_DIR = "_requests"
FORMAT_VERSION = 1
_PREFIX = "rescale-"


@dataclass(frozen=True)
class RescaleRequest:
    """Run at ``parallelism`` subtasks from the next batch on, for ``reason``."""

    parallelism: int
    reason: str


class RescaleRequests:
    """The rescale requests of the query whose checkpoint root is ``storage``."""

    def __init__(self, storage: CheckpointStorage) -> None:
        self.storage = storage

    def send(self, request: RescaleRequest) -> str:
        """Write ``request``; returns its path in the root."""
        name = f"{REQUESTS_DIR}/{_PREFIX}{time.time_ns():020d}-{uuid.uuid4().hex[:8]}.json"
        body = {"format_version": FORMAT_VERSION, "parallelism": request.parallelism, "reason": request.reason}
        self.storage.create_exclusive(name, json.dumps(body).encode())
        return name

    def take(self) -> RescaleRequest | None:
        """The newest request sent since the last take (None if none); every request read is deleted. A file
        that is not a request of a version this reads is left alone."""
        try:
            names = sorted(rel for rel, _ in self.storage.list_files(REQUESTS_DIR)
                           if rel.rpartition("/")[2].startswith(_PREFIX) and rel.endswith(".json"))
        except FileNotFoundError:
            return None
        newest: RescaleRequest | None = None
        for path in names:  # paths in the root
            try:
                body = json.loads(self.storage.read(path))
            except (FileNotFoundError, ValueError) as e:
                log.warning("rescale request %s not read: %s", path, e)
                continue
            if body.get("format_version") != FORMAT_VERSION:
                log.warning("rescale request %s has format version %r, which this spate does not read", path,
                            body.get("format_version"))
                continue
            newest = RescaleRequest(int(body["parallelism"]), str(body.get("reason", "requested")))
            self.storage.delete(path)
        return newest
