"""A Spark Connect server on 127.0.0.1 from the pip pyspark's own jars (``SparkConnectServer`` started with
``spark-submit``), in a process group of its own, stopped by PID: what the Connect tests and ``spate bench
connect`` run against. Its Python (the ``foreachBatch`` process and the executors' workers) is this
interpreter."""

from __future__ import annotations

import glob
import os
import signal
import socket
import subprocess
import sys
import time

from spate.spark.java import ensure_java_home

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
START_TIMEOUT_S = 180.0
CONF = {"spark.sql.shuffle.partitions": "2", "spark.ui.enabled": "false", "spark.sql.session.timeZone": "UTC",
        "spark.driver.memory": "1g", "spark.driver.extraJavaOptions": "-Duser.timezone=UTC",
        "spark.executor.extraJavaOptions": "-Duser.timezone=UTC"}


class ConnectServerError(RuntimeError):
    """The Connect server did not start (the message ends with its log)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def session_conf(jvm_options: str = "", overrides: dict[str, str] | None = None) -> dict[str, str]:
    """:data:`CONF` with ``jvm_options`` added to the driver's and the executors' Java options, then
    ``overrides`` over it."""
    java = ("spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions")
    return {**CONF, **{key: f"{CONF[key]} {jvm_options}".strip() for key in java}, **(overrides or {})}


def server_command(port: int, master: str, conf: dict[str, str]) -> list[str]:
    """``spark-submit`` of the Connect server this pyspark ships, bound to loopback, with the settings ``conf``."""
    import pyspark

    home = os.path.dirname(pyspark.__file__)
    jars = glob.glob(os.path.join(home, "jars", "spark-connect_*.jar"))
    if not jars:
        raise ConnectServerError(f"pyspark {pyspark.__version__} ships no Connect server jar in {home}/jars")
    settings = {**conf, "spark.connect.grpc.binding.address": "127.0.0.1",
                "spark.connect.grpc.binding.port": str(port)}
    args = [os.path.join(home, "bin", "spark-submit"), "--master", master, "--class", SERVER_CLASS]
    for key, value in settings.items():
        args += ["--conf", f"{key}={value}"]
    return [*args, jars[0]]


class ConnectServer:
    """A Connect server process on 127.0.0.1 (``master``: local[2] by default), its log in ``log_path``;
    :meth:`stop` ends its process group (the server, its executors and Python workers). ``conf``: settings over
    :data:`CONF`; ``jvm_options``: added to the server's and its executors' Java options (e.g.
    :data:`~spate_tools.standalone.QUICK_JVM_OPTIONS` for the tests' servers).

    Raises:
        ConnectServerError: no Java, no Connect jar, or the server did not listen within the timeout."""

    def __init__(self, log_path: str, master: str = "local[2]", conf: dict[str, str] | None = None,
                 jvm_options: str = "") -> None:
        java = ensure_java_home()
        if java is None:
            raise ConnectServerError("no Java runtime found: run `make test` (it installs Java when missing) or set "
                                     "JAVA_HOME")
        self.port, self.log_path = free_port(), log_path
        env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable,
               "PYSPARK_DRIVER_PYTHON": sys.executable, "JAVA_HOME": java}
        command = server_command(self.port, master, session_conf(jvm_options, conf))
        with open(log_path, "wb") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env,
                                            start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _listening(self.port):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                with open(log_path, errors="replace") as f:
                    raise ConnectServerError(f"the Connect server did not start: {f.read()[-3000:]}")
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

    def __enter__(self) -> ConnectServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
