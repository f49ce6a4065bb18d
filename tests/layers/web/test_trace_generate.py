"""The generative server (tiny model, real uvicorn on 127.0.0.1 in a thread) with tracing:
admission, queue, prefill and decode under one request span with gen_ai.* attributes, for a
whole answer and a stream; a client's traceparent keeps its trace id."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from inproc import serving

from scalelab.layers.nets.llama import build_tiny
from scalelab.layers.observe.traces import Trace, assemble, read_spans
from scalelab.layers.web.trace import TraceConfig
from scalelab.system.generate.app import ApiSettings, build_app
from scalelab.system.generate.engine import LlmEngine, LlmEngineConfig
from scalelab.system.generate.tokenizer import byte_tokenizer

CLIENT_TRACE = "5bf92f3577b34da6a3ce929d0e0e4737"
PROMPT = "the quick brown fox"


@pytest.fixture(scope="module")
def gen(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Any, Path]]:
    out = tmp_path_factory.mktemp("gen-trace") / "spans.jsonl"
    engine_cfg = {"kv_cache_bytes": 1 << 20, "block_size": 4, "max_model_len": 256}
    settings = ApiSettings(model="tiny", engine=engine_cfg,
                           trace=TraceConfig(sample=1.0, out=str(out)))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the tiny model's ops are microseconds: threads only hand off
    engine = LlmEngine(build_tiny(seed=1), byte_tokenizer(), LlmEngineConfig(**engine_cfg),
                       name="tiny-llama")
    app = build_app(settings, engine)
    try:
        with serving(app) as url:
            yield url, app, out
    finally:
        torch.set_num_threads(threads)


def traces(app: Any, out: Path) -> dict[str, Trace]:
    app.state.tracing.flush()
    return {t.trace_id: t for t in assemble(read_spans([out]))}


def test_one_completion_one_trace(gen: tuple[str, Any, Path]) -> None:
    url, app, out = gen
    r = httpx.post(f"{url}/v1/completions", timeout=60, json={
        "model": "tiny-llama", "prompt": PROMPT, "max_tokens": 6, "ignore_eos": True},
        headers={"traceparent": f"00-{CLIENT_TRACE}-00f067aa0ba902b7-01"})
    assert r.status_code == 200, r.text
    t = traces(app, out)[CLIENT_TRACE]
    by = {s.name: s for s in t.spans}
    assert sorted(by) == ["admission", "decode", "prefill", "queue", "text_completion tiny-llama"]
    root = by["text_completion tiny-llama"]
    assert r.headers["traceparent"] == f"00-{CLIENT_TRACE}-{root.span_id}-01"
    assert all(s.parent_id == root.span_id for s in t.spans if s is not root)
    a = root.attributes
    n_prompt = len(PROMPT.encode())  # the byte tokenizer: one token per byte
    assert (a["gen_ai.operation.name"], a["gen_ai.request.model"]) == ("text_completion",
                                                                        "tiny-llama")
    assert (a["gen_ai.usage.input_tokens"], a["gen_ai.usage.output_tokens"]) == (n_prompt, 6)
    assert a["gen_ai.response.finish_reasons"] == ["length"]
    assert a["gen_ai.response.id"] == r.json()["id"] and a["gen_ai.request.max_tokens"] == 6
    assert by["decode"].attributes["gen_ai.usage.output_tokens"] == 6
    order = [by[n] for n in ("admission", "queue", "prefill", "decode")]
    assert [s.start_ns for s in order] == sorted(s.start_ns for s in order)
    assert order[-1].end_ns <= root.end_ns


def test_a_stream_is_traced_when_it_closes(gen: tuple[str, Any, Path]) -> None:
    url, app, out = gen
    with httpx.stream("POST", f"{url}/v1/completions", timeout=60, json={
            "model": "tiny-llama", "prompt": "abc", "max_tokens": 3, "ignore_eos": True,
            "stream": True}) as r:
        assert r.status_code == 200
        trace_id = r.headers["traceparent"].split("-")[1]
        body = "".join(r.iter_text())
    assert body.rstrip().endswith("data: [DONE]")
    t = traces(app, out)[trace_id]
    root = next(s for s in t.spans if s.parent_id is None)
    assert root.attributes["scalelab.stream"] is True
    assert root.attributes["gen_ai.usage.output_tokens"] == 3
    assert {s.name for s in t.spans} >= {"queue", "prefill", "decode"}


def test_a_refused_request_still_ends_its_trace(gen: tuple[str, Any, Path]) -> None:
    url, app, out = gen
    r = httpx.post(f"{url}/v1/completions", timeout=60,
                   json={"model": "other", "prompt": "x", "max_tokens": 2})
    assert r.status_code == 404
    roots = [s for t in traces(app, out).values() for s in t.spans
             if s.attributes.get("gen_ai.request.model") == "other"]
    assert [s.attributes["http.response.status_code"] for s in roots] == [404]
