"""`load llm --tokenizer`: a stream that reports no usage is counted with the model's tokenizer
(exact where the chunks carry several tokens), and without one the count is said to be an
estimate; the output says which."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from llmkit import llm_server as start_llm_server
from scalelab.cli import run


@pytest.fixture
def llm_server() -> Iterator[Callable[..., str]]:
    with contextlib.ExitStack() as stack:
        yield lambda *args: stack.enter_context(start_llm_server(*args))


def _tokenizer(tmp_path: Path) -> Path:
    # The test server's tokens are each " t": a word-level tokenizer counts one per token.
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "t": 1}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    return tmp_path


def _level(args: list[str], capsys: pytest.CaptureFixture[str]) -> dict:
    assert run(args) == 0
    return json.loads(capsys.readouterr().out)["levels"][0]


def test_no_usage_counted_with_the_tokenizer_or_estimated_per_chunk(
        llm_server: Callable[..., str], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    # 7 tokens a stream, 3 a chunk: chunks of 3, 3, 1 — no usage asked for.
    url = llm_server("--ttft-ms", "5", "--gap-ms", "2", "--tokens-per-chunk", "3")
    args = ["load", "llm", url, "--concurrency", "1", "--requests", "4", "--warmup", "0s",
            "--output-tokens", "7", "--usage", "none", "--json"]
    lv = _level([*args, "--tokenizer", str(_tokenizer(tmp_path))], capsys)
    assert (lv["output_tokens"], lv["token_sources"]) == (28, {"tokenizer": 4})
    assert any("counted with the model's tokenizer" in n for n in lv["notes"])
    # Without it: one token per chunk (3 chunks a stream), said to be an estimate.
    lv = _level(args, capsys)
    assert (lv["output_tokens"], lv["token_sources"]) == (12, {"chunks": 4})
    assert any("token counts are estimated: one per chunk" in n for n in lv["notes"])


def test_a_bad_tokenizer_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["load", "llm", "http://127.0.0.1:9", "--concurrency", "1", "--requests", "1",
                "--tokenizer", str(tmp_path / "none")]) == 2
    assert "no tokenizer.json there" in capsys.readouterr().err
