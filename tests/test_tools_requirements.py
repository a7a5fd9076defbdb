"""tools/requirements.py, which ``make smoke`` uses to install the third-party packages of its venvs before spate
itself: what it prints is pyproject.toml's, and a misspelt extra stops the install with the choices."""

from __future__ import annotations

import subprocess
import sys
import tomllib

from helpers.readme_blocks import REPO

SCRIPT = REPO / "tools" / "requirements.py"


def _run(*extras: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *extras], capture_output=True, text=True, timeout=60,
                          check=False)


def test_the_projects_and_the_extras_requirements_once_each():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    done = _run("spark,test", "connect")
    assert done.returncode == 0, done.stderr
    printed = done.stdout.split("\n")[:-1]
    wanted = [*project["dependencies"], *(r for extra in ("spark", "test", "connect")
                                         for r in project["optional-dependencies"][extra])]
    assert set(printed) == set(wanted) and len(printed) == len(set(printed))
    assert "pyspark>=4.0" in printed and "pytest-xdist>=3" in printed and "lmdb>=1.4" in printed


def test_an_unknown_extra_is_refused_with_the_choices():
    done = _run("spark,tset")
    assert done.returncode != 0 and not done.stdout
    assert "unknown extras ['tset']" in done.stderr and "'test'" in done.stderr
