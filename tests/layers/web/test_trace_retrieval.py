"""One trace across two servers: /v1/answer on the retrieval server (embed, search, and a
client span for the call) continues into the generative server (tiny model), both real uvicorn
servers on 127.0.0.1 in threads, both writing spans to one file."""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from inproc import serving

from scalelab.layers.nets.llama import build_tiny
from scalelab.layers.observe.traces import assemble, read_spans
from scalelab.layers.web.trace import TraceConfig
from scalelab.system.generate.app import ApiSettings, build_app
from scalelab.system.generate.engine import LlmEngine, LlmEngineConfig
from scalelab.system.generate.tokenizer import byte_tokenizer
from scalelab.system.retrieval.app import RetrievalServerSettings, create_app
from scalelab.system.retrieval.corpus import CorpusSpec, build_corpus, write_corpus
from scalelab.system.retrieval.embed import CachedEmbedder, HashingEmbedder
from scalelab.system.retrieval.retriever import build_index_dir

CLIENT_TRACE, CLIENT_SPAN = "6cf92f3577b34da6a3ce929d0e0e4738", "11f067aa0ba902b8"


@pytest.fixture
def one_torch_thread() -> object:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.usefixtures("one_torch_thread")
def test_answer_is_one_trace_across_retrieval_and_generation(tmp_path: Path) -> None:
    corpus = write_corpus(build_corpus(CorpusSpec(base_docs=60, questions=5, fresh_questions=0)),
                          tmp_path / "corpus")
    cache = tmp_path / "cache.sqlite"
    build_index_dir(corpus, tmp_path / "idx", spec="exact", lineage=None,
                    embedder=CachedEmbedder(embedder=HashingEmbedder(), path=cache))
    out = tmp_path / "spans.jsonl"
    cfg = {"kv_cache_bytes": 1 << 20, "block_size": 4, "max_model_len": 512}
    gen = build_app(ApiSettings(model="tiny", engine=cfg, max_output_tokens=8,
                                trace=TraceConfig(out=str(out))),
                    LlmEngine(build_tiny(seed=1), byte_tokenizer(), LlmEngineConfig(**cfg),
                              name="tiny-llama"))
    with serving(gen) as gen_url:
        # sample 0 on both: only the client's sampled traceparent starts this trace
        ret = create_app(RetrievalServerSettings(
            index_dir=str(tmp_path / "idx"), cache=str(cache), generate_url=gen_url,
            generate_model="tiny-llama", answer_max_tokens=4, trace=TraceConfig(out=str(out))))
        with serving(ret) as ret_url:
            r = httpx.post(f"{ret_url}/v1/answer", json={"question": "flights to ATL", "k": 2},
                           headers={"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"},
                           timeout=60)
            assert r.status_code == 200, r.text
            untraced = httpx.post(f"{ret_url}/v1/retrieve", json={"query": "JFK", "k": 3})
            assert untraced.status_code == 200 and "traceparent" not in untraced.headers
    # both servers flushed their spans when they stopped
    (t,) = assemble(read_spans([out]))
    assert t.trace_id == CLIENT_TRACE
    by = {s.name: s for s in t.spans}
    assert sorted(by) == ["POST /v1/answer", "admission", "chat tiny-llama", "decode", "embed",
                          "generate", "prefill", "queue", "search"]
    root, call, remote = by["POST /v1/answer"], by["generate"], by["chat tiny-llama"]
    assert root.parent_id == CLIENT_SPAN and root.service == "scalelab-retrieval"
    assert r.headers["traceparent"] == f"00-{CLIENT_TRACE}-{root.span_id}-01"
    assert by["embed"].parent_id == by["search"].parent_id == call.parent_id == root.span_id
    assert remote.parent_id == call.span_id and remote.service == "scalelab-generate"
    assert {by[n].parent_id for n in ("admission", "queue", "prefill", "decode")} == {
        remote.span_id}
    assert (by["search"].attributes["scalelab.index.kind"], by["search"].attributes["scalelab.k"]
            ) == ("exact", 2)
    assert call.attributes["http.response.status_code"] == 200
    assert root.start_ns <= call.start_ns <= remote.start_ns <= remote.end_ns <= call.end_ns
