"""The layering of docs/architecture.md ("Layers"), enforced: every module under ``src/spate`` (the library)
and ``src/spate_tools`` (the workshop) imports only modules of its own layer or of a more basic one, nothing in
the library imports ``spark/`` except ``spark/`` itself, the library never imports the workshop, and no modules
import each other in a cycle. Every import counts, also one inside a function (a lazy import is still a
dependency). And the library stays in rooms of one purpose with narrow signatures: no module over 500 lines, no
class over 300, no function taking more than 6 parameters by position."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"

# From the most basic up; a module may import its own layer and the layers before it. Each row is a row of the
# layer table of docs/architecture.md, in its order (the doc names every entry); a comment says why where the
# place is not obvious.
LAYERS: list[tuple[str, ...]] = [
    ("errors", "layout", "storage_paths", "file_counts", "objectstore", "report", "crc", "page_cache", "pacing",
     "write_behind", "local_file_io", "heap"),
    # basic: errors, paths (under a root, relative ones), file counts, S3 calls, tables, CRC-32, the page cache
    # (files out of it once written, into it ahead of a scan), a background job's bytes kept to a rate, local
    # files written back as they grow, a local checkpoint file's synced small writes and its ranges read once, the
    # heap around bulk phases
    ("frames",),  # the checksummed frame of every spate file: below fs, which re-exports part of it
    ("fs", "open_files"),  # a restore's ranged reads, each object-store file opened once
    ("segments",),  # logical files and their writers: used by snapshot/, changelog/, filemerging/, checkpoint/
    ("serde",),
    ("keygroups",),
    ("state",),
    ("snapshot",),
    ("sinks",),  # table sinks: data files staged by subtasks, committed by the driver; checkpoints name them
    ("changelog",),
    ("filemerging",),
    ("checkpoint",),
    ("runtime",),
    ("windows",),
    ("__init__",),  # the public API: re-exports of the layers above
    ("spark",),  # the Spark transport and the transformWithState drop-in: the library's top
    # The workshop (spate_tools): never imported by the library.
    ("tools",),  # the workshop package's docstring
    ("tools.campaigns", "tools.demo"),  # in-process jobs built on the public API (demo, fuzzing, driver races)
    ("tools.standalone", "tools.spark_demo", "tools.connect_server"),  # test clusters and servers; the demo on Spark
    ("tools.bench",),
    ("tools.cli",),  # the `spate` command: every command of the library and the workshop
]
WORKSHOP = "spate_tools"
ONLY_IMPORTERS_OF_SPARK = {"spark"}  # inside the library; the workshop may import it

# (importing module, imported module) -> why it is allowed although it goes up. Keep this short.
EXCEPTIONS: dict[tuple[str, str], str] = {}


def _rank() -> dict[str, int]:
    return {name: i for i, row in enumerate(LAYERS) for name in row}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _layer(module: str) -> str:
    parts = module.split(".")
    if parts[0] == WORKSHOP:
        return "tools." + parts[1] if len(parts) > 1 else "tools"
    return parts[1] if len(parts) > 1 else "__init__"


def _imports(path: Path) -> set[str]:
    """The spate modules ``path`` imports (``from spate.x import y`` names ``spate.x``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: relative import; spate uses absolute imports"
            found.add(node.module or "")
    return {name for name in found if name.split(".")[0] in ("spate", WORKSHOP)}


def _modules() -> dict[str, Path]:
    paths = sorted((SRC / "spate").rglob("*.py")) + sorted((SRC / WORKSHOP).rglob("*.py"))
    return {_module_name(p): p for p in paths}


def test_every_module_has_a_layer():
    rank = _rank()
    unplaced = sorted(m for m in _modules() if _layer(m) not in rank)
    assert not unplaced, f"place these in LAYERS (tests/test_layering.py) and docs/architecture.md: {unplaced}"


def _violations() -> list[str]:
    rank = _rank()
    found = []
    for module, path in _modules().items():
        mine = _layer(module)
        for target in sorted(_imports(path)):
            theirs = _layer(target)
            if (module, target) in EXCEPTIONS:
                continue
            if target.split(".")[0] == WORKSHOP and module.split(".")[0] != WORKSHOP:
                found.append(f"{module} imports {target}: the library never imports the workshop")
                continue
            if theirs not in rank or mine not in rank:
                continue
            if rank[theirs] > rank[mine]:
                found.append(f"{module} imports {target}: {mine} must not depend on the higher layer {theirs}")
            elif theirs == "spark" and mine not in ONLY_IMPORTERS_OF_SPARK and not mine.startswith("tools"):
                found.append(f"{module} imports {target}: nothing in the library imports spark/")
    return found


def test_imports_follow_the_layers():
    assert _violations() == []
    modules = _modules()
    stale = [pair for pair in EXCEPTIONS if pair[1] not in _imports(modules[pair[0]])]
    assert not stale, f"no longer imported, drop these exceptions: {stale}"



def _resolve(target: str, modules: dict[str, Path]) -> str | None:
    """The module ``target`` names, or its package (``from spate.x import y`` where ``y`` is a name)."""
    while target and target not in modules:
        target = target.rpartition(".")[0]
    return target or None


def test_no_import_cycles():
    modules = _modules()
    graph = {m: {t for t in (_resolve(x, modules) for x in _imports(p)) if t and t != m}
             for m, p in modules.items()}
    packages = {m for m, p in modules.items() if p.name == "__init__.py"}
    cycles, state = [], dict.fromkeys(graph, 0)  # 0 unseen, 1 on the path, 2 done

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for t in sorted(graph[m] - packages):  # a package's __init__ re-exports: importing it is not a cycle
            if state[t] == 1:
                cycles.append(path[path.index(t):] + [t] if t in path else [m, t])
            elif state[t] == 0:
                visit(t, path + [t])
        state[m] = 2

    for m in sorted(graph):
        if state[m] == 0:
            visit(m, [m])
    assert not cycles, f"import cycles: {cycles}"


def test_no_product_module_is_over_500_lines():
    long = {m: n for m, p in _modules().items()
            if m.split(".")[0] == "spate" and (n := len(p.read_text().splitlines())) > 500}
    assert not long, f"split these along their seams (docs/architecture.md): {long}"


MAX_CLASS_LINES = 300  # a library class, from its ``class`` line to its last line, docstrings included
MAX_POSITIONAL = 6  # parameters a library function takes by position (``self`` and ``cls`` not counted)


def _library_nodes() -> list[tuple[str, ast.AST]]:
    """(module, node) of every node of every library module."""
    return [(m, node) for m, p in _modules().items() if m.split(".")[0] == "spate"
            for node in ast.walk(ast.parse(p.read_text(), str(p)))]


def _positional(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    names = [a.arg for a in fn.args.posonlyargs + fn.args.args]
    return len(names) - (1 if names and names[0] in ("self", "cls") else 0)


def test_no_product_class_is_over_300_lines():
    long = {f"{m}.{node.name}": n for m, node in _library_nodes() if isinstance(node, ast.ClassDef)
            and (n := (node.end_lineno or node.lineno) - node.lineno + 1) > MAX_CLASS_LINES}
    assert not long, f"split these classes along their seams, into rooms of one purpose (not mixins): {long}"


def test_no_library_function_takes_more_than_6_positional_parameters():
    wide = {f"{m}.{node.name} (line {node.lineno})": n for m, node in _library_nodes()
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and (n := _positional(node)) > MAX_POSITIONAL}
    assert not wide, ("pass what belongs together as a typed object (a frozen dataclass built once where the values "
                      f"are known), or make the optional parameters keyword-only: {wide}")


def test_the_architecture_doc_names_every_layer():
    doc = (SRC.parent / "docs" / "architecture.md").read_text()
    missing = [name for row in LAYERS for name in row if f"`{name.removeprefix('tools.')}`" not in doc]
    assert not missing, f"docs/architecture.md does not name these layers of LAYERS: {missing}"
