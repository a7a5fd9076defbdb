"""Session-scoped PySpark fixture shared by the Spark-backed tests: ``spark``, a plugin that tests/conftest.py
names in ``pytest_plugins``, so every test gets it by argument; ``spark_conf`` sets session settings for a block.

Java is located by ``spate.spark.java.ensure_java_home`` (``JAVA_HOME``, else ``<venv>/java-home``, else
``java`` on ``PATH``). Without Java the Spark tests fail
(never skip): `make test` installs Java when the machine has none.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from spate.spark.java import ensure_java_home
from spate_tools.standalone import quick_checkpoint_conf


@pytest.fixture(scope="session")
def spark(request) -> Iterator[Any]:
    """A small local[2] SparkSession (UTC session time zone; Spark's checkpoints written through the file-system
    API, :func:`~spate_tools.standalone.quick_checkpoint_conf`), stopped at the end of the test session; with
    ``--connect``, a Spark Connect session of such a server instead (:mod:`helpers.spark_connect`), so the tests
    that work on both kinds run on Connect unchanged."""
    if request.config.getoption("connect"):
        yield request.getfixturevalue("connect")
        return
    if ensure_java_home() is None:
        pytest.fail("no Java runtime found: run `make test` (it installs Java when missing) or set JAVA_HOME")
    import sys

    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers import spate from this environment

    session = (
        SparkSession.builder.master("local[2]")
        .appName("spate-tests")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "1g")
        .config("spark.driver.extraJavaOptions", "-Duser.timezone=UTC")
        .config("spark.executor.extraJavaOptions", "-Duser.timezone=UTC")
        .config(map=quick_checkpoint_conf())
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()


@contextmanager
def spark_conf(spark, **conf):
    """Set the session settings ``conf`` for the block, then restore each one as it was (unset if unset)."""
    old = {k: spark.conf.get(k, None) for k in conf}
    for k, v in conf.items():
        spark.conf.set(k, v)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                spark.conf.unset(k)
            else:
                spark.conf.set(k, v)
