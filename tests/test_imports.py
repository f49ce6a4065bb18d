"""The import graph of src/scalelab has no loop.

Read with ast, not by importing: every import at module level counts, including those under
`if TYPE_CHECKING:` (a loop there is still a loop in the design; the type checker follows it).
Imports inside functions are deliberate late imports and do not count.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src" / "scalelab"


def module_name(path: Path, src: Path) -> str:
    parts = list(path.relative_to(src.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_level(body: list[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    """The imports a module runs (or type-checks) when it loads, through if/try blocks."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If):
            yield from module_level(node.body)
            yield from module_level(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody, *(h.body for h in node.handlers)):
                yield from module_level(block)


def import_graph(src: Path) -> dict[str, set[str]]:
    """Module -> the project modules it imports at module level."""
    files = {module_name(p, src): p for p in src.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        out: set[str] = set()
        for node in module_level(ast.parse(path.read_text(encoding="utf-8")).body):
            if isinstance(node, ast.Import):
                out.update(a.name for a in node.names if a.name in files)
                continue
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            for alias in node.names:
                # `from pkg import mod` imports the module; `from mod import name` the module too.
                sub = f"{target}.{alias.name}"
                if sub in files:
                    out.add(sub)
                elif target in files:
                    out.add(target)
        out.discard(name)
        graph[name] = out
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One loop as a path that ends where it starts, or [] when there is none."""
    state: dict[str, int] = {}  # 1: on the current path, 2: finished
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        state[node] = 2
        path.pop()
        return []

    for start in sorted(graph):
        if start not in state:
            found = visit(start)
            if found:
                return found
    return []


def test_the_checker_finds_a_loop_and_a_clean_graph() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == []


def test_the_graph_reads_relative_and_type_checking_imports(tmp_path: Path) -> None:
    pkg = tmp_path / "scalelab"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from . import a\n")
    (pkg / "sub" / "a.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from scalelab.b import X\n")
    (pkg / "b.py").write_text("import os\n\ndef late():\n    from scalelab.sub import a\n")
    assert import_graph(pkg) == {"scalelab": set(), "scalelab.sub": {"scalelab.sub.a"},
                     "scalelab.sub.a": {"scalelab.b"}, "scalelab.b": set()}


def test_src_has_no_import_loop() -> None:
    graph = import_graph(SRC)
    assert len(graph) > 200, "the walk found the source tree"
    cycle = find_cycle(graph)
    assert cycle == [], "import loop: " + " -> ".join(cycle)
