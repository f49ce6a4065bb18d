"""A command that needs an extra the install lacks: exit 2 and the line to run, no traceback."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from scalelab.cli._extras import install_hint


def _without(modules: list[str], argv: list[str]) -> subprocess.CompletedProcess[str]:
    # A fresh interpreter where importing `modules` fails exactly as in an install without them
    # (None in sys.modules raises ModuleNotFoundError naming the module).
    code = textwrap.dedent(f"""
        import sys
        for m in {modules!r}:
            sys.modules[m] = None
        from scalelab.cli import run
        sys.exit(run({argv!r}))
    """)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)


def test_train_without_torch_names_the_extra() -> None:
    p = _without(["torch"], ["train", "--help"])
    assert p.returncode == 2, p.stderr
    assert "Traceback" not in p.stderr
    assert "this command needs torch" in p.stderr
    assert "pip install 'scalelab[torch]'" in p.stderr
    assert p.stdout == ""


def test_data_run_dask_without_dask_names_the_extra(tmp_path: Path) -> None:
    src = tmp_path / "in.csv"
    src.write_text("x\n1\n")
    p = _without(["dask", "dask.distributed", "distributed"],
                 ["data", "run", "--input", str(src), "--out", str(tmp_path / "o"),
                  "--engine", "dask"])
    assert p.returncode == 2, p.stderr
    assert "Traceback" not in p.stderr
    assert "pip install 'scalelab[dask]'" in " ".join(p.stderr.split())


@pytest.mark.parametrize(("module", "extra"), [
    ("torch.nn", "torch"), ("distributed", "dask"), ("faiss", "retrieval"),
    ("opentelemetry.sdk.trace", "trace"), ("gguf", "generate"),
])
def test_hint_names_the_extra(module: str, extra: str) -> None:
    hint = install_hint(module)
    assert hint is not None and f"pip install 'scalelab[{extra}]'" in hint


def test_no_hint_for_a_module_no_extra_brings() -> None:
    assert install_hint("numpy") is None and install_hint(None) is None
