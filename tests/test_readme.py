"""The README's and docs/' examples run as written: the complete local example, the Spark one, every other
```python block of the README and of docs/ (each run by a test that names the block by a marker), the README's
commands, and the outputs the docs say the examples print."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.readme_blocks import DOCS, README, REPO, fenced_blocks, plain_block, python_block, python_blocks, run_block

# marker -> the test that runs the one ```python block holding it (a block without a marker fails a test)
RUN_BY = {
    "LocalRunner(Clicks": "test_readme_example_runs",
    "StatefulStream(clicks": "test_readme_spark_examples_run_without_java_on_path",
    "class CountViews(StatefulProcessor)": "test_readme_spark_examples_run_without_java_on_path",
    "StateSize()": "test_readme_progress_example_runs",
    "SlidingWindows(": "test_readme_windows_example_runs",
    "class CountPerBatch(BatchProcessor)": "test_readme_batch_processor_example_runs",
    "runner.rescale(4)": "test_readme_rescale_example_runs",
    "runner.run_idle()": "test_readme_idle_batch_example_runs",
    "class IdleAlert(Processor)": "test_guide_timer_order_example_runs",
    'DeltaSink(f"': "test_readme_table_sink_example_runs",
    "write_savepoint(": "tests/spark/test_state_frame.py::test_readme_state_frame_example_runs",
    "def build(kafka_df, checkpoint_root)":
        "tests/spark/test_kafka_recipe.py::test_kafka_recipe_counts_each_record_once_and_resumes_from_the_root",
    "SparkSession.builder.remote(": "tests/connect/test_connect_docs.py::test_the_connect_example_runs_as_documented",
}


def commands(block: str) -> list[str]:
    """The commands of a block of shell lines, without their comments (a line that is only a comment is the
    previous command's comment continued)."""
    return [line.split(" #")[0].strip() for line in block.splitlines() if line.strip() and
            not line.strip().startswith("#")]


def run_readme_example(capsys) -> tuple[str, list[str]]:
    """Run the README's complete example: (the root it printed, the lines its sink printed)."""
    run_block(python_block("LocalRunner(Clicks"), "readme_example")
    root, *out = capsys.readouterr().out.splitlines()
    return root, out


def test_readme_example_runs(capsys):
    root, out = run_readme_example(capsys)
    assert os.path.isdir(root) and os.listdir(root)  # the root the CLI section inspects
    assert out == ["0 [{'user': 'ann', 'total': 1}, {'user': 'bob', 'total': 1}]",
                   "1 [{'user': 'ann', 'total': 2}]",
                   "2 [{'user': 'bob', 'total': 2}, {'user': 'cy', 'total': 1}]"]
    shown = [block for lang, block in fenced_blocks(README) if lang == "text"]
    assert shown[2].splitlines() == out  # what the README says it prints


def _path_without_java(path: str, mirrors: Path) -> str:
    """``path`` with each directory that holds a ``java`` replaced by a mirror of everything else in it."""
    dirs = []
    for i, d in enumerate(p for p in path.split(os.pathsep) if p):
        if os.path.exists(os.path.join(d, "java")):
            mirror = mirrors / str(i)
            mirror.mkdir(parents=True)
            for name in os.listdir(d):
                if name != "java":
                    (mirror / name).symlink_to(os.path.join(d, name))
            d = str(mirror)
        dirs.append(d)
    return os.pathsep.join(dirs)


@pytest.mark.spark
def test_readme_spark_examples_run_without_java_on_path(tmp_path):
    """The README's first two examples, as a new user runs them: one after the other in a fresh
    ``.venv/bin/python`` (the second continues the first's session), with no Java on ``PATH`` and no
    ``JAVA_HOME`` (importing spate finds the one ``make`` installed); what they print is what the README shows,
    with no warning of Spark's about executor requests (which spate's placement makes every batch in local mode)
    and no error trace after they end."""
    code = python_block("StatefulStream(clicks") + "\n" + python_block("class CountViews(StatefulProcessor)")
    gone = ("JAVA_HOME", "PYSPARK_PYTHON", "SPARK_HOME", "PYSPARK_SUBMIT_ARGS")
    env = {k: v for k, v in os.environ.items() if k not in gone}
    env["PATH"] = _path_without_java(env.get("PATH", ""), tmp_path / "path")
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    script = tmp_path / "first_query.py"
    script.write_text(code)
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    shown = [block for lang, block in fenced_blocks(README) if lang == "text"]
    assert done.stdout == shown[0] + shown[1]  # the outputs the README shows beside each example
    assert "Requesting executors is not supported" not in done.stderr, done.stderr[-3000:]
    # nor, once the script's Python exited, a py4j error of Spark's about an event for spate's listener
    assert "Py4J" not in done.stderr and "threw an exception" not in done.stderr, done.stderr[-3000:]


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
    out = capsys.readouterr().out.splitlines()
    assert out == ["4 2 [2, 2, 4]", "['rescaled', 'rescaled', 'rescaled', 'rescaled']", "[(1, 2), (2, 4)]"]
    assert plain_block("['rescaled', ", REPO / "docs" / "guide.md").splitlines() == out  # what the guide shows


def test_readme_cli_commands_run_as_written_on_the_examples_root(capsys, tmp_path):
    """The README's CLI block, each line as written (``ROOT`` being the root the complete example printed), from
    a directory whose ``.venv`` is this virtual environment: each exits 0 and prints what its comment says."""
    root, _ = run_readme_example(capsys)
    (tmp_path / ".venv").mkdir()
    (tmp_path / ".venv" / "bin").symlink_to(Path(sys.executable).parent)
    lines = commands(plain_block(".venv/bin/spate checkpoints list ROOT"))
    assert [shlex.split(c)[1:3] for c in lines] == [["checkpoints", "list"], ["checkpoints", "show"],
                                                    ["checkpoints", "verify"], ["state", "dump"], ["bench", "state"]]
    printed = {}
    for line in lines:
        argv = [root if word == "ROOT" else word for word in shlex.split(line)]
        done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"{line}: {done.stderr}"
        printed[" ".join(argv[1:3])] = done.stdout
    listed = {int(m[1]) for m in re.finditer(r"^\s*(\d+)\s+ok\b", printed["checkpoints list"], re.M)}
    assert listed == {0, 1, 2}, printed["checkpoints list"]  # one verified checkpoint per batch of the example
    assert re.search(r"^\s*\d+\s+\S+\s+(restored from \d+|reused)", printed["checkpoints show"], re.M)
    dumped = {tuple(line.split()[:2]) for line in printed["state dump"].splitlines()}
    assert {("ann", "/"), ("ann", "/a"), ("bob", "/"), ("bob", "/a"), ("cy", "/")} <= dumped  # (user, page)
    assert "spate bench state" in printed["bench state"] and list((tmp_path / "bench-out").glob("*.png"))


def test_readme_make_targets_do_what_their_comments_say():
    """``make demo``, ``make test``, ``make fast``, ``make connect`` and ``make smoke`` exist and run what the
    README says (``make -n``: the commands, not run); ``make fast`` leaves out the tests that need a JVM."""
    lines = commands(plain_block("make demo"))
    assert [c.split() for c in lines] == [["make", "demo"], ["make", "test"], ["make", "fast"], ["make", "connect"],
                                          ["make", "smoke"]]
    says = {"demo": ["spate demo"], "test": ["ruff check", "mypy src", "pytest"],
            "fast": ["ruff check", "mypy src", "pytest", '-m "not spark"', "--ignore=tests/spark",
                     "--ignore=tests/cluster", "--ignore=tests/workshop"],
            "connect": ["pytest", "--connect tests"], "smoke": ["pyspark==", "pytest", "--connect"]}
    for line in lines:
        target = line.split()[1]
        done = subprocess.run(["make", "-n", "-C", str(REPO), target], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert all(s in done.stdout for s in says[target]), (target, done.stdout)


def test_readme_idle_batch_example_runs(capsys):
    run_block(python_block("runner.run_idle()"), "readme_idle_example")
    assert capsys.readouterr().out.splitlines() == [
        "60000 [{'device': 'boiler', 'silent_since_ms': 0}]", "None"]


def test_guide_timer_order_example_runs(capsys):
    run_block(python_block("class IdleAlert(Processor)"), "guide_timer_order_example")
    printed = plain_block("'idle_after': 1}]", REPO / "docs" / "guide.md")
    assert capsys.readouterr().out == printed


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
    tests += (REPO / "tests" / "spark" / "test_kafka_recipe.py").read_text()
    tests += (REPO / "tests" / "connect" / "test_connect_docs.py").read_text()
    assert all(f"def {name.split('::')[-1]}(" in tests for name in RUN_BY.values())


def test_the_first_screen_says_what_spate_is_how_to_start_and_where_to_go():
    """What spate is, the commands, the complete examples (on Spark first: a ``StatefulStream``, then an unchanged
    ``StatefulProcessor``, then ``LocalRunner``) and where to go next, before the mental model."""
    text = README.read_text()
    first = text[:text.index("## The mental model")]
    assert first.startswith("# spate\n\nFlink-grade state for PySpark streaming.")
    assert "make demo" in first and "make test" in first
    examples = [first.index(python_block(m)) for m in ("StatefulStream(clicks", "class CountViews(StatefulProcessor)",
                                                       "LocalRunner(Clicks")]
    assert examples == sorted(examples) and examples[-1] < first.index("## Where to go next")
    assert first.index("```python") == examples[0] - len("```python\n"), "the first example is on Spark"
    for doc in re.findall(r"\]\((docs/[\w.]+\.md)", first):
        assert (REPO / doc).is_file(), doc
    assert len(text.splitlines()) < 300, "reference material goes to docs/"


def test_links_between_the_docs_resolve():
    for doc in DOCS:
        for target in re.findall(r"\]\(([^)#:]+\.(?:md|png))", doc.read_text()):
            assert (doc.parent / target).is_file(), f"{doc.name} links to {target}, which does not exist"
