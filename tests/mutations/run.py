"""Our own mutation check: break one source line a guarantee rests on, run the tests the README
names for it, and see them fail.

    python tests/mutations/run.py [--only NAME ...] [--list] [--baseline] [--timeout S]

Each mutation in `mutations.py` is (name, file, the line as it is, the line broken, the test ids
that must catch it). The tree (tracked and untracked, not ignored) is copied once to a temporary
directory; each mutation is applied there alone, its tests run (`pytest -x -n 0`, the copy's
`src` first on the path), and the line restored. A checkout anyone uses is never touched.
Lines are found by their text (stripped of surrounding space), not by number, so the list
survives edits around them; a line that is no longer there (or is there twice) is reported as
"stale", never guessed at. Prints a Markdown table: mutation, file, tests, result (caught,
MISSED, stale, error: pytest could not run them), seconds. Exit 1 if any was missed or stale.
It does not run in CI (minutes to an hour on 2 cores); docs/reliability.md has its last table.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from mutations import MUTATIONS, Mutation

ROOT = Path(__file__).resolve().parents[2]


def copy_tree(dest: Path) -> None:
    """The working tree as git sees it (tracked and untracked, ignored files left out)."""
    names = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           cwd=ROOT, check=True, capture_output=True).stdout.split(b"\0")
    for raw in names:
        if not raw:
            continue
        rel = raw.decode()
        src = ROOT / rel
        if not src.is_file():
            continue  # deleted in the work tree, or a submodule
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest / rel)


def apply(tree: Path, m: Mutation) -> str | None:
    """Apply `m` in `tree`; returns the original text to restore, or None when the line is not
    there exactly once."""
    path = tree / m.file
    text = path.read_text()
    lines = text.splitlines(keepends=True)
    hits = [i for i, ln in enumerate(lines) if ln.strip() == m.line.strip()]
    if len(hits) != 1:
        return None
    i = hits[0]
    indent = lines[i][: len(lines[i]) - len(lines[i].lstrip())]
    lines[i] = indent + m.mutated.strip() + "\n"
    path.write_text("".join(lines))
    return text


def run_tests(tree: Path, tests: tuple[str, ...], timeout_s: float) -> tuple[str, float]:
    env = dict(os.environ, PYTHONPATH=str(tree / "src"), PYTHONDONTWRITEBYTECODE="1")
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-n", "0", "-p", "no:cacheprovider",
           "-m", "", *tests]
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True,
                           timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return "caught (timeout)", time.monotonic() - t0
    dt = time.monotonic() - t0
    # pytest: 0 all passed, 1 some failed; anything else (2 interrupted, 4 usage, 5 no tests)
    # means the tests did not run, which catches nothing.
    if p.returncode == 0:
        summary = p.stdout.strip().splitlines()[-1] if p.stdout.strip() else ""
        # a skipped test holds nothing: say so rather than count it as run
        return ("MISSED (skipped: " + summary + ")" if "skipped" in summary else "MISSED"), dt
    if p.returncode == 1:
        return "caught", dt
    tail = (p.stdout + p.stderr).strip().splitlines()[-3:]
    return f"error (pytest exit {p.returncode}: {' / '.join(tail)})", dt


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", default=None, help="mutation names to run")
    ap.add_argument("--list", action="store_true", help="list the mutations and exit")
    ap.add_argument("--baseline", action="store_true",
                    help="first run every named test on the unmutated copy (must pass)")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per mutation")
    a = ap.parse_args()
    chosen = [m for m in MUTATIONS if a.only is None or m.name in a.only]
    if a.list:
        for m in chosen:
            print(f"{m.name}: {m.file}: {m.line.strip()!r} -> {m.mutated.strip()!r}")
        return 0
    bad = 0
    with tempfile.TemporaryDirectory(prefix="scalelab-mutations-") as tmp:
        tree = Path(tmp)
        copy_tree(tree)
        if a.baseline:
            tests = tuple(dict.fromkeys(t for m in chosen for t in m.tests))
            result, dt = run_tests(tree, tests, a.timeout * 2)
            print(f"baseline (unmutated): {'passed' if result.startswith('MISSED') else result} "
                  f"in {dt:.0f} s", flush=True)
            if result != "MISSED":  # failed, or passed only by skipping
                return 1
        print("| mutation | file | line → broken | tests | result | s |")
        print("|---|---|---|---|---|---|", flush=True)
        for m in chosen:
            original = apply(tree, m)
            if original is None:
                result, dt = "stale (line not found exactly once)", 0.0
            else:
                try:
                    result, dt = run_tests(tree, m.tests, a.timeout)
                finally:
                    (tree / m.file).write_text(original)
            bad += not result.startswith("caught")
            tests = ", ".join(f"`{t}`" for t in m.tests)
            print(f"| {m.name} | `{m.file}` | `{m.line.strip()}` → `{m.mutated.strip()}` | "
                  f"{tests} | {result} | {dt:.0f} |", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
