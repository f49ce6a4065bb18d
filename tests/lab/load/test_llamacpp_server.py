"""scalelab against llama.cpp's Python server (llama-cpp-python[server], `python -m
llama_cpp.server`) on SmolLM2-135M's Q4_1 GGUF, on 127.0.0.1: a generation server nobody here
wrote, each answer held to a truth measured without scalelab.

- `load llm`: every stream answered, and its output tokens those the server's own `usage`
  gives for the same requests (the test asks it directly, not streaming).
- `diagnose` on `stages.llm.url`: the server serves one request at a time (one lock around its
  one llama.cpp context: its documentation, and its own timings here). By default it interrupts
  the running stream when a new request arrives, so 2 concurrent streams cut each other short;
  with `--interrupt_requests False` they queue, and each extra stream waits one service time.
  Either way scalelab must name that limit with its number.

All `slow` (tens of seconds on a busy 2-core machine; the venv: `make llamacpp`). Bounded:
a few dozen requests of at most 8 output tokens.
"""

from __future__ import annotations

import json
import re
import statistics
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from llamacpp_kit import llamacpp_server, server_timings
from scalelab.cli import run
from stagekit import stages_yaml

pytestmark = pytest.mark.slow

# One answer runs to max_tokens, the other ends on EOS before it: counting must follow the
# server, not max_tokens.
LONG = "Write a long story about a lighthouse keeper and the sea."
SHORT = "Answer with one word, yes or no: is the sky blue?"


def usage(url: str, prompt: str, max_tokens: int) -> dict[str, int]:
    """The server's own token counts for the request `load llm` sends (not streamed)."""
    body = json.dumps({"model": "smollm2", "max_tokens": max_tokens, "temperature": 0,
                       "messages": [{"role": "user", "content": prompt}]}).encode()
    req = urllib.request.Request(url + "/v1/chat/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        doc = json.loads(r.read())
    out: dict[str, int] = doc["usage"]
    return out


@pytest.mark.parametrize(("prompt", "max_tokens"), [(LONG, 8), (SHORT, 16)])
def test_load_llm_counts_the_tokens_the_server_says_it_sent(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], prompt: str,
        max_tokens: int) -> None:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text(prompt + "\n")
    n = 6
    with llamacpp_server(tmp_path / "server.log") as s:
        truth = usage(s.url, prompt, max_tokens)
        code = run(["load", "llm", "run", s.url, "--concurrency", "1", "--requests", str(n),
                    "--warmup", "0s", "--prompts", str(prompts), "--distinct", "1",
                    "--output-tokens", f"fixed:{max_tokens}", "--json"])
    out = capsys.readouterr()
    assert code == 0, out.err
    lv = json.loads(out.out)["levels"][0]
    assert (lv["successes"], lv["failures"]) == (n, 0)
    assert lv["errors_by_status"] == {} and lv["errors_by_kind"] == {}
    # Greedy, one prompt: each of the n streams is the answer the server counted in `usage`.
    assert lv["output_tokens"] == n * truth["completion_tokens"]
    if max_tokens == 16:
        assert truth["completion_tokens"] < max_tokens  # the short answer really ended on EOS
    else:
        assert truth["completion_tokens"] == max_tokens


def _diagnose(tmp_path: Path, url: str, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    cfg = tmp_path / "scalelab.yaml"
    cfg.write_text(stages_yaml({"llm": f"""{{url: "{url}", levels: [1, 2, 4, 8], requests: 16,
  capacity: false, quality_probe: 0, output_tokens: "fixed:8", prompt_tokens: "fixed:8",
  shared_prefix: 0}}"""}) + "budget: null\n")
    run(["diagnose", "--config", str(cfg), "--out", str(tmp_path / "out"), "--json"])
    out = capsys.readouterr()
    assert out.out, out.err
    doc: dict[str, Any] = json.loads(out.out)
    return next(s for s in doc["verdict"]["stages"] if s["stage"] == "llm")


def test_diagnose_names_a_server_that_interrupts_its_stream_one_request_at_a_time(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with llamacpp_server(tmp_path / "server.log") as s:
        st = _diagnose(tmp_path, s.url, capsys)
    # Availability (99% by default) is missed at 2 streams, where they cut each other short.
    assert st["miss"]["multiple"] == 2.0
    by = {e["resource"]: e["evidence"] for e in st["limiting"]}
    line = by["one request at a time (inferred)"]
    print(line)
    assert line.startswith("no stream cut short at concurrency=1; ")
    assert "cut short or empty at concurrency=2" in line


def test_diagnose_names_one_slot_and_the_queue_of_a_server_that_serves_in_turn(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "server.log"
    with llamacpp_server(log, "--interrupt_requests", "False") as s:
        st = _diagnose(tmp_path, s.url, capsys)
    by = {e["resource"]: e["evidence"] for e in st["limiting"]}
    # one slot: the served rate past the knee over one stream's rate rounds to 1 (where the
    # knee falls moves with the machine's noise; the count does not)
    assert by["slots (inferred)"].startswith("one request at a time: ")
    # The server's own timings: llama.cpp's compute per request (its perf lines); in a closed
    # loop each stream in front of another adds about that much to its wait, as scalelab
    # inferred from TTFT (measured: 1.02-1.04x). 16 requests a level: with as many requests as
    # streams a level is one round, which sees the queue fill, not its steady length.
    queue = by["queue (inferred)"]
    m = re.search(r": \+([0-9.]+(?:e[+-]?[0-9]+)?) ms per extra stream", queue)
    assert m is not None, queue
    served = statistics.median(server_timings(log))
    print(f"llama.cpp's own compute per request (median) {served:.3g} ms; "
          f"{by['slots (inferred)']}; {queue}")
    assert 0.5 * served <= float(m[1]) <= 2.0 * served, (served, queue)
