"""The README's complete example runs as written."""

from __future__ import annotations

import re
from pathlib import Path


def test_readme_example_runs(capsys):
    text = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    code = re.findall(r"```python\n(.*?)```", text, re.S)[0]
    exec(compile(code, "README.md", "exec"), {"__name__": "readme_example"})  # noqa: S102
    out = capsys.readouterr().out.splitlines()
    assert out == ["0 [{'user': 'ann', 'total': 1}, {'user': 'bob', 'total': 1}]",
                   "1 [{'user': 'ann', 'total': 2}]",
                   "2 [{'user': 'bob', 'total': 2}, {'user': 'cy', 'total': 1}]"]
