"""Multi-turn sessions (lab/load/llm/sessions.py): each turn carries the conversation so far."""

from __future__ import annotations

import json

import pytest

from llmkit import llm_server
from scalelab.cli import run
from scalelab.layers.web.spawn import Spawned


def test_each_turn_sends_the_history_and_ttft_is_per_turn(
        capsys: pytest.CaptureFixture[str]) -> None:
    # The test server counts prompt tokens as words; its answers are max_tokens words (" t").
    with llm_server("--ttft-ms", "20", "--gap-ms", "1") as url:
        rc = run(["load", "llm", "sessions", url, "--users", "3", "--turns", "3",
                  "--think", "0s", "--turn-words", "10", "--output-tokens", "4", "--json"])
        cap = capsys.readouterr()
    assert rc == 0, cap.err
    doc = json.loads(cap.out)
    assert doc["schema_version"] == 1 and doc["prefix_cache_hit_rate"] is None
    # Turn k: k user messages of 10 words and k - 1 answers of 4 words.
    assert [lv["prompt_tokens_mean"] for lv in doc["levels"]] == [10.0, 24.0, 38.0]
    assert [lv["requests"] for lv in doc["levels"]] == [3, 3, 3]
    assert all(lv["failures"] == 0 and lv["ttft"]["p50_ms"] >= 19.9 for lv in doc["levels"])


def test_a_server_that_refuses_every_turn_fails_the_run(capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    with llm_server() as url:
        rc = run(["load", "llm", "sessions", url + "/v1/nothing/chat/completions",
                  "--users", "1", "--turns", "2", "--think", "0s"])
    assert rc == 2
    assert "every turn" in capsys.readouterr().err


def test_the_prefix_cache_of_generate_serve_hits_on_the_history(
        tiny_generate: Spawned, capsys: pytest.CaptureFixture[str]) -> None:
    url = tiny_generate.url
    rc = run(["load", "llm", "sessions", url, "--users", "2", "--turns", "3", "--think", "0s",
              "--output-tokens", "8", "--metrics-url", url + "/metrics", "--json"])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    doc = json.loads(cap.out)
    prompts = [lv["prompt_tokens_mean"] for lv in doc["levels"]]
    assert prompts == sorted(prompts) and prompts[0] < prompts[-1]
    # turns 2 and 3 reuse the earlier prompt (the hits are counted over this run's window)
    assert doc["prefix_cache_hit_rate"] > 0.2
