"""The README's examples run as written: the complete local example, and the Spark one."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"


def python_block(containing: str) -> str:
    """The README's first ```python block that contains ``containing``."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    return next(code for code in blocks if containing in code)


def run_block(code: str, module_name: str) -> None:
    # a module name that is not importable: Spark's cloudpickle ships the example's classes by value
    exec(compile(code, "README.md", "exec"), {"__name__": module_name})  # noqa: S102


def test_readme_example_runs(capsys):
    run_block(python_block("LocalRunner("), "readme_example")
    root, *out = capsys.readouterr().out.splitlines()
    assert os.path.isdir(root) and os.listdir(root)  # the root the CLI section inspects
    assert out == ["0 [{'user': 'ann', 'total': 1}, {'user': 'bob', 'total': 1}]",
                   "1 [{'user': 'ann', 'total': 2}]",
                   "2 [{'user': 'bob', 'total': 2}, {'user': 'cy', 'total': 1}]"]


@pytest.mark.spark
def test_readme_spark_example_runs(spark, capsys):
    run_block(python_block("StatefulStream("), "readme_spark_example")
    assert capsys.readouterr().out.splitlines() == ["0 [Row(user='ann', views=2), Row(user='bob', views=1)]"]


@pytest.mark.spark
def test_readme_progress_example_runs(spark, capsys):
    run_block(python_block("StateSize()"), "readme_progress_example")
    # last_progress is set once the listeners have seen the event
    assert capsys.readouterr().out.splitlines() == ["batch 0 state rows 2", "input rows 3 state bytes > 0: True"]


def test_readme_windows_example_runs(capsys):
    run_block(python_block("SlidingWindows("), "readme_windows_example")
    assert capsys.readouterr().out.splitlines() == [
        "0 []", "1 [('ann', -5000, 1), ('bob', -5000, 1)]",
        "2 [('ann', 0, 2), ('ann', 5000, 1), ('bob', 0, 1)]"]


def test_readme_batch_processor_example_runs(capsys):
    run_block(python_block("BatchProcessor"), "readme_batch_example")
    assert capsys.readouterr().out.splitlines() == ["0 [('ann', 2), ('bob', 1)]", "1 [('ann', 3)]"]


def test_readme_rescale_example_runs(capsys):
    run_block(python_block("runner.rescale(4)"), "readme_rescale_example")
    assert capsys.readouterr().out.splitlines() == [
        "4 2 [2, 2, 4]", "['rescaled', 'rescaled', 'rescaled', 'rescaled']", "[(1, 2), (2, 4)]"]


def test_readme_idle_batch_example_runs(capsys):
    run_block(python_block("runner.run_idle()"), "readme_idle_example")
    assert capsys.readouterr().out.splitlines() == [
        "60000 [{'device': 'boiler', 'silent_since_ms': 0}]", "None"]


def test_readme_table_sink_example_runs(capsys):
    run_block(python_block("DeltaSink(f\""), "readme_table_sink_example")
    assert capsys.readouterr().out == ("[{'user': 'bob', 'views': 1}, {'user': 'ann', 'views': 2}, "
                                       "{'user': 'bob', 'views': 2}]\n")
