"""The ``s3_uri`` fixture: a real S3-compatible server on loopback (moto_server), one per test module; a plugin
that tests/conftest.py names in ``pytest_plugins``, so every test gets it by argument."""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import re
import socket
from collections.abc import Iterator

import pyarrow.fs as pafs
import pytest


@pytest.fixture(scope="module")
def s3_uri():
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")}
    os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1")
    query = f"endpoint_override=127.0.0.1:{port}&scheme=http&region=us-east-1"
    fs, _ = pafs.FileSystem.from_uri(f"s3://spate-test?{query}&allow_bucket_creation=true")
    fs.create_dir("spate-test")
    yield lambda path: f"s3://spate-test/{path}?{query}"
    server.stop()
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@contextlib.contextmanager
def s3_requests() -> Iterator[collections.Counter]:
    """The requests the s3_uri server answers inside the block, by HTTP method (moto_server logs each one)."""
    counted: collections.Counter = collections.Counter()

    class Counter(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            found = re.search(r'"(?:\x1b\[[0-9;]*m)*([A-Z]+) ', record.getMessage())
            if found:
                counted[found.group(1)] += 1

    server_log = logging.getLogger("werkzeug")
    level, handler = server_log.level, Counter()
    server_log.setLevel(logging.INFO)
    server_log.addHandler(handler)
    try:
        yield counted
    finally:
        server_log.removeHandler(handler)
        server_log.setLevel(level)
