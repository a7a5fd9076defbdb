"""Shared fixtures. ``spark`` (a real local[2] SparkSession) and ``s3_uri`` (an S3-compatible server on loopback)
come from helpers.spark_session and helpers.s3 (``pytest_plugins``).

Tests are grouped by the layer they test (``LAYER_DIRS``, in the order of docs/architecture.md). Some test
modules build on others' jobs and helpers (``from test_checkpoints import Count``): every layer's directory is
on ``sys.path``, so they import by module name wherever they live."""

from __future__ import annotations

import os
import sys

from hypothesis import HealthCheck, settings

TESTS = os.path.dirname(os.path.abspath(__file__))
LAYER_DIRS = ("storage", "state", "sinks", "changelog", "filemerging", "checkpoint", "runtime", "spark", "cluster",
              "workshop")
sys.path[:0] = [TESTS] + [os.path.join(TESTS, d) for d in LAYER_DIRS]
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # every JVM the tests start binds to loopback only

pytest_plugins = ["helpers.spark_session", "helpers.s3"]

settings.register_profile("default", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("ci", deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True)
settings.load_profile("ci" if os.environ.get("CI") else "default")
