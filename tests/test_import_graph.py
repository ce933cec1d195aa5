"""No import circles in src/: the module import graph of every package under src/ is acyclic.

What counts as an import (the same edges import-linter's graph has): every `import` and
`from ... import` statement of a module, wherever it stands: at module level, inside a function
(a lazy import) and under `if TYPE_CHECKING:`. A lazy or type-only import does not run at import
time, but it is still a dependency: the circle is in the design either way, and a lazy import is
exactly how circles hide. `from package import name` is an edge to `package.name` when that is a
module, else to `package` (its `__init__`); a module's own parent package is not an edge.
Imports of modules outside src/ (the standard library, third-party packages) are not edges.

A circle is broken by moving the shared thing to where it belongs (a constant to the module that
owns it, a registry the lower module calls through), never by making the import lazy.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"


def modules(src: Path) -> dict[str, Path]:
    """Every module of every package under `src` (a top-level directory with __init__.py)."""
    found: dict[str, Path] = {}
    for path in sorted(src.rglob("*.py")):
        parts = path.relative_to(src).with_suffix("").parts
        if not (src / parts[0] / "__init__.py").exists():
            continue
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _known(name: str, known: Mapping[str, Path]) -> str | None:
    """The longest prefix of the dotted `name` that is one of our modules."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def imported_by(name: str, path: Path, known: Mapping[str, Path]) -> set[str]:
    """The modules of `known` that the module `name` (at `path`) imports, anywhere in it."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = _known(alias.name, known)
                if target is not None:
                    found.add(target)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            for alias in node.names:
                target = f"{module}.{alias.name}"
                if target not in known:
                    target = _known(module, known) or ""
                if target:
                    found.add(target)
    found.discard(name)
    return found


def import_graph(src: Path) -> dict[str, set[str]]:
    known = modules(src)
    return {name: imported_by(name, path, known) for name, path in known.items()}


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in graph:
                    continue
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component: list[str] = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return sorted(found)


def _describe(graph: Mapping[str, set[str]], component: list[str]) -> str:
    members = set(component)
    edges = [f"    {a} -> {b}" for a in component for b in sorted(graph[a] & members)]
    return f"  circle of {len(component)} modules:\n" + "\n".join(edges)


def test_src_has_no_import_circles() -> None:
    graph = import_graph(SRC)
    assert "gpu_operator.controller.clusterpolicy" in graph  # the walk found the tree
    found = cycles(graph)
    assert not found, "import circles in src/ (break them by moving the shared thing):\n" + (
        "\n".join(_describe(graph, c) for c in found)
    )


def _tree(tmp_path: Path, files: Mapping[str, str]) -> Path:
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_the_checker_sees_lazy_type_only_and_relative_imports(tmp_path: Path) -> None:
    src = _tree(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "from pkg import b\n",
            "pkg/b.py": "def f():\n    from . import c\n",
            "pkg/c.py": (
                "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import X\n"
            ),
            "pkg/d.py": "import pkg.a\nimport os\n",
            "other/__init__.py": "from other.sub import thing\n",
            "other/sub.py": "thing = 1\n",
        },
    )
    graph = import_graph(src)
    assert graph["pkg.a"] == {"pkg.b"}
    assert graph["pkg.b"] == {"pkg.c"}
    assert graph["pkg.c"] == {"pkg.a"}
    assert graph["pkg.d"] == {"pkg.a"}
    assert graph["other"] == {"other.sub"}
    assert graph["other.sub"] == set()
    assert cycles(graph) == [["pkg.a", "pkg.b", "pkg.c"]]


def test_the_checker_passes_a_tree_without_circles(tmp_path: Path) -> None:
    src = _tree(
        tmp_path,
        {
            "pkg/__init__.py": "from pkg.a import A\n",
            "pkg/a.py": "from pkg import b\nA = b.B\n",
            "pkg/b.py": "B = 1\n",
        },
    )
    assert cycles(import_graph(src)) == []
