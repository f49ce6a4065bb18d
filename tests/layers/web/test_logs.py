"""Trace ids in the servers' logs: every line written while a request runs names its trace.

Real servers (tabular, generate with the tiny model, retrieval) under uvicorn on 127.0.0.1 in a
thread; their logs go through web.logs.configure into a buffer, read back as JSON lines."""

from __future__ import annotations

import contextvars
import io
import json
import logging
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "system" / "serve"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from inproc import serving
from serve_fixtures import add_model, infer_body

from scalelab.layers.web.guard import admit
from scalelab.layers.web.logs import configure, current_trace_id

TRACE, SPAN = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
TP = f"00-{TRACE}-{SPAN}-01"


def _bound(headers: list[tuple[bytes, bytes]]) -> str:
    def run() -> str:
        admit({"type": "http", "headers": headers}, 1024)
        return current_trace_id()

    return contextvars.copy_context().run(run)


def test_admit_names_the_request_by_its_trace_else_its_id() -> None:
    outside = current_trace_id()  # whatever earlier tests in this process left in the context
    assert _bound([(b"traceparent", TP.encode())]) == TRACE
    assert _bound([(b"traceparent", TP.encode()), (b"x-request-id", b"r-1")]) == TRACE
    assert _bound([(b"x-request-id", b"r-1")]) == "r-1"
    # a malformed traceparent is ignored, as the W3C spec says
    assert _bound([(b"traceparent", b"00-zz-11-01"), (b"x-request-id", b"r-2")]) == "r-2"
    fresh = _bound([])
    assert len(fresh) == 32 and fresh != TRACE
    assert current_trace_id() == outside  # nothing leaks out of the request's context


@pytest.fixture
def log_lines() -> Iterator[io.StringIO]:
    names = ("scalelab", "scalelab.system.serve")
    saved = {n: (logging.getLogger(n).handlers[:], logging.getLogger(n).level,
                 logging.getLogger(n).propagate) for n in names}
    buf = io.StringIO()
    configure("info", names, stream=buf)
    yield buf
    for n, (handlers, level, propagate) in saved.items():
        lg = logging.getLogger(n)
        lg.handlers[:], lg.propagate = handlers, propagate
        lg.setLevel(level)


def _lines(buf: io.StringIO, logger: str) -> list[dict[str, Any]]:
    return [d for d in map(json.loads, buf.getvalue().splitlines()) if d["logger"] == logger]


def test_tabular_server_access_lines(tmp_path: Path, log_lines: io.StringIO) -> None:
    from scalelab.system.serve.app import ServeApp
    from scalelab.system.serve.context import ServeContext
    from scalelab.system.serve.settings import ServerSettings

    add_model(tmp_path, "flights", {1: 1})
    ctx = ServeContext.build(ServerSettings(model_repo=tmp_path, access_log="full"))
    with serving(ServeApp(ctx)) as base:
        url = f"{base}/v2/models/flights/infer"
        assert httpx.post(url, json=infer_body(2, seed=1),
                          headers={"traceparent": TP}).status_code == 200
        assert httpx.post(url, json=infer_body(1, seed=2),
                          headers={"x-request-id": "tab-7"}).status_code == 200
    lines = _lines(log_lines, "scalelab.system.serve.access")
    assert [(d["trace_id"], d["request_id"] != "tab-7") for d in lines] == [
        (TRACE, True), ("tab-7", False)]


def test_generate_server_access_lines(log_lines: io.StringIO) -> None:
    from scalelab.layers.nets.llama import build_tiny
    from scalelab.system.generate.app import ApiSettings, build_app, wrap
    from scalelab.system.generate.engine import LlmEngine, LlmEngineConfig
    from scalelab.system.generate.tokenizer import byte_tokenizer

    cfg = {"kv_cache_bytes": 1 << 20, "block_size": 4, "max_model_len": 512}
    settings = ApiSettings(model="tiny", engine=cfg, max_output_tokens=4)
    app = wrap(build_app(settings, LlmEngine(build_tiny(seed=1), byte_tokenizer(),
                                             LlmEngineConfig(**cfg), name="tiny-llama")), settings)
    with serving(app) as base:
        assert httpx.get(f"{base}/v1/models", headers={"traceparent": TP}).status_code == 200
        r = httpx.post(f"{base}/v1/completions", headers={"x-request-id": "gen-3"},
                       json={"model": "tiny-llama", "prompt": "hi", "max_tokens": 2})
        assert r.status_code == 200, r.text
    lines = _lines(log_lines, "scalelab.system.generate.access")
    assert [(d["path"], d["trace_id"], d["status"]) for d in lines] == [
        ("/v1/models", TRACE, 200), ("/v1/completions", "gen-3", 200)]


def test_retrieval_server_lines_with_a_trace_it_started(tmp_path: Path,
                                                        log_lines: io.StringIO) -> None:
    from scalelab.layers.web.trace import TraceConfig
    from scalelab.system.retrieval.app import RetrievalServerSettings, create_app
    from scalelab.system.retrieval.corpus import CorpusSpec, build_corpus, write_corpus
    from scalelab.system.retrieval.embed import CachedEmbedder, HashingEmbedder
    from scalelab.system.retrieval.retriever import build_index_dir

    corpus = write_corpus(build_corpus(CorpusSpec(base_docs=40, questions=2, fresh_questions=0)),
                          tmp_path / "corpus")
    cache = tmp_path / "cache.sqlite"
    build_index_dir(corpus, tmp_path / "idx", spec="exact", lineage=None,
                    embedder=CachedEmbedder(embedder=HashingEmbedder(), path=cache))
    # sample 1: a request without a traceparent starts a trace here; its lines name that trace
    app = create_app(RetrievalServerSettings(
        index_dir=str(tmp_path / "idx"), cache=str(cache),
        trace=TraceConfig(sample=1.0, out=str(tmp_path / "s"))))
    with serving(app) as base:
        a = httpx.post(f"{base}/v1/retrieve", json={"query": "JFK", "k": 2},
                       headers={"traceparent": TP})
        b = httpx.post(f"{base}/v1/retrieve", json={"query": "JFK", "k": 2})
        bad = httpx.post(f"{base}/v1/retrieve", json={"query": "JFK", "k": 0},
                         headers={"traceparent": TP})
    assert (a.status_code, b.status_code) == (200, 200) and bad.status_code >= 400
    started = b.headers["traceparent"].split("-")[1]
    assert started != TRACE
    access = _lines(log_lines, "scalelab.system.retrieval.access")
    assert [d["trace_id"] for d in access] == [TRACE, started, TRACE]
    errors = _lines(log_lines, "scalelab.system.retrieval")
    assert errors and all(d["trace_id"] == TRACE for d in errors)
