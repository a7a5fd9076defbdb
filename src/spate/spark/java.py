"""Finding a Java runtime for PySpark: ``JAVA_HOME``, else the one ``make`` recorded in the virtual
environment (``<venv>/java-home``: the system's Java ≥ 17 or one installed from PyPI), else ``java`` on PATH."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path


def ensure_java_home() -> str | None:
    """Set ``JAVA_HOME`` from ``<venv>/java-home`` if it is unset; return a usable Java home or executable."""
    java_home = os.environ.get("JAVA_HOME")
    if not java_home:
        hint = Path(sys.prefix) / "java-home"
        if hint.is_file():
            candidate = hint.read_text().strip()
            if candidate and (Path(candidate) / "bin" / "java").exists():
                os.environ["JAVA_HOME"] = java_home = candidate
    if java_home and (Path(java_home) / "bin" / "java").exists():
        return java_home
    return shutil.which("java")
