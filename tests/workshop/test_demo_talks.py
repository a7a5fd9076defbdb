"""``make demo`` as a new user meets it: it says what it is doing while it runs (it was silent for ~54 s), and
every command it suggests runs as printed from the repository root, where ``spate`` is not on ``PATH`` (the
demo named ``spate``; ``make`` installs it as ``.venv/bin/spate``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from spate_tools.cli import main

REPO = Path(__file__).resolve().parents[2]


def test_the_demo_reports_progress_and_its_suggestions_run_as_printed(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    venv_bin = os.path.dirname(os.path.abspath(sys.executable))
    monkeypatch.setenv("PATH", os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep)
                                               if os.path.abspath(p) != venv_bin))
    assert main(["demo", "--local", "--quick", "--dir", str(tmp_path / "demo-out")]) == 0
    printed = capsys.readouterr()
    progress = printed.err.splitlines()
    assert len(progress) >= 3 and progress[0].startswith("spate demo:") and "verifying" in progress[-1]
    suggested = [line.strip() for line in printed.out.split("try next:")[1].splitlines() if line.strip()]
    assert len(suggested) == 3
    for command in suggested:
        done = subprocess.run(command, shell=True, cwd=REPO, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"{command!r} as printed: {done.stderr}"
