"""llama.cpp's next-token predictions on the same GGUF file and ids, for `generate quality`.

They give the teacher-forced agreement of `generate quality --llamacpp`.

scalelab does not depend on llama-cpp-python: the predictions come from an interpreter that has
it (benchmarks/.venvs/llamacpp, `make llamacpp`), which runs llamacpp_logits.py beside this
file as a subprocess, or from the JSON document that script wrote earlier (`--llamacpp-save`).
"""

from __future__ import annotations

import json
import math
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scalelab.lab.core.errors import BadInputError, BadUsageError

CHILD = Path(__file__).with_name("llamacpp_logits.py")
HINT = "make llamacpp creates one (benchmarks/.venvs/llamacpp/bin/python)"


@dataclass(frozen=True)
class LlamaCppReference:
    """What llama.cpp predicted at every position of the windows it read."""

    source: str
    """The interpreter that ran it, or the file it was read from."""
    version: str
    """llama_cpp.__version__ of the run."""
    argmax: list[int]
    """llama.cpp's most likely next token at every position, the windows in order."""
    margin: list[float]
    """The gap between its two largest logits there (near 0: a near tie)."""
    perplexity: float
    """exp(mean NLL of the text's next tokens) under llama.cpp's logits."""


def _parse(doc: dict[str, Any], source: str, windows: list[list[int]]) -> LlamaCppReference:
    if doc.get("windows") != windows:
        raise BadInputError(f"--llamacpp {source}: it was computed for other token ids (another "
                            "text, tokenizer or window); write it again with --llamacpp-save")
    nll = [x for w in doc["nll"] for x in w]
    return LlamaCppReference(
        source=source, version=str(doc.get("llama_cpp", "?")),
        argmax=[int(x) for w in doc["argmax"] for x in w],
        margin=[float(x) for w in doc["margin"] for x in w],
        perplexity=math.exp(sum(nll) / len(nll)),
    )


def _run(python: Path, gguf: Path, windows: list[list[int]], threads: int) -> dict[str, Any]:
    request = json.dumps({"model": str(gguf), "threads": threads, "windows": windows})
    try:
        r = subprocess.run([str(python), str(CHILD)], input=request, capture_output=True,
                           text=True, timeout=600)
    except OSError as e:
        raise BadUsageError(f"--llamacpp {python}: cannot run it ({e.strerror}); pass a Python "
                            f"interpreter with llama-cpp-python or a saved JSON; {HINT}") from e
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["no message"])[-1]
        if "No module named 'llama_cpp'" in r.stderr:
            raise BadUsageError(f"--llamacpp {python}: it has no llama-cpp-python; {HINT}")
        raise BadInputError(f"--llamacpp {python}: llama.cpp failed on {gguf.name}: {last}")
    doc: dict[str, Any] = json.loads(r.stdout)
    return doc


def llamacpp_reference(
    spec: str, gguf: Path, windows: list[list[int]], *, threads: int,
    save: Path | None = None,
) -> LlamaCppReference:
    """llama.cpp's predictions over `windows` of the text's ids: `spec` is a Python interpreter
    with llama-cpp-python (run on `gguf` with `threads`), or a .json file an earlier run saved
    (its windows must be these). `save` writes what a run produced, for later reads."""
    path = Path(spec)
    if path.suffix == ".json":
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as e:
            raise BadInputError(f"--llamacpp {spec}: cannot read it ({e}); write it with "
                                "--llamacpp PYTHON --llamacpp-save FILE") from e
        return _parse(doc, spec, windows)
    doc = _run(path, gguf, windows, threads)
    if save is not None:
        save.write_text(json.dumps(doc, separators=(",", ":")) + "\n", encoding="utf-8")
    return _parse(doc, spec, windows)
