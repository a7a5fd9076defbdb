"""A real Spark standalone cluster on 127.0.0.1, started from the installed pyspark package, for tests and
benchmarks that need several executors on separate "machines".

``StandaloneCluster`` starts one master and N workers with pyspark's own ``sbin/spark-daemon.sh`` (the
script Spark's ``start-master.sh`` / ``start-worker.sh`` call; the pip package ships the daemon script but not
those wrappers). Everything listens on loopback only (``SPARK_LOCAL_IP=127.0.0.1``, ``--host 127.0.0.1``,
free ports picked at start). Each worker has its own work dir, ``SPARK_LOCAL_DIRS``, log and PID dir under one
temporary root, so two workers share no local disk, as two machines would not. The daemons run in a small
environment of their own (no credentials or ``SPARK_*`` settings of the caller leak into them). Stopping
terminates, by PID, exactly the processes the cluster started: the daemons, the executor JVMs their workers
launched and those executors' Python workers, escalating to SIGKILL within a bounded time.

    with StandaloneCluster(workers=2, cores=1, memory_mb=1024) as cluster:
        spark = cluster.session("my-app")            # or standalone_session(cluster.master_url) elsewhere
        ...
        cluster.kill_executor(cluster.executors(app_id)[0])   # fault injection: SIGKILL one executor JVM
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spate.spark import procfs
from spate.spark.java import ensure_java_home

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"
LOOPBACK = "127.0.0.1"
# What the daemons inherit from the caller's environment; everything else (credentials, SPARK_* settings,
# PYSPARK_* of a running driver) stays out, as it would on another machine.
_INHERITED_ENV = ("PATH", "HOME", "USER", "LANG", "LC_ALL", "TZ", "TMPDIR")
# JVM flags for short-lived test JVMs on a small machine: the C1 compiler only and the serial collector cut the
# CPU a driver or an executor spends starting up by ~40 % (measured on 2 cores); VFORK starts a child process
# without the JDK's helper process in between (Hadoop's local file system runs chmod and readlink as processes,
# thousands per test file: 3.7 against 4.8 ms of CPU each). Not for benchmarks, where the steady state matters.
# Pass them as ``jvm_options`` to the cluster (daemons) and to its drivers (driver and executors).
QUICK_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Djdk.lang.Process.launchMechanism=VFORK"


def quick_checkpoint_conf() -> dict[str, str]:
    """Spark settings for test sessions whose queries checkpoint to a local disk, beside
    :data:`QUICK_JVM_OPTIONS`: Spark's checkpoint file manager on Hadoop's ``FileSystem`` API. Without Hadoop's
    native library (pip's pyspark has none), the default manager's rename (``FileContext``) runs ``readlink``
    twice as a child process for every file it writes; this one renames with a system call. The files are the
    same, and so is the outcome for one writer per checkpoint. The class's package is the installed pyspark's."""
    import pyspark

    major, minor = (int(part) for part in pyspark.__version__.split(".")[:2])
    package = "org.apache.spark.sql.execution.streaming" + (".checkpointing" if (major, minor) >= (4, 1) else "")
    return {"spark.sql.streaming.checkpointFileManagerClass": f"{package}.FileSystemBasedCheckpointFileManager"}


class ClusterError(RuntimeError):
    """The cluster did not start (the message carries the tail of the daemons' logs)."""


@dataclass(frozen=True)
class ExecutorProcess:
    """One executor JVM (``CoarseGrainedExecutorBackend``) launched by one of the cluster's workers."""

    pid: int
    app_id: str
    executor_id: str
    worker: int  # index of the worker that launched it


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port free on ``host`` now (the OS picks it)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def spark_home() -> str:
    """The Spark distribution inside the pyspark package (``bin/``, ``sbin/``, ``jars/``)."""
    import pyspark

    return os.path.dirname(os.path.abspath(pyspark.__file__))


class StandaloneCluster:
    """A Spark standalone master and ``workers`` workers on 127.0.0.1 (a context manager).

    Args:
        workers: number of workers (each one a separate "machine": own work dir and local dirs).
        cores / memory_mb: what each worker offers to executors.
        root: where the work, local, log and PID dirs go (default: a new temporary directory, removed on stop
            unless ``keep_root``).
        python: the Python executors start Python workers with (default: this interpreter, so executors import
            spate from the same environment as the driver).
        start_timeout_s: bound on start-up, until the master reports every worker alive.
        stop_timeout_s: bound on stopping (SIGTERM, then SIGKILL for what is still alive).
        daemon_memory: heap of the master and worker JVMs (``SPARK_DAEMON_MEMORY``).
        jvm_options: extra options of the master and worker JVMs (e.g. :data:`QUICK_JVM_OPTIONS`), and the
            default ``jvm_options`` of :meth:`spark_conf` / :meth:`session` (driver and executors).
    """

    def __init__(self, workers: int = 2, cores: int = 1, memory_mb: int = 1024, *, root: str | None = None,
                 python: str | None = None, start_timeout_s: float = 120.0, stop_timeout_s: float = 30.0,
                 daemon_memory: str = "256m", jvm_options: str = "", keep_root: bool = False) -> None:
        if workers < 1 or cores < 1 or memory_mb < 256:
            raise ValueError(f"need workers >= 1, cores >= 1, memory_mb >= 256; got {workers}, {cores}, {memory_mb}")
        self.workers, self.cores, self.memory_mb = workers, cores, memory_mb
        self.python = python or sys.executable
        self.start_timeout_s, self.stop_timeout_s = start_timeout_s, stop_timeout_s
        self.daemon_memory, self.jvm_options = daemon_memory, jvm_options
        self._own_root = root is None
        self.keep_root = keep_root
        self.root = Path(root) if root else Path(tempfile.mkdtemp(prefix="spate-standalone-"))
        self.master_port = self.master_webui_port = 0
        self.daemon_pids: list[int] = []  # master first, then the workers in order
        self._started: list[tuple[int, str]] = []  # (pid, cmdline marker) of every process started, for stop
        self._stopped = False

    # -- addresses --------------------------------------------------------------------------------------------
    @property
    def master_url(self) -> str:
        return f"spark://{LOOPBACK}:{self.master_port}"

    @property
    def webui_url(self) -> str:
        return f"http://{LOOPBACK}:{self.master_webui_port}"

    def worker_dir(self, index: int) -> Path:
        return self.root / f"worker-{index}"

    def worker_work_dir(self, index: int) -> Path:
        """Where worker ``index`` runs its executors (``<work>/<app id>/<executor id>``, their cwd)."""
        return self.worker_dir(index) / "work"

    def worker_local_dir(self, index: int) -> Path:
        """Worker ``index``'s ``SPARK_LOCAL_DIRS`` (its executors' block manager and Python workers' local disk)."""
        return self.worker_dir(index) / "local"

    # -- lifecycle ----------------------------------------------------------------------------------------------
    def __enter__(self) -> StandaloneCluster:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def start(self) -> StandaloneCluster:
        """Start the master, then the workers (in parallel), and wait until the master reports all of them
        alive; on any failure stop what was started and raise :class:`ClusterError`."""
        java = ensure_java_home()
        if java is None or not (Path(java) / "bin" / "java").exists():
            raise ClusterError("no Java home found (JAVA_HOME or <venv>/java-home): the daemons need one")
        deadline = time.monotonic() + self.start_timeout_s
        try:
            self.master_port, self.master_webui_port = free_port(), free_port()
            master = self._launch(self.root / "master", java, MASTER_CLASS, 1,
                                  ["--host", LOOPBACK, "--port", str(self.master_port),
                                   "--webui-port", str(self.master_webui_port)], {})
            self._await_daemons([master], deadline)
            self._wait_for(lambda: self.master_state() is not None, deadline, "the master's web UI to answer")
            launches = []
            for i in range(self.workers):
                d = self.worker_dir(i)
                for sub in ("work", "local"):
                    (d / sub).mkdir(parents=True, exist_ok=True)
                args = ["--host", LOOPBACK, "--port", str(free_port()), "--webui-port", str(free_port()),
                        "--cores", str(self.cores), "--memory", f"{self.memory_mb}m",
                        "--work-dir", str(self.worker_work_dir(i)), self.master_url]
                env = {"SPARK_LOCAL_DIRS": str(self.worker_local_dir(i)),
                       "SPARK_WORKER_DIR": str(self.worker_work_dir(i))}
                launches.append(self._launch(d, java, WORKER_CLASS, i + 1, args, env))
            self._await_daemons(launches, deadline)
            self._wait_for(lambda: len(self.alive_workers()) >= self.workers, deadline,
                           f"{self.workers} alive workers")
        except BaseException as e:
            logs = self.log_tail()
            self.stop()
            if isinstance(e, ClusterError):
                raise ClusterError(f"{e}\n{logs}") from None
            raise
        return self

    def stop(self) -> None:
        """Stop everything the cluster started, by PID: SIGTERM the workers (they stop their executors) and the
        master, SIGKILL whatever is alive after half the stop timeout, including executor JVMs and Python
        workers the workers left behind. Bounded by ``stop_timeout_s``; idempotent."""
        if self._stopped:
            return
        self._stopped = True
        deadline = time.monotonic() + self.stop_timeout_s
        children = self._descendants()  # executors and their Python workers, found before their parents go
        daemons = [p for p in self.daemon_pids if self._is_ours(p)]
        for pid in reversed(daemons):  # workers first, the master last
            _signal(pid, signal.SIGTERM)
        _wait_gone(daemons, time.monotonic() + self.stop_timeout_s / 2)
        leftovers = [p for p in daemons + children if procfs.is_running(p)] + self._orphans()
        for pid in leftovers:
            _signal(pid, signal.SIGKILL)
        still = _wait_gone(leftovers, deadline)
        if self._own_root and not self.keep_root and not still:
            shutil.rmtree(self.root, ignore_errors=True)
        if still:
            raise ClusterError(f"processes {still} did not stop within {self.stop_timeout_s} s (root {self.root})")

    def alive(self) -> list[int]:
        """PIDs of the processes the cluster started that are still alive (daemons, executors, Python workers)."""
        return sorted({p for p in self.daemon_pids if self._is_ours(p)} | set(self._descendants()) |
                      set(self._orphans()))

    # -- the master's view --------------------------------------------------------------------------------------
    def master_state(self) -> dict[str, Any] | None:
        """The master web UI's JSON (``/json/``: workers, alive workers, cores, active and completed apps), or
        None if it does not answer."""
        try:
            with urllib.request.urlopen(f"{self.webui_url}/json/", timeout=5) as resp:
                return dict(json.loads(resp.read()))
        except (OSError, ValueError):
            return None

    def alive_workers(self) -> list[dict[str, Any]]:
        state = self.master_state() or {}
        return [w for w in state.get("workers", []) if w.get("state") == "ALIVE"]

    def active_apps(self) -> list[str]:
        """Ids of the applications running on the cluster (per the master)."""
        state = self.master_state() or {}
        return [a["id"] for a in state.get("activeapps", [])]

    # -- executors ----------------------------------------------------------------------------------------------
    def executors(self, app_id: str | None = None) -> list[ExecutorProcess]:
        """Executor JVMs running now, launched by this cluster's workers (found by their command line and their
        working directory, ``<worker work dir>/<app id>/<executor id>``), of ``app_id`` if given."""
        found = []
        for pid in procfs.pids():
            cmd = procfs.cmdline(pid)
            if EXECUTOR_CLASS not in cmd:
                continue
            worker = self._worker_of_cwd(pid)
            app = _arg(cmd, "--app-id")
            if worker is None or app is None or (app_id is not None and app != app_id):
                continue
            found.append(ExecutorProcess(pid, app, _arg(cmd, "--executor-id") or "?", worker))
        return sorted(found, key=lambda e: (e.worker, e.pid))

    def executor_of(self, pid: int) -> ExecutorProcess | None:
        """The executor whose process tree holds ``pid`` (e.g. a Python worker running a task), if any."""
        by_pid = {e.pid: e for e in self.executors()}
        seen = set()
        while pid > 1 and pid not in seen:
            if pid in by_pid:
                return by_pid[pid]
            seen.add(pid)
            pid = procfs.parent(pid)
        return None

    def kill_executor(self, executor: ExecutorProcess, timeout_s: float = 15.0) -> None:
        """SIGKILL one executor JVM (fault injection) and wait, bounded, until it is gone. Its worker notices and
        the master launches a replacement executor if the worker has room."""
        if not self._is_ours(executor.pid, EXECUTOR_CLASS):
            raise ValueError(f"{executor} is not an executor of this cluster (any more)")
        _signal(executor.pid, signal.SIGKILL)
        if _wait_gone([executor.pid], time.monotonic() + timeout_s):
            raise ClusterError(f"executor {executor} still alive {timeout_s} s after SIGKILL")

    # -- drivers -----------------------------------------------------------------------------------------------
    def spark_conf(self, **kwargs: Any) -> dict[str, str]:
        """The Spark conf of a driver for this cluster (see :func:`standalone_conf`), an executor per worker."""
        return standalone_conf(self.master_url, **self._driver_defaults(kwargs))

    def session(self, app_name: str = "spate", **kwargs: Any) -> Any:
        """A SparkSession in this process, a driver of this cluster (see :func:`standalone_session`)."""
        return standalone_session(self.master_url, app_name, **self._driver_defaults(kwargs))

    def _driver_defaults(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        return {"executor_cores": self.cores, "executor_memory_mb": self.memory_mb, "python": self.python,
                "jvm_options": self.jvm_options, **kwargs}

    def log_tail(self, lines: int = 15) -> str:
        """The last lines of every daemon's log (for error messages)."""
        out = []
        for log in sorted(self.root.glob("*/logs/*.out")):
            text = log.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- {log}\n" + "\n".join(text))
        return "\n".join(out)

    # -- internals ----------------------------------------------------------------------------------------------
    def _env(self, java: str, directory: Path, extra: Mapping[str, str]) -> dict[str, str]:
        env = {k: os.environ[k] for k in _INHERITED_ENV if k in os.environ}
        env.update(JAVA_HOME=java, SPARK_HOME=spark_home(), SPARK_LOCAL_IP=LOOPBACK, SPARK_CONF_DIR=str(
            self.root / "conf"), SPARK_LOG_DIR=str(directory / "logs"), SPARK_PID_DIR=str(directory / "pid"),
                   SPARK_DAEMON_MEMORY=self.daemon_memory, SPARK_IDENT_STRING="spate",
                   PYSPARK_PYTHON=self.python, HOSTNAME=LOOPBACK,
                   SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false",  # no REST server on a fixed port
                   SPARK_DAEMON_JAVA_OPTS=self.jvm_options)
        env.update(extra)
        return env

    def _launch(self, directory: Path, java: str, cls: str, instance: int, args: list[str],
                extra_env: Mapping[str, str]) -> tuple[subprocess.Popen[str], Path]:
        """Run ``spark-daemon.sh start <cls> <instance> <args>`` (it forks the JVM and returns after ~2.5 s);
        returns the script's process and the PID file it writes."""
        (self.root / "conf").mkdir(parents=True, exist_ok=True)  # empty: no spark-env.sh, no defaults
        directory.mkdir(parents=True, exist_ok=True)
        script = os.path.join(spark_home(), "sbin", "spark-daemon.sh")
        proc = subprocess.Popen(["bash", script, "start", cls, str(instance), *args], cwd=directory, text=True,
                                env=self._env(java, directory, extra_env), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        return proc, directory / "pid" / f"spark-spate-{cls}-{instance}.pid"

    def _await_daemons(self, launches: Iterable[tuple[subprocess.Popen[str], Path]], deadline: float) -> None:
        """Wait for the daemon scripts and record the JVMs' PIDs (also of a script that failed or was cut
        short, so stop() finds its JVM); raise if one failed to launch."""
        errors = []
        for proc, pid_file in launches:
            try:
                out, _ = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                out, _ = proc.communicate()
                errors.append(f"spark-daemon.sh did not return in time ({pid_file.name})")
            else:
                if proc.returncode != 0 or "failed to launch" in out:
                    errors.append(f"spark-daemon.sh failed (exit {proc.returncode}): {out.strip()[-2000:]}")
            pid = pid_file.read_text().strip() if pid_file.exists() else ""
            if pid.isdigit():
                self.daemon_pids.append(int(pid))
            elif not errors:
                errors.append(f"spark-daemon.sh wrote no PID file {pid_file}")
        if errors:
            raise ClusterError("; ".join(errors))

    def _wait_for(self, ready: Any, deadline: float, what: str) -> None:
        while not ready():
            dead = [p for p in self.daemon_pids if not procfs.is_running(p)]
            if dead:
                raise ClusterError(f"daemon processes {dead} died while waiting for {what}")
            if time.monotonic() > deadline:
                raise ClusterError(f"timed out after {self.start_timeout_s} s waiting for {what}")
            time.sleep(0.2)

    def _is_ours(self, pid: int, marker: str = "org.apache.spark.deploy.") -> bool:
        """``pid`` is alive and still one of our processes (guards against PID reuse)."""
        return procfs.is_running(pid) and marker in " ".join(procfs.cmdline(pid)) and (
            pid in self.daemon_pids or self._in_root(pid))

    def _in_root(self, pid: int) -> bool:
        """``pid`` runs inside the cluster's root: the cluster started it (nothing else runs there)."""
        cwd = procfs.cwd(pid)
        return cwd is not None and cwd.is_relative_to(self.root) and pid != os.getpid()

    def _worker_of_cwd(self, pid: int) -> int | None:
        cwd = procfs.cwd(pid)
        for i in range(self.workers):
            if cwd is not None and cwd.is_relative_to(self.worker_work_dir(i)):
                return i
        return None

    def _descendants(self) -> list[int]:
        """Every live process below the cluster's daemons (executor JVMs, their Python daemons and workers)."""
        parents = {p: procfs.parent(p) for p in procfs.pids() if procfs.is_running(p)}
        ours, found = set(self.daemon_pids), []
        changed = True
        while changed:
            changed = False
            for pid, ppid in parents.items():
                if ppid in ours and pid not in ours:
                    ours.add(pid)
                    found.append(pid)
                    changed = True
        return found

    def _orphans(self) -> list[int]:
        """Live processes inside the cluster's root that are not recorded daemons: executors and their Python
        workers whose worker is gone, or a daemon whose start was cut short before its PID was recorded."""
        return [p for p in procfs.pids() if p not in self.daemon_pids and procfs.is_running(p) and self._in_root(p)]


# -- drivers ------------------------------------------------------------------------------------------------------
def standalone_conf(master_url: str, *, executor_cores: int = 1, executor_memory_mb: int = 1024,
                    task_max_failures: int = 8, python: str | None = None, jvm_options: str = "",
                    executor_env: Mapping[str, str] | None = None,
                    extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Spark conf for a driver of a standalone cluster on loopback: the driver binds to 127.0.0.1, each
    executor takes ``executor_cores`` cores and ``executor_memory_mb`` of its worker, a task may fail
    ``task_max_failures`` times (a killed executor fails its running tasks: the query must survive that),
    executors run ``python`` (default: this interpreter) with ``executor_env`` added to their environment;
    ``jvm_options`` go to the driver's and the executors' JVMs."""
    java_options = f"-Duser.timezone=UTC {jvm_options}".strip()
    conf = {
        "spark.master": master_url,
        "spark.driver.host": LOOPBACK,
        "spark.driver.bindAddress": LOOPBACK,
        "spark.executor.cores": str(executor_cores),
        "spark.executor.memory": f"{executor_memory_mb}m",
        "spark.task.maxFailures": str(task_max_failures),
        "spark.executorEnv.PYSPARK_PYTHON": python or sys.executable,
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.session.timeZone": "UTC",
        "spark.driver.extraJavaOptions": java_options,
        "spark.executor.extraJavaOptions": java_options,
    }
    conf.update({f"spark.executorEnv.{k}": v for k, v in (executor_env or {}).items()})
    conf.update(extra or {})
    return conf


def standalone_session(master_url: str, app_name: str = "spate", **kwargs: Any) -> Any:
    """A SparkSession driving the standalone cluster at ``master_url`` (conf from :func:`standalone_conf`,
    whose keyword arguments it takes). Sets ``PYSPARK_PYTHON`` and ``SPARK_LOCAL_IP`` in this process (PySpark
    reads the executors' Python from the environment) and Java from :func:`ensure_java_home`."""
    from pyspark.sql import SparkSession

    ensure_java_home()
    conf = standalone_conf(master_url, **kwargs)
    os.environ["PYSPARK_PYTHON"] = conf["spark.executorEnv.PYSPARK_PYTHON"]
    os.environ["SPARK_LOCAL_IP"] = LOOPBACK
    builder = SparkSession.builder.appName(app_name)
    for key, value in conf.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


# -- /proc helpers (Linux) --------------------------------------------------------------------------------------
def _arg(cmd: list[str], flag: str) -> str | None:
    return cmd[cmd.index(flag) + 1] if flag in cmd and cmd.index(flag) + 1 < len(cmd) else None


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def _wait_gone(pids: Iterable[int], deadline: float) -> list[int]:
    """Wait until none of ``pids`` is alive or ``deadline`` passes; return the ones still alive."""
    pending = list(pids)
    while True:
        pending = [p for p in pending if procfs.is_running(p)]
        if not pending or time.monotonic() > deadline:
            return pending
        time.sleep(0.1)
