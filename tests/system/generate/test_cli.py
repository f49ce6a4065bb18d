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
from scalelab.system.generate.engine import LlmEngine, LlmEngineConfig
from scalelab.system.generate.metrics import EngineMetrics
from scalelab.system.generate.sequence import SamplingParams

DOCS = Path(__file__).resolve().parents[3] / "docs" / "generate.md"
VLLM_NAMES = {f"vllm:{n}" for n in (
    "num_requests_running", "num_requests_waiting", "kv_cache_usage_perc",
    "prefix_cache_queries", "prefix_cache_hits", "num_preemptions", "prompt_tokens",
    "generation_tokens", "request_success", "request_prompt_tokens",
    "request_generation_tokens", "iteration_tokens_total", "request_max_num_generation_tokens",
    "request_params_n", "request_params_max_tokens", "time_to_first_token_seconds",
    "inter_token_latency_seconds", "request_time_per_output_token_seconds",
    "e2e_request_latency_seconds", "request_queue_time_seconds",
    "request_inference_time_seconds", "request_prefill_time_seconds",
    "request_decode_time_seconds", "spec_decode_num_drafts", "spec_decode_num_draft_tokens",
    "spec_decode_num_accepted_tokens")}
"""vLLM's metric names (vllm/v1/metrics/loggers.py, vllm/v1/spec_decode/metrics.py), as
metric families (counters without `_total`)."""


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
    m = EngineMetrics("tiny", max_model_len=256)
    e = LlmEngine(MODEL, TOK, LlmEngineConfig(kv_cache_bytes=24 * 4 * 512, block_size=4,
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
    # vLLM's per-request histograms: one observation per request, exact token sums
    plen = sum(len(p) for p in prompts(6))
    assert value("vllm:prompt_tokens_total") == plen
    assert value("vllm:request_prompt_tokens_count") == 6
    assert value("vllm:request_prompt_tokens_sum") == plen
    assert value("vllm:request_generation_tokens_sum") == 60
    assert value("vllm:request_params_max_tokens_sum") == 60
    for h in ("request_prefill_time_seconds", "request_decode_time_seconds",
              "request_inference_time_seconds", "e2e_request_latency_seconds",
              "request_time_per_output_token_seconds"):
        assert value(f"vllm:{h}_count") == 6, h
    assert value("vllm:prefix_cache_queries_total") == e.blocks.stats.query_tokens > plen
    assert value("vllm:prefix_cache_hits_total") == e.blocks.stats.hit_tokens
    assert re.search(r'^vllm:request_success_total\{finished_reason="length",model_name="tiny"'
                     r'\} 6\.0$', text, re.M)
    les = re.findall(r'^vllm:request_prompt_tokens_bucket\{le="([^"]+)"', text, re.M)
    assert les == ["1.0", "2.0", "5.0", "10.0", "20.0", "50.0", "100.0", "200.0", "+Inf"]
    # only names vLLM itself publishes carry its prefix (vllm/v1/metrics/loggers.py)
    ours = {f.name.removesuffix("_created") for f in text_string_to_metric_families(text)
            if f.name.startswith("vllm:")}
    assert ours <= VLLM_NAMES, ours - VLLM_NAMES
    assert "# TYPE scalelab_step_duration_seconds histogram" in text
