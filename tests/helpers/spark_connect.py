"""A real Spark Connect server for the Connect tests (tests/connect/, and Spark's own ported tests with
``--connect``): :class:`spate_tools.connect_server.ConnectServer` (the pip pyspark's ``SparkConnectServer`` on
127.0.0.1, local[2], stopped by PID at the end of the test session), and ``connect``, a client session of it.
The server's JVM runs the quick JIT options, as the other test JVMs (:data:`~spate_tools.standalone.QUICK_JVM_OPTIONS`:
the 13 Connect tests of the smoke took 153 CPU-s with them against 214 and 223 without, 2026-11-29), and writes
Spark's checkpoints through the file-system API (:func:`~spate_tools.standalone.quick_checkpoint_conf`).

A Connect client session switches pyspark into Connect mode for the whole process (``is_remote()`` reads an
environment variable), so these tests run in pytest processes of their own (``make connect``), never beside the
classic ``spark`` fixture's tests.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from spate_tools.connect_server import ConnectServer, ConnectServerError
from spate_tools.standalone import QUICK_JVM_OPTIONS, quick_checkpoint_conf


@pytest.fixture(scope="session")
def connect_server(tmp_path_factory) -> Iterator[ConnectServer]:
    try:
        server = ConnectServer(str(tmp_path_factory.mktemp("connect") / "server.log"), conf=quick_checkpoint_conf(),
                               jvm_options=QUICK_JVM_OPTIONS)
    except ConnectServerError as e:
        pytest.fail(str(e))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def connect(connect_server) -> Iterator[Any]:
    """A Spark Connect client session of the test session's server."""
    from pyspark.sql import SparkSession

    session = SparkSession.builder.remote(connect_server.url).getOrCreate()
    try:
        yield session
    finally:
        session.stop()


def connect_form(code: str, url: str) -> str:
    """A documented example in the form it takes on Connect: its session from the server's URL instead of a local
    master (Connect refuses both), and without calls to ``spark.sparkContext``, which a Connect session lacks."""
    local = 'SparkSession.builder.master("local[2]")'
    assert local in code, "the example makes no local session to turn into a Connect one"
    code = code.replace(local, f"SparkSession.builder.remote({url!r})")
    return "".join(line for line in code.splitlines(keepends=True) if "spark.sparkContext." not in line)


@pytest.fixture
def example_form(request) -> Callable[[str], str]:
    """A documented example's code as this test session runs it: as written, or with ``--connect`` in its
    :func:`connect_form` for the test session's server."""
    if not request.config.getoption("connect"):
        return lambda code: code
    url = request.getfixturevalue("connect_server").url
    return lambda code: connect_form(code, url)
