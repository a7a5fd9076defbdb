"""The fenced blocks of the README and of docs/ (``REPO``'s ``DOCS``): the one ```python block that contains a
marker (``python_block``), the one plain block (commands, outputs) of a document that does (``plain_block``), and
``run_block`` to run a python block as a module that is not importable."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = [README, *sorted((REPO / "docs").glob("*.md"))]


def python_blocks() -> list[tuple[str, str]]:
    """(document, code) of every ```python block of the README and of docs/."""
    return [(doc.name, code) for doc in DOCS for lang, code in fenced_blocks(doc) if lang == "python"]


def python_block(containing: str) -> str:
    """The one ```python block of the README or docs/ that contains ``containing``."""
    found = [code for _, code in python_blocks() if containing in code]
    assert len(found) == 1, f"{len(found)} python blocks of the README and docs/ contain {containing!r}"
    return found[0]


def fenced_blocks(doc: Path) -> list[tuple[str, str]]:
    """(language, code) of every fenced block of ``doc``, in order."""
    blocks, lang, code = [], None, []
    for line in doc.read_text().splitlines(keepends=True):
        if line.startswith("```"):
            if lang is None:
                lang, code = line[3:].strip(), []
            else:
                blocks.append((lang, "".join(code)))
                lang = None
        elif lang is not None:
            code.append(line)
    return blocks


def plain_block(containing: str, doc: Path = README) -> str:
    """The one ``` block without a language (commands, outputs) of ``doc`` that contains ``containing``."""
    found = [code for lang, code in fenced_blocks(doc) if not lang and containing in code]
    assert len(found) == 1, f"{len(found)} plain blocks of {doc.name} contain {containing!r}"
    return found[0]


def run_block(code: str, module_name: str) -> None:
    # a module name that is not importable: Spark's cloudpickle ships the example's classes by value
    exec(compile(code, "README.md", "exec"), {"__name__": module_name})  # noqa: S102
