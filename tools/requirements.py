"""The third-party requirements of the project and of the extras named on the command line (as pip names them:
``spark,test``), one per line, as pyproject.toml gives them. ``make smoke`` installs them into its pyspark venvs
side by side, then the project itself into each in turn (an editable install writes ``src/*.egg-info``, which two
installs at once would share)."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def requirements(extras: list[str]) -> list[str]:
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    optional = project.get("optional-dependencies", {})
    unknown = [e for e in extras if e not in optional]
    if unknown:
        raise SystemExit(f"unknown extras {unknown}: pyproject.toml has {sorted(optional)}")
    return list(dict.fromkeys(project["dependencies"] + [r for e in extras for r in optional[e]]))


if __name__ == "__main__":
    print("\n".join(requirements([e for arg in sys.argv[1:] for e in arg.split(",") if e])))
