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
import tempfile

import pytest
from hypothesis import HealthCheck, settings

from helpers import jvm_archive

jvm_archive.use()  # the Spark drivers the tests start load their classes from make test's archive, if it made one
pytest_plugins = ["helpers.spark_session", "helpers.s3", "helpers.spark_connect"]


def pytest_addoption(parser):
    parser.addoption("--connect", action="store_true",
                     help="run the Spark Connect tests (tests/connect/), and only them: a Connect client session turns "
                          "the whole process to Connect mode, so they never share a process with the other Spark tests")


# What runs on a Spark Connect session with --connect (their ``spark`` fixture is then a Connect session): the
# Connect tests, and a representative part of Spark's own transformWithState tests as the drop-in's side by side
# over Connect (a restart, processing-time and event-time timers, composite types, value, list and map state in
# the running count / top-k / word frequency processors, an initial state grouped by non-contiguous columns), the
# state-frame tests (read_state and write_savepoint), and docs/spark.md's Kafka recipe. Not
# test_spark_own_tws_state_variable_tests.py, whose module runs all its queries in the background, two at a time:
# over Connect that load makes Spark's foreachBatch process miss its hard-coded 10 s to connect back. All of them
# would take about 25 minutes there, beyond CI's budget.
CONNECT_DIR = "connect"
CONNECT_PORTED = {
    "spark/test_spark_own_tws_tests.py": (
        "test_transform_with_state_basic_and_query_restarts[pandas]",
        "test_transform_with_state_basic_and_query_restarts[row]",
        "test_transform_with_state_proc_timer[partitions-pandas]",
        "test_transform_with_state_event_time[partitions-pandas]",
        "test_transform_with_state_in_pandas_composite_type[row]",
        "test_transform_with_state_non_contiguous_grouping_cols[with_init_state-pandas]",
        "test_fuzz_running_count_topk_word_frequency[pandas]"),
    "spark/test_state_frame.py": None,  # read_state and write_savepoint: all of them
    "spark/test_kafka_recipe.py": None,  # docs/spark.md's Kafka recipe, on Kafka-shaped files
}
HERE = os.path.dirname(os.path.abspath(__file__))


def pytest_ignore_collect(collection_path, config):
    """tests/connect/ only with --connect, and with it only what runs over Connect."""
    path = os.path.abspath(str(collection_path))
    allowed = [os.path.join(HERE, rel) for rel in (CONNECT_DIR, *CONNECT_PORTED)]
    if config.getoption("connect"):
        on_the_way = any(a.startswith(path + os.sep) for a in allowed) or path == HERE
        inside = any(path == a or path.startswith(a + os.sep) for a in allowed)
        return None if inside or on_the_way else True
    return True if path == allowed[0] or path.startswith(allowed[0] + os.sep) else None


def pytest_collection_modifyitems(config, items):
    """With --connect, of Spark's ported tests only those of ``CONNECT_PORTED``."""
    if not config.getoption("connect"):
        return
    keep, drop = [], []
    for item in items:
        rel = os.path.relpath(str(item.path), HERE)
        chosen = CONNECT_PORTED.get(rel)
        (keep if chosen is None or item.name in chosen else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.fixture(scope="session", autouse=True)
def temporary_files_in_the_runs_base_temp(tmp_path_factory):
    """Every temporary directory the tests make without a place of their own (the docs' examples, which the tests
    run verbatim, use a bare ``tempfile.mkdtemp()``) goes under this run's pytest base temp, which pytest keeps for
    the last three runs and then removes, not in the machine's ``/tmp`` for good: ``tempfile.tempdir`` in this
    process, ``TMPDIR`` for the processes it starts (Python workers, materializer processes, scripts)."""
    root = str(tmp_path_factory.mktemp("tmp"))
    before_dir, before_env = tempfile.tempdir, os.environ.get("TMPDIR")
    tempfile.tempdir, os.environ["TMPDIR"] = root, root
    yield root
    tempfile.tempdir = before_dir
    if before_env is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = before_env


os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # every JVM the tests start binds to loopback only

settings.register_profile("default", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("ci", deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True)
settings.load_profile("ci" if os.environ.get("CI") else "default")
