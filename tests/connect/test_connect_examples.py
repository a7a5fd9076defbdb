"""The README's and docs/spark.md's Spark examples on a Spark Connect session, in their Connect form
(:func:`helpers.spark_connect.connect_form`: the session from the server's URL, no ``spark.sparkContext`` call).

A sink that prints runs where Connect runs ``foreachBatch``, on the server, as Spark's own does: the README's
outputs are printed there, not on the client. Listeners run on the client and print there. The state
frame example runs over Connect in tests/spark/test_state_frame.py, the Connect example of docs/spark.md in
test_connect_docs.py."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from helpers.clicks import state
from helpers.readme_blocks import python_block, run_block
from helpers.spark_connect import connect_form
from spate import load_checkpoint
from spate.checkpoint.inspect import keyed_state_names
from spate.checkpoint.metadata import read_delivered
from spate.fs import CheckpointStorage
from spate.layout import QUERY_FILE

pytestmark = pytest.mark.spark


def _log_size(server) -> int:
    with open(server.log_path, "rb") as f:
        return len(f.read())


def _log_since(server, offset: int) -> str:
    with open(server.log_path, "rb") as f:
        return f.read()[offset:].decode(errors="replace")


def _roots(directory: str) -> list[str]:
    """The spate checkpoint roots the examples made under ``directory`` (their temporary directories)."""
    return sorted(os.path.join(directory, d) for d in os.listdir(directory)
                  if os.path.exists(os.path.join(directory, d, QUERY_FILE)))


def test_the_readme_spark_examples_run_on_connect(connect_server, connect, tmp_path):
    """The README's first two examples, one after the other in a fresh Python (as a user runs them): both queries
    run their batch and deliver it to the sink, the state is the README's, and the client prints nothing (the
    sink's print runs in the server's foreachBatch process; what it prints there is not checked: Spark may end
    that process before its output reaches the server's log)."""
    code = python_block("StatefulStream(clicks") + "\n" + python_block("class CountViews(StatefulProcessor)")
    script = tmp_path / "first_query_on_connect.py"
    script.write_text(connect_form(code, connect_server.url))
    temp = tmp_path / "tmp"  # where the examples' tempfile.mkdtemp() roots go
    temp.mkdir()
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "TMPDIR": str(temp)})
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout == ""
    views, counts = _roots(str(temp))  # mkdtemp's random names: the order says nothing; tell them by their state
    if "views" not in keyed_state_names(load_checkpoint(CheckpointStorage(views))):
        views, counts = counts, views
    assert state(views, "views") == {"ann": 2, "bob": 1}
    for root in (views, counts):
        storage = CheckpointStorage(root)
        assert load_checkpoint(storage).checkpoint_id == 0 and read_delivered(storage) == 0, root


def test_the_progress_listener_example_runs_on_connect(connect_server, connect, capsys):
    run_block(connect_form(python_block("StateSize()"), connect_server.url), "readme_progress_example_on_connect")
    assert capsys.readouterr().out.splitlines() == ["batch 0 state rows 2", "input rows 3 state bytes > 0: True"]
