"""docs/spark.md's Spark Connect example, run verbatim against a real Connect server (``SPARK_REMOTE`` names it),
its printed output checked against the one the document shows."""

from __future__ import annotations

import pytest

from helpers.readme_blocks import REPO, plain_block, python_block, run_block

pytestmark = pytest.mark.spark


def test_the_connect_example_runs_as_documented(connect_server, connect, monkeypatch, capsys):
    monkeypatch.setenv("SPARK_REMOTE", connect_server.url)
    run_block(python_block("SparkSession.builder.remote("), "docs_connect_example")
    assert capsys.readouterr().out == plain_block("[('ann', 2), ('bob', 1)]", REPO / "docs" / "spark.md")
