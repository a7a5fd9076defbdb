"""The README's and docs/' examples run as written: the complete local example, the Spark one, and every
other ```python block of the README and of docs/ (each run by a test that names the block by a marker)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
DOCS = [README, *sorted((REPO / "docs").glob("*.md"))]
# marker -> the test that runs the one ```python block holding it (a block without a marker fails a test)
RUN_BY = {
    "LocalRunner(Clicks": "test_readme_example_runs",
    "StatefulStream(clicks": "test_readme_spark_example_runs",
    "StateSize()": "test_readme_progress_example_runs",
    "SlidingWindows(": "test_readme_windows_example_runs",
    "class CountPerBatch(BatchProcessor)": "test_readme_batch_processor_example_runs",
    "runner.rescale(4)": "test_readme_rescale_example_runs",
    "runner.run_idle()": "test_readme_idle_batch_example_runs",
    'DeltaSink(f"': "test_readme_table_sink_example_runs",
    "write_savepoint(": "tests/spark/test_state_frame.py::test_readme_state_frame_example_runs",
}


def python_blocks() -> list[tuple[str, str]]:
    """(document, code) of every ```python block of the README and of docs/."""
    return [(doc.name, code) for doc in DOCS for code in re.findall(r"```python\n(.*?)```", doc.read_text(), re.S)]


def python_block(containing: str) -> str:
    """The one ```python block of the README or docs/ that contains ``containing``."""
    found = [code for _, code in python_blocks() if containing in code]
    assert len(found) == 1, f"{len(found)} python blocks of the README and docs/ contain {containing!r}"
    return found[0]


def run_block(code: str, module_name: str) -> None:
    # a module name that is not importable: Spark's cloudpickle ships the example's classes by value
    exec(compile(code, "README.md", "exec"), {"__name__": module_name})  # noqa: S102


def test_readme_example_runs(capsys):
    run_block(python_block("LocalRunner(Clicks"), "readme_example")
    root, *out = capsys.readouterr().out.splitlines()
    assert os.path.isdir(root) and os.listdir(root)  # the root the CLI section inspects
    assert out == ["0 [{'user': 'ann', 'total': 1}, {'user': 'bob', 'total': 1}]",
                   "1 [{'user': 'ann', 'total': 2}]",
                   "2 [{'user': 'bob', 'total': 2}, {'user': 'cy', 'total': 1}]"]
    shown = re.search(r"```text\n(.*?)```", README.read_text(), re.S)
    assert shown is not None and shown.group(1).splitlines() == out  # what the README says it prints


@pytest.mark.spark
def test_readme_spark_example_runs(spark, capsys):
    run_block(python_block("StatefulStream(clicks"), "readme_spark_example")
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
    run_block(python_block("class CountPerBatch(BatchProcessor)"), "readme_batch_example")
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


def test_every_python_block_is_run_by_a_test():
    """A ```python block added to the README or docs/ without a test fails here: give it a marker in RUN_BY."""
    unrun = [(doc, code[:80]) for doc, code in python_blocks() if not any(m in code for m in RUN_BY)]
    assert not unrun, f"python blocks no test runs: {unrun}"
    for marker in RUN_BY:
        python_block(marker)  # exactly one block each
    tests = (REPO / "tests" / "test_readme.py").read_text() + (REPO / "tests" / "spark" / "test_state_frame.py"
                                                                ).read_text()
    assert all(f"def {name.split('::')[-1]}(" in tests for name in RUN_BY.values())


def test_the_first_screen_says_what_spate_is_how_to_start_and_where_to_go():
    """What spate is, the commands, one complete example and where to go next, before the mental model."""
    text = README.read_text()
    first = text[:text.index("## The mental model")]
    assert first.startswith("# spate\n\nFlink-grade state for PySpark streaming.")
    assert "make demo" in first and "make test" in first
    assert first.index("```python") < first.index("## Where to go next")
    assert "LocalRunner(Clicks" in python_block("LocalRunner(Clicks") and "LocalRunner(Clicks" in first
    for doc in re.findall(r"\]\((docs/[\w.]+\.md)", first):
        assert (REPO / doc).is_file(), doc
    assert len(text.splitlines()) < 250, "reference material goes to docs/"


def test_links_between_the_docs_resolve():
    for doc in DOCS:
        for target in re.findall(r"\]\(([^)#:]+\.(?:md|png))", doc.read_text()):
            assert (doc.parent / target).is_file(), f"{doc.name} links to {target}, which does not exist"
