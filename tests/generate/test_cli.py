"""`scalelab generate` through the CLI entry point, its docs, and the engine's metrics."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from gen_helpers import MODEL, TOK, prompts
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from scalelab.cli import run
from scalelab.generate.engine import Engine, EngineConfig
from scalelab.generate.metrics import EngineMetrics
from scalelab.generate.sequence import SamplingParams

DOCS = Path(__file__).resolve().parents[2] / "docs" / "generate.md"


def test_complete_json_is_one_document(capsys: pytest.CaptureFixture[str]) -> None:
    rc = run(["generate", "complete", "abc", "--model", "tiny", "--max-tokens", "5", "--json"])
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["model"] == "tiny-llama" and doc["prompt_tokens"] == 3
    assert doc["completion_tokens"] <= 5


def test_plain_weights_complete_like_packed(capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    texts = []
    for flag, packed in (("--packed-weights", torch.backends.mkldnn.is_available()),
                         ("--plain-weights", False)):
        assert run(["generate", "complete", "abc", "--model", "tiny", "--max-tokens", "8",
                    flag, "--weights", "fp32", "--json"]) == 0
        doc = json.loads(capsys.readouterr().out)
        assert doc["packed_weights"] is packed
        texts.append(doc["text"])
    assert texts[0] == texts[1] and texts[0]


def test_bad_model_is_exit_2() -> None:
    assert run(["generate", "complete", "x", "--model", "nope"]) == 2


def test_every_serve_flag_is_documented() -> None:
    from scalelab.cli.generate import app

    serve = app.commands["serve"]
    text = DOCS.read_text()
    for param in serve.params:
        for opt in param.opts:
            if opt.startswith("--"):
                assert f"`{opt}" in text or re.search(rf"{re.escape(opt)}\b", text), opt


def test_metrics_follow_the_engine() -> None:
    m = EngineMetrics("tiny")
    e = Engine(MODEL, TOK, EngineConfig(kv_cache_bytes=24 * 4 * 512, block_size=4,
                                        max_model_len=256, max_num_seqs=6), metrics=m)
    e.generate(prompts(6), SamplingParams(max_tokens=10, ignore_eos=True))
    text = generate_latest(m.registry).decode()

    def value(name: str) -> float:
        found = [s.value for f in text_string_to_metric_families(text) for s in f.samples
                 if s.name == name and s.labels == {"model_name": "tiny"}]
        assert len(found) == 1, name
        return float(found[0])

    assert value("vllm:num_preemptions_total") == e.scheduler.num_preemptions > 0
    assert value("vllm:iteration_tokens_total_count") == e.stats.steps
    assert value("vllm:iteration_tokens_total_sum") == sum(e.stats.tokens_per_step)
    assert value("vllm:generation_tokens_total") == 60
    assert value("vllm:time_to_first_token_seconds_count") == 6
    assert value("vllm:num_requests_running") == 0
    assert value("vllm:kv_cache_usage_perc") == 0.0
