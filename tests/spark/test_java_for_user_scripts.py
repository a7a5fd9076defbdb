"""A user's own script, run with the virtual environment's Python, finds the Java ``make`` installed without
Java on ``PATH`` or ``JAVA_HOME``: importing spate's Spark package sets it (issue: first hour of a user)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.spark

SESSION = """
from pyspark.sql import SparkSession
spark = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
print("rows", spark.range(3).count())
spark.stop()
"""


def path_without_java(tmp_path: Path) -> str:
    """A PATH of links to every program on this one but ``java`` (a machine without Java installed)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        if not os.path.isdir(directory):
            continue
        for name in os.listdir(directory):
            target = os.path.join(directory, name)
            if not name.startswith("java") and not (bin_dir / name).exists() and os.access(target, os.X_OK):
                (bin_dir / name).symlink_to(target)
    return str(bin_dir)


def run(script: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", script], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=300, check=False)


def test_a_script_finds_the_java_make_recorded(tmp_path):
    assert (Path(sys.prefix) / "java-home").is_file(), \
        "make writes <venv>/java-home (tools/ensure_java.sh): run the tests through make test"
    env = {k: v for k, v in os.environ.items() if k not in ("JAVA_HOME", "SPARK_HOME", "PYSPARK_SUBMIT_ARGS")}
    env["PATH"] = path_without_java(tmp_path)
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    without = run(SESSION, env, tmp_path)
    assert without.returncode != 0 and "JAVA_GATEWAY_EXITED" in without.stderr + without.stdout, \
        "the environment has no Java of its own"
    with_spate = run("import spate.spark\n" + SESSION, env, tmp_path)
    assert with_spate.returncode == 0 and "rows 3" in with_spate.stdout, with_spate.stderr[-3000:]

