"""Session-scoped PySpark fixture shared by the Spark-backed tests.

Use it from ``conftest.py`` (or directly from a test module) with::

    from spark_fixture import spark  # noqa: F401

Java is located via ``JAVA_HOME``; if that is unset and ``<repo>/.venv/java-home`` exists, its content is
used as ``JAVA_HOME``; otherwise ``java`` must be on ``PATH``. Without Java the Spark tests fail
(never skip): `make test` installs Java when the machine has none.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent


def ensure_java_home() -> str | None:
    """Set ``JAVA_HOME`` from ``.venv/java-home`` if needed; return a usable java home / executable or None."""
    java_home = os.environ.get("JAVA_HOME")
    if not java_home:
        hint = REPO_ROOT / ".venv" / "java-home"
        if hint.is_file():
            candidate = hint.read_text().strip()
            if candidate and (Path(candidate) / "bin" / "java").exists():
                os.environ["JAVA_HOME"] = candidate
                java_home = candidate
    if java_home and (Path(java_home) / "bin" / "java").exists():
        return java_home
    return shutil.which("java")


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
