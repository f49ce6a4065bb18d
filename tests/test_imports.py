"""The import graph of src/scalelab has no loop, and its rooms import only downward.

Read with ast, not by importing: every import counts wherever it stands, at module level, under
`if TYPE_CHECKING:` or inside a function (a late import saves start-up time; a loop through one
is still a loop in the design).

The layering rule, by room (`lab/core`, `lab/load`, `lab/autoscale`, `lab/diagnose`,
`lab/report`, each `system/<part>`, each `layers/<layer>`, `cli`):

- `lab/core` (laws, fits, records, objectives, the verdict) imports nothing of the tree outside
  itself: every other room builds on it, records flow through it.
- The shared layers (`layers/*`) import `lab/core` and each other, nothing of `lab/load`,
  `lab/autoscale`, `lab/diagnose`, `lab/report`, `system/*` or `cli`.
- A part of the reference system (`system/<part>`) imports `lab/core` and the layers, never
  another part (parts meet through files on disk: datasets, models, records), nor the rest of
  the lab, nor `cli`.
- The lab (`lab/load`, `lab/autoscale`, `lab/diagnose`, `lab/report`) imports `lab/core`, the
  layers and itself, never a `system` part: it measures the reference system through its
  commands and files, as it measures a user's.
- Only `cli` (and `__main__`) import `cli`. The package root (`scalelab`: its version) is
  open to all.

`EXCEPTIONS` lists the imports that break the rule today, each with why and where it belongs;
a new one fails the test.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src" / "scalelab"


def module_name(path: Path, src: Path) -> str:
    parts = list(path.relative_to(src.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def every_import(tree: ast.Module) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement in the module, wherever it stands."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node


def import_graph(src: Path) -> dict[str, set[str]]:
    """Module -> the project modules it imports (anywhere in it)."""
    files = {module_name(p, src): p for p in src.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        out: set[str] = set()
        for node in every_import(ast.parse(path.read_text(encoding="utf-8"))):
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


def room(module: str) -> str:
    """scalelab.lab.core.fits -> lab.core; scalelab.system.serve.app -> system.serve;
    scalelab.cli.load -> cli; scalelab -> '' (the package root)."""
    parts = module.split(".")[1:]
    if parts and parts[0] in ("lab", "system", "layers"):
        return ".".join(parts[:2])
    return parts[0] if parts else ""


def forbidden(src: str, dst: str) -> bool:
    """Whether room `src` may not import room `dst` (the rule in the module docstring)."""
    if src == dst or dst == "":
        return False
    if dst in ("cli", "__main__"):
        return src not in ("cli", "__main__")
    if src == "lab.core":
        return True
    top, dtop = src.partition(".")[0], dst.partition(".")[0]
    if top in ("layers", "system", "lab"):
        return not (dst == "lab.core" or dtop == "layers" or (top == "lab" and dtop == "lab"))
    return False


EXCEPTIONS = {
    ("scalelab.lab.load.llm.dataset", "scalelab.system.generate.gguf"):
        "`load llm --tokenizer smollm2|FILE.gguf` counts tokens with the GGUF's tokenizer (a late "
        "import); the GGUF tokenizer reader belongs in layers/nets beside the Llama architecture",
}


def layering_violations(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{m} imports {d} ({room(m)} -> {room(d)})" for m, out in graph.items()
                  for d in out if forbidden(room(m), room(d)) and (m, d) not in EXCEPTIONS)


def test_the_checker_finds_a_loop_and_a_clean_graph() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == []


def test_the_layering_rule_in_cases() -> None:
    ok = [("lab.diagnose", "lab.load"), ("lab.load", "layers.web"),
          ("system.serve", "lab.core"), ("system.serve", "layers.nets"),
          ("layers.nets", "layers.lineage"), ("cli", "system.data"), ("layers.web", "lab.core"),
          ("system.generate", ""), ("lab.autoscale", "lab.load"),
          ("lab.diagnose", "lab.autoscale"), ("cli", "lab.autoscale")]
    bad = [("lab.core", "lab.autoscale"), ("layers.deploy", "lab.autoscale"),
           ("lab.autoscale", "system.serve"), ("lab.core", "lab.load"), ("lab.core", "layers.nets"),
           ("system.serve", "system.data"), ("system.serve", "lab.load"),
           ("layers.nets", "system.serve"), ("layers.web", "lab.load"),
           ("lab.diagnose", "system.serve"), ("lab.report", "cli"), ("system.data", "cli")]
    assert [p for p in ok if forbidden(*p)] == []
    assert [p for p in bad if not forbidden(*p)] == []
    assert room("scalelab.lab.core.fits") == "lab.core" and room("scalelab.cli.load") == "cli"
    graph = {"scalelab.lab.core.a": {"scalelab.system.serve.b"}, "scalelab.system.serve.b": set()}
    assert layering_violations(graph) == [
        "scalelab.lab.core.a imports scalelab.system.serve.b (lab.core -> system.serve)"]


def test_the_graph_reads_relative_and_type_checking_imports(tmp_path: Path) -> None:
    pkg = tmp_path / "scalelab"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from . import a\n")
    (pkg / "sub" / "a.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from scalelab.b import X\n")
    (pkg / "b.py").write_text("import os\n\ndef late():\n    from scalelab.sub import a\n")
    assert import_graph(pkg) == {"scalelab": set(), "scalelab.sub": {"scalelab.sub.a"},
                                 "scalelab.sub.a": {"scalelab.b"},
                                 "scalelab.b": {"scalelab.sub.a"}}  # the late import counts


def test_src_has_no_import_loop() -> None:
    graph = import_graph(SRC)
    assert len(graph) > 200, "the walk found the source tree"
    cycle = find_cycle(graph)
    assert cycle == [], "import loop: " + " -> ".join(cycle)


def test_src_obeys_the_layering_rule() -> None:
    assert layering_violations(import_graph(SRC)) == []
