"""llama.cpp's predictions for `generate quality --llamacpp` (generate.llamacpp): read from a
saved file, or from an interpreter run as a subprocess; every mistake one line, exit 2.
(The run against llama.cpp itself: tests/system/generate/test_llamacpp_quality.py, slow.)"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

from scalelab.cli import run
from scalelab.lab.core.errors import BadInputError, BadUsageError
from scalelab.system.generate.llamacpp import llamacpp_reference

WINDOWS = [[1, 5, 7], [7, 2]]


def saved(tmp_path: Path, windows: list[list[int]]) -> Path:
    """A reference as llamacpp_logits.py writes it: per window, one value per position."""
    f = tmp_path / "ref.json"
    f.write_text(json.dumps({"model": "m.gguf", "windows": windows, "llama_cpp": "0.3.36",
                             "threads": 1, "argmax": [[5, 9], [2]], "margin": [[0.5, 0.01],
                                                                               [2.0]],
                             "nll": [[math.log(2), math.log(4)], [math.log(8)]]}))
    return f


def test_a_saved_reference_reads_back_flat_with_its_perplexity(tmp_path: Path) -> None:
    ref = llamacpp_reference(str(saved(tmp_path, WINDOWS)), Path("m.gguf"), WINDOWS, threads=1)
    assert ref.argmax == [5, 9, 2] and ref.margin == [0.5, 0.01, 2.0]
    assert ref.perplexity == pytest.approx(4.0)  # exp(mean(ln 2, ln 4, ln 8))
    assert ref.version == "0.3.36"


def test_a_reference_for_other_ids_is_refused(tmp_path: Path) -> None:
    f = saved(tmp_path, [[1, 5, 7], [7, 3]])
    with pytest.raises(BadInputError, match="computed for other token ids"):
        llamacpp_reference(str(f), Path("m.gguf"), WINDOWS, threads=1)


def test_an_interpreter_without_llama_cpp_is_named_with_the_fix(tmp_path: Path) -> None:
    # This interpreter (the project's venv) has no llama-cpp-python: the project never needs it.
    with pytest.raises(BadUsageError, match="it has no llama-cpp-python; make llamacpp"):
        llamacpp_reference(sys.executable, tmp_path / "m.gguf", WINDOWS, threads=1)
    with pytest.raises(BadUsageError, match="cannot run it"):
        llamacpp_reference(str(tmp_path / "no-python"), tmp_path / "m.gguf", WINDOWS, threads=1)


@pytest.mark.parametrize(("args", "said"), [
    (["--model", "tiny", "--llamacpp", "x.json"], "--llamacpp needs a GGUF model"),
    (["--model", "tiny", "--llamacpp-save", "x.json"], "--llamacpp-save needs --llamacpp"),
])
def test_cli_mistakes_exit_2_in_one_line(args: list[str], said: str,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["generate", "quality", "--weights", "q4", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and said in err
