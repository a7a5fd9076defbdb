"""Shared fixtures and settings.

Tests are grouped by the layer they test (one directory per layer, in the order of docs/architecture.md). What
several test modules share (jobs, data builders, reference models, fixtures) lives in the ``helpers`` package
(tests/helpers/), and test modules import it by its package name (``from helpers.counting import Count``), never
from one another. That needs no ``sys.path`` edit: in pytest's default ("prepend") import mode, importing this
conftest puts tests/ (which has no ``__init__.py``) on ``sys.path``, before any test module is imported, from
whichever directory a run starts. Each test module is imported under its basename (its own directory put on
``sys.path`` too), so no two test files may share one.

The fixtures ``spark`` (a real local[2] SparkSession) and ``s3_uri`` (an S3-compatible server on loopback) are
plugins from helpers.spark_session and helpers.s3 (``pytest_plugins``): every test gets them by argument."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

pytest_plugins = ["helpers.spark_session", "helpers.s3", "helpers.spark_connect"]


def pytest_addoption(parser):
    parser.addoption("--connect", action="store_true",
                     help="run the Spark Connect tests (tests/connect/), and only them: a Connect client session turns "
                          "the whole process to Connect mode, so they never share a process with the other Spark tests")


# What runs on a Spark Connect session with --connect (their ``spark`` fixture is then a Connect session): the
# Connect tests, and Spark's own transformWithState tests as the drop-in's side by side over Connect
ON_CONNECT = ("connect", "spark/test_spark_own_tws_tests.py", "spark/test_spark_own_tws_state_variable_tests.py")


def pytest_ignore_collect(collection_path, config):
    """tests/connect/ only with --connect, and with it only what runs over Connect (``ON_CONNECT``)."""
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.path.abspath(str(collection_path))
    allowed = [os.path.join(here, rel) for rel in ON_CONNECT]
    if config.getoption("connect"):
        on_the_way = any(a.startswith(path + os.sep) for a in allowed) or path == here
        inside = any(path == a or path.startswith(a + os.sep) for a in allowed)
        return None if inside or on_the_way else True
    connect_dir = allowed[0]
    return True if path == connect_dir or path.startswith(connect_dir + os.sep) else None

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # every JVM the tests start binds to loopback only

settings.register_profile("default", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("ci", deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True)
settings.load_profile("ci" if os.environ.get("CI") else "default")
