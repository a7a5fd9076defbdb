"""Session-scoped PySpark fixture shared by the Spark-backed tests: ``spark``, a plugin that tests/conftest.py
names in ``pytest_plugins``, so every test gets it by argument.

Java is located by ``spate.spark.java.ensure_java_home`` (``JAVA_HOME``, else ``<venv>/java-home``, else
``java`` on ``PATH``). Without Java the Spark tests fail
(never skip): `make test` installs Java when the machine has none.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from spate.spark.java import ensure_java_home


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """A small local[2] SparkSession (UTC session time zone), stopped at the end of the test session."""
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
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()
