"""The stream on two executors (Spark's local-cluster: two worker JVMs, each with its own Python workers):
outputs and state equal the model, every checkpoint verifies, one job per batch, task i runs subtask i, and a
restart at another parallelism works."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from spate.spark.java import ensure_java_home

pytestmark = pytest.mark.spark


def test_stream_on_two_executors():
    java = ensure_java_home()
    assert java is not None, "no Java runtime: run make test"
    job = os.path.join(os.path.dirname(__file__), "spark_cluster_job.py")
    env = {**os.environ, "JAVA_HOME": java}
    proc = subprocess.run([sys.executable, job], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0 and "CLUSTER OK" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-4000:]
