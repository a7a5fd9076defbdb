"""A real Spark Connect server for the Connect tests (tests/connect/): the pip pyspark's own
``SparkConnectServer`` started with ``spark-submit`` on 127.0.0.1 and a free port, in a process group of its own
(local[2], its Python workers and ``foreachBatch`` process running this interpreter), stopped by PID at the end
of the test session; ``connect`` is a client session of it (``SparkSession.builder.remote``).

A Connect client session switches pyspark into Connect mode for the whole process (``is_remote()`` reads an
environment variable), so these tests run in a pytest process of their own (``make connect``), never beside the
classic ``spark`` fixture's tests.
"""

from __future__ import annotations

import glob
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from spate.spark.java import ensure_java_home

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
START_TIMEOUT_S = 180.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def server_command(port: int, master: str = "local[2]") -> list[str]:
    """``spark-submit`` of the Connect server this pyspark ships, bound to loopback."""
    import pyspark

    home = os.path.dirname(pyspark.__file__)
    jars = glob.glob(os.path.join(home, "jars", "spark-connect_*.jar"))
    if not jars:
        pytest.fail(f"pyspark {pyspark.__version__} ships no Connect server jar in {home}/jars")
    conf = {"spark.connect.grpc.binding.address": "127.0.0.1", "spark.connect.grpc.binding.port": str(port),
            "spark.sql.shuffle.partitions": "2", "spark.ui.enabled": "false",
            "spark.sql.session.timeZone": "UTC", "spark.driver.memory": "1g",
            "spark.driver.extraJavaOptions": "-Duser.timezone=UTC",
            "spark.executor.extraJavaOptions": "-Duser.timezone=UTC"}
    args = [os.path.join(home, "bin", "spark-submit"), "--master", master, "--class", SERVER_CLASS]
    for key, value in conf.items():
        args += ["--conf", f"{key}={value}"]
    return [*args, jars[0]]


class ConnectServer:
    """A Connect server process on 127.0.0.1 (its log in ``log_path``); :meth:`stop` ends its process group."""

    def __init__(self, log_path: str, master: str = "local[2]") -> None:
        self.port = free_port()
        self.log_path = log_path
        env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable,
               "PYSPARK_DRIVER_PYTHON": sys.executable}
        java = ensure_java_home()
        if java is None:
            pytest.fail("no Java runtime found: run `make test` (it installs Java when missing) or set JAVA_HOME")
        env["JAVA_HOME"] = java
        with open(log_path, "wb") as log:
            self.process = subprocess.Popen(server_command(self.port, master), stdout=log, stderr=subprocess.STDOUT,
                                            env=env, start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _listening(self.port):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                with open(log_path, errors="replace") as f:
                    pytest.fail(f"the Connect server did not start: {f.read()[-3000:]}")
            time.sleep(0.5)

    @property
    def url(self) -> str:
        return f"sc://127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(30)


@pytest.fixture(scope="session")
def connect_server(tmp_path_factory) -> Iterator[ConnectServer]:
    server = ConnectServer(str(tmp_path_factory.mktemp("connect") / "server.log"))
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
