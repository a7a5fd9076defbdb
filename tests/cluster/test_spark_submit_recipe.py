"""docs/spark.md's "Shipping spate to a cluster with spark-submit", run as written.

The doc's command block is run by bash, line for line, in a work directory, with the variables it names set as a
user would set them: ``SPATE`` a copy of this repository's source (pip builds it there, not in the checkout),
``SPARK_HOME`` the pip package's Spark, ``MASTER`` a standalone master on 127.0.0.1. The commands up to the
``venv-pack`` line build the archive once per test session (a fresh venv of spate and its runtime dependencies
from the package index, ~90 MB packed); the rest unpack it for the driver and submit ``tests/cluster/
submit_app.py`` (as ``app.py``) with ``spark-submit`` from pyspark's ``bin/``.

The cluster (:class:`spate_tools.standalone.StandaloneCluster`: a master and 2 workers on loopback, own work and
local dirs, stopped by PID) runs its daemons with ``PYSPARK_PYTHON=./environment/bin/python``: a path that
exists only where Spark unpacked the archive, so an executor has no other Python with spate to fall back on.
Test-only Spark settings (loopback addresses, quick JVM flags, no UI) go in a ``spark-defaults.conf`` of the
test's own ``SPARK_CONF_DIR``, as a cluster's admin would put them, so the doc's command line stays the user's.
Every run is bounded in time; the recipe runs in its own process group, killed on a timeout."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers.readme_blocks import REPO, plain_block
from spate.spark.java import ensure_java_home
from spate.spark.procfs import is_running
from spate_tools.standalone import LOOPBACK, QUICK_JVM_OPTIONS, StandaloneCluster, spark_home

pytestmark = pytest.mark.spark
DOC = REPO / "docs" / "spark.md"
APP = Path(__file__).with_name("submit_app.py")
BUILD_TIMEOUT_S = 900  # a fresh venv, pip from the index (or its cache), venv-pack
SUBMIT_TIMEOUT_S = 600
SHIPPED = "./environment/bin/python"
BATCHES = [[("ann", "/"), ("bob", "/a"), ("ann", "/b")], [("bob", "/"), ("cy", "/c")], [("ann", "/a")]]


def recipe() -> tuple[str, str]:
    """The doc's commands: those that build the archive, and those that unpack it and submit the application."""
    block = plain_block("venv-pack --quiet", DOC)
    build, cut, submit = block.partition("mkdir environment")
    assert cut and "spark-submit" in submit and f"PYSPARK_PYTHON={SHIPPED}" in submit, block
    return build, cut + submit


def run_recipe(script: str, cwd: Path, env: dict[str, str], timeout_s: float, log: Path) -> None:
    """``script`` in bash (errexit), in its own process group, killed whole after ``timeout_s``."""
    with open(log, "a") as out:
        proc = subprocess.Popen(["bash", "-e", "-o", "pipefail", "-c", script], cwd=cwd, env=env, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            code: int | str = proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            code = f"killed after {timeout_s} s"
    assert code == 0, f"the recipe exited {code}:\n{script}\n" + log.read_text(errors="replace")[-6000:]


def user_env(**variables: str) -> dict[str, str]:
    """The environment of a user's shell: this one without Python's, PySpark's and Spark's variables, with
    ``python3`` the interpreter this test runs on (the driver's Python version) and Java found."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYSPARK_", "SPARK_", "PYTHON", "VIRTUAL_ENV", "JAVA_HOME"))}
    env["PATH"] = os.pathsep.join([os.path.dirname(sys._base_executable), env.get("PATH", "")])  # type: ignore[attr-defined]
    java = ensure_java_home()
    assert java is not None, "no Java home found: run `make test` (it installs Java when missing)"
    env.update(JAVA_HOME=java, SPARK_LOCAL_IP=LOOPBACK, **variables)
    return env


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Iterator[Path]:
    """A work directory holding the packed environment, built by the doc's first commands (once); the ~600 MB of
    environments, archive and source copy are removed afterwards (the logs stay)."""
    root = tmp_path_factory.mktemp("submit")
    source = root / "spate-source"  # pip builds in the source tree: a copy keeps the checkout clean
    shutil.copytree(REPO / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    work = root / "work"
    work.mkdir()
    build, _ = recipe()
    run_recipe(build, work, user_env(SPATE=str(source)), BUILD_TIMEOUT_S, root / "build.log")
    assert (work / "spate-env.tar.gz").stat().st_size > 10_000_000
    yield work
    for heavy in (source, work / "spate-env", work / "environment", work / "spate-env.tar.gz"):
        if heavy.is_dir():
            shutil.rmtree(heavy, ignore_errors=True)
        else:
            heavy.unlink(missing_ok=True)


@pytest.fixture(scope="module")
def cluster():
    with StandaloneCluster(workers=2, cores=1, memory_mb=1024, jvm_options=QUICK_JVM_OPTIONS,
                           python=SHIPPED) as c:
        yield c
        started = c.alive()
    assert started and not [p for p in started if is_running(p)], "the cluster stopped every process it started"


def spark_defaults(directory: Path) -> Path:
    """A SPARK_CONF_DIR with this test's Spark settings: loopback, quick JVMs, no UI (not the recipe's concern)."""
    directory.mkdir(exist_ok=True)
    java_options = f"-Duser.timezone=UTC {QUICK_JVM_OPTIONS}"
    (directory / "spark-defaults.conf").write_text("\n".join([
        f"spark.driver.host {LOOPBACK}", f"spark.driver.bindAddress {LOOPBACK}", "spark.ui.enabled false",
        "spark.ui.showConsoleProgress false", "spark.sql.session.timeZone UTC", "spark.executor.memory 1024m",
        f"spark.driver.extraJavaOptions {java_options}", f"spark.executor.extraJavaOptions {java_options}", ""]))
    return directory


def expected_outputs() -> dict[str, list]:
    running: Counter = Counter()
    out = {}
    for b, rows in enumerate(BATCHES):
        running.update(user for user, _ in rows)
        out[str(b)] = sorted([user, running[user]] for user in {u for u, _ in rows})
    return out


def test_spark_submit_with_the_environment_shipped_to_bare_executors(work, cluster, tmp_path):
    incoming = work / "incoming"
    incoming.mkdir()
    for i, rows in enumerate(BATCHES):
        path = incoming / f"part-{i}.json"
        path.write_text("".join(json.dumps({"user": u, "page": p}) + "\n" for u, p in rows))
        os.utime(path, (1_700_000_000 + i, 1_700_000_000 + i))
    shutil.copy(APP, work / "app.py")
    _, submit = recipe()
    env = user_env(SPARK_HOME=spark_home(), MASTER=cluster.master_url,
                   SPARK_CONF_DIR=str(spark_defaults(tmp_path / "conf")))
    log = tmp_path / "submit.log"
    run_recipe(submit, work, env, SUBMIT_TIMEOUT_S, log)
    result = json.loads((work / "result.json").read_text())

    assert result["finished"] and result["error"] is None, result["error"]
    assert result["outputs"] == expected_outputs(), "each batch's running view counts, state carried on lmdb"
    assert "spate on the cluster: {0: [['ann', 2], ['bob', 1]]" in log.read_text()
    shipped = (work / "environment").resolve()
    assert Path(result["driver"]["prefix"]).resolve() == shipped, "the driver runs the unpacked archive too"

    workers = [cluster.worker_work_dir(i).resolve() for i in range(cluster.workers)]
    venv_packages = Path(sysconfig.get_paths()["purelib"]).resolve()  # the driver's (this test's) environment
    spark = Path(spark_home()).resolve()
    assert len(result["executors"]) == 8
    for seen in result["executors"]:
        cwd = Path(seen["cwd"]).resolve()
        assert any(cwd.is_relative_to(w) for w in workers), f"a task ran outside the cluster's workers: {cwd}"
        prefix = Path(seen["prefix"]).resolve()
        assert prefix == cwd / "environment", f"the executor's Python is the archive unpacked in its work dir: {seen}"
        assert Path(seen["executable"]).parent.resolve() == prefix / "bin"
        for name, file in seen["modules"].items():
            if name == "pyspark":  # Spark's own, from the installation the worker runs
                assert file.startswith(f"{spark}/python/lib/pyspark.zip/"), file
            else:
                assert Path(file).resolve().is_relative_to(prefix), f"{name} from {file}, not from the archive"
        outside = [p for p in seen["path"] if Path(p).resolve().is_relative_to(venv_packages)
                   and not Path(p).resolve().is_relative_to(spark)]
        assert not outside and str(REPO / "src") not in seen["path"], f"the driver's environment is visible: {seen}"
    ran_on = {e for batch in result["ran_on"] for e in batch}
    assert ran_on and all(e for e in ran_on), result["ran_on"]
    deadline = time.monotonic() + 15
    while result["app_id"] in cluster.active_apps() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert result["app_id"] not in cluster.active_apps(), "the application ended: its executors are gone"
