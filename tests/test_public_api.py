"""The public API of ``spate``: its names are imported on first use (src/spate/__init__.py), so a process that needs
one part of the library, such as a materialization's reader process, starts without importing the rest. What type
checkers read (the imports under ``TYPE_CHECKING``) and what runs (``_LAZY``) must name the same things."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import spate

INIT = Path(spate.__file__)


def _type_checking_imports() -> dict[str, tuple[str, ...]]:
    for node in ast.parse(INIT.read_text()).body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            return {n.module: tuple(a.name for a in n.names) for n in node.body if isinstance(n, ast.ImportFrom)
                    and n.module is not None}
    raise AssertionError("src/spate/__init__.py has no `if TYPE_CHECKING:` block")


def _fresh(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_what_type_checkers_read_is_what_runs():
    assert _type_checking_imports() == spate._LAZY


def test_every_exported_name_is_its_modules_object():
    for module, names in spate._LAZY.items():
        for name in names:
            assert getattr(spate, name) is getattr(importlib.import_module(module), name), name
    assert set(spate.__all__) <= set(dir(spate))
    for name in spate.__all__:
        assert getattr(spate, name) is not None, name


def test_a_name_spate_does_not_have_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'LocalRuner'"):
        spate.LocalRuner  # noqa: B018 (the lookup is the test)
    with pytest.raises(ImportError):
        from spate import LocalRuner  # noqa: F401


def test_importing_spate_imports_only_what_is_used():
    loaded = _fresh("import sys, spate; print(' '.join(sorted(sys.modules)))").split()
    assert "spate.errors" in loaded
    assert not [m for m in loaded if m.startswith(("spate.runtime", "spate.checkpoint", "pyarrow"))], loaded
    star = _fresh("from spate import *; import spate; print(all(n in globals() for n in spate.__all__))")
    assert star.strip() == "True"


def test_the_materialization_reader_process_starts_without_the_runtime():
    loaded = _fresh("import sys, spate.changelog.materializer_process; print(' '.join(sorted(sys.modules)))").split()
    assert "spate.changelog.materializer_process" in loaded
    assert not [m for m in loaded if m.startswith(("spate.runtime", "spate.checkpoint", "spate.sinks"))], loaded
