"""No function in src/scalelab is longer than 100 lines (read with ast: def line to last line)."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src" / "scalelab"
LIMIT = 100


def long_functions(src: Path, limit: int) -> list[tuple[str, str, int]]:
    """(file relative to src, function name, lines) of every function longer than `limit`."""
    found = []
    for path in sorted(src.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > limit:
                    found.append((path.relative_to(src).as_posix(), node.name, lines))
    return found


def test_the_walk_counts_a_function_from_def_to_its_last_line(tmp_path: Path) -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(100))
    (tmp_path / "m.py").write_text(f"def long():\n{body}\n\ndef short():\n    return 1\n")
    assert long_functions(tmp_path, LIMIT) == [("m.py", "long", 101)]


def test_no_function_is_longer_than_the_limit() -> None:
    found = long_functions(SRC, LIMIT)
    over = [f"{f}:{name} ({n} lines)" for f, name, n in found]
    assert over == [], "split these functions: " + ", ".join(over)
    assert len(list(SRC.rglob("*.py"))) > 200, "the walk found the source tree"
