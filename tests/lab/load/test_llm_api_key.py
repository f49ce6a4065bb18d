"""`load llm` against `scalelab generate serve --api-key` (tiny model, a real uvicorn process):
the key from --api-key or $OPENAI_API_KEY reaches /v1/models and every stream, a missing key
exits 1 with its cause, and the key is in no output: stdout, stderr, records."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmkit import generate_server
from scalelab.cli import run
from scalelab.lab.core.records import read_records
from scalelab.layers.web.spawn import Spawned

KEY = "sk-test-4f9b2c71d0"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Spawned]:
    log = tmp_path_factory.mktemp("gen") / "server.log"
    with generate_server(log, "--max-num-seqs", "2", "--max-model-len", "256",
                         "--kv-cache-bytes", "4MiB", "--block-size", "8", "--api-key", KEY,
                         unset=["SCALELAB_API_KEY"]) as s:
        yield s


ARGS = ["--concurrency", "1", "--requests", "2", "--warmup", "0s", "--prompt-tokens",
        "fixed:8", "--output-tokens", "fixed:4"]


def test_a_missing_key_exits_1_with_its_cause(server: Spawned,
                                              monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    assert run(["load", "llm", server.url, *ARGS, "--json"]) == 1
    out = capsys.readouterr()
    assert json.loads(out.out)["levels"][0]["errors_by_status"] == {"401": 2}
    assert out.err.strip() == ("every request failed (2 sent): 401: the server wants "
                               "credentials; pass --api-key or set OPENAI_API_KEY")


@pytest.mark.parametrize("how", ["flag", "env"])
def test_the_key_is_sent_and_never_written(server: Spawned, how: str, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    recs = tmp_path / "r.jsonl"
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    flags = ["--api-key", KEY] if how == "flag" else []
    if how == "env":
        monkeypatch.setenv("OPENAI_API_KEY", KEY)
    assert run(["load", "llm", server.url, *ARGS, *flags, "--records", str(recs),
                "--json"]) == 0
    out = capsys.readouterr()
    doc = json.loads(out.out)
    lv = doc["levels"][0]
    assert (lv["successes"], lv["failures"]) == (2, 0)
    # The model name came from GET /v1/models, which needs the key too ("default" without).
    (rec,) = read_records(recs)
    assert rec.extras["model"] == "tiny-llama"
    assert doc["headers"] == ["Authorization"]
    for text in (out.out, out.err, recs.read_text()):
        assert KEY not in text
