"""The README's and docs/spark.md's Spark examples on a Spark Connect session, in their Connect form
(:func:`helpers.spark_connect.connect_form`: the session from the server's URL, no ``spark.sparkContext`` call).

A sink that prints runs where Connect runs ``foreachBatch``, on the server, as Spark's own does: the README's
outputs appear in the server's log, not on the client. Listeners run on the client and print there. The state
frame example runs over Connect in tests/spark/test_state_frame.py, the Connect example of docs/spark.md in
test_connect_docs.py."""

from __future__ import annotations

import subprocess
import sys

import pytest

from helpers.readme_blocks import README, fenced_blocks, python_block, run_block
from helpers.spark_connect import connect_form

pytestmark = pytest.mark.spark


def _log_size(server) -> int:
    with open(server.log_path, "rb") as f:
        return len(f.read())


def _log_since(server, offset: int) -> str:
    with open(server.log_path, "rb") as f:
        return f.read()[offset:].decode(errors="replace")


def test_the_readme_spark_examples_run_on_connect(connect_server, connect, tmp_path):
    """The README's first two examples, one after the other in a fresh Python (as a user runs them): what the
    README shows is printed by the server's foreachBatch process, in order; the client prints nothing."""
    code = python_block("StatefulStream(clicks") + "\n" + python_block("class CountViews(StatefulProcessor)")
    script = tmp_path / "first_query_on_connect.py"
    script.write_text(connect_form(code, connect_server.url))
    offset = _log_size(connect_server)
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout == ""
    printed = [line for line in _log_since(connect_server, offset).splitlines() if line.startswith("0 [Row(")]
    shown = [block for lang, block in fenced_blocks(README) if lang == "text"]
    assert printed == (shown[0] + shown[1]).splitlines()


def test_the_progress_listener_example_runs_on_connect(connect_server, connect, capsys):
    run_block(connect_form(python_block("StateSize()"), connect_server.url), "readme_progress_example_on_connect")
    assert capsys.readouterr().out.splitlines() == ["batch 0 state rows 2", "input rows 3 state bytes > 0: True"]
