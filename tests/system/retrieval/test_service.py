"""The retrieval server's handler methods called directly: no socket, no server, no TestClient.

A real index (exact search over hashing vectors of a small real corpus) behind a real
`RetrievalService`; /v1/answer talks to a tiny OpenAI-shaped endpoint on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from scalelab.layers.web.errors import HttpError
from scalelab.layers.web.hook import local_request
from scalelab.layers.web.trace import TraceConfig
from scalelab.system.retrieval.corpus import CorpusSpec, build_corpus, write_corpus
from scalelab.system.retrieval.embed import CachedEmbedder, HashingEmbedder
from scalelab.system.retrieval.retriever import build_index_dir
from scalelab.system.retrieval.service import RetrievalService
from scalelab.system.retrieval.settings import RetrievalServerSettings

TOKEN = "service-test-token"
NDOCS = 60
Built = tuple[Path, Path, list[Any]]
"""The index directory, its embedding cache, the corpus documents."""


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    tmp = tmp_path_factory.mktemp("svc")
    corpus = build_corpus(CorpusSpec(base_docs=NDOCS, questions=5, fresh_questions=0))
    d = write_corpus(corpus, tmp / "corpus")
    cache = tmp / "cache.sqlite"
    build_index_dir(d, tmp / "idx", spec="exact", lineage=None,
                    embedder=CachedEmbedder(embedder=HashingEmbedder(), path=cache))
    return tmp / "idx", cache, corpus.docs


def service(built: Built, **kw: Any) -> RetrievalService:
    idx, cache, _ = built
    return RetrievalService(RetrievalServerSettings(index_dir=str(idx), cache=str(cache), **kw))


def post(path: str, body: Any, headers: dict[str, str] | None = None) -> Any:
    return local_request("POST", path, json_body=body, headers=headers)


def test_retrieve_finds_a_document_by_its_own_text(built: Built) -> None:
    svc = service(built)
    doc = built[2][7]
    out = asyncio.run(svc.retrieve(post("/v1/retrieve", {"query": doc.text, "k": 3})))
    assert (out["k"], out["index"], out["ntotal"]) == (3, "exact", NDOCS)
    (row,) = out["results"]
    assert len(row) == 3 and row[0]["key"] == doc.key and row[0]["text"] == doc.text
    many = asyncio.run(svc.retrieve(post("/v1/retrieve", {"queries": ["JFK", "ATL"]})))
    assert [len(r) for r in many["results"]] == [10, 10]  # k defaults to 10


@pytest.mark.parametrize(("body", "words"), [
    ({"query": "JFK", "k": 0}, "field 'k' = 0 is outside 1..100"),
    ({"query": "JFK", "queries": ["x"]}, "give exactly one of field 'query'"),
    ({"queries": ["ok", ""]}, "field 'queries[1]' must be a non-empty string"),
    ({"query": "JFK", "top": 3}, "unknown field(s) top"),
])
def test_retrieve_refuses_bad_fields_by_name(built: Built, body: dict[str, Any],
                                             words: str) -> None:
    svc = service(built)
    with pytest.raises(HttpError) as e:
        asyncio.run(svc.retrieve(post("/v1/retrieve", body)))
    assert e.value.status == 422 and words in str(e.value)


def test_retrieve_refuses_a_body_that_is_not_json(built: Built) -> None:
    svc = service(built)
    with pytest.raises(HttpError) as e:
        asyncio.run(svc.retrieve(local_request("POST", "/v1/retrieve", body=b"{nope")))
    assert e.value.status == 400 and "not JSON" in str(e.value)


def test_answer_puts_the_best_document_first_in_the_prompt(built: Built, chat: str
                                                           ) -> None:
    svc = service(built, generate_url=chat, generate_model="fake")
    doc = built[2][3]
    out = asyncio.run(svc.answer(post("/v1/answer", {"question": doc.text, "k": 2})))
    assert out["answer"] == f"[1] {doc.text}"
    assert out["sources"][0]["key"] == doc.key and len(out["sources"]) == 2


def test_answer_without_a_generation_server_is_503(built: Built) -> None:
    svc = service(built)
    with pytest.raises(HttpError) as e:
        asyncio.run(svc.answer(post("/v1/answer", {"question": "to ATL?"})))
    assert e.value.status == 503 and "--generate-url" in str(e.value)


def test_documents_are_added_and_found_and_need_the_token(
        built: Built, monkeypatch: pytest.MonkeyPatch) -> None:
    svc = service(built)
    new = {"key": "new-1", "text": "a brand new flight from PDX to ANC"}
    monkeypatch.delenv("SCALELAB_ADMIN_TOKEN", raising=False)
    with pytest.raises(HttpError) as off:
        asyncio.run(svc.documents(post("/v1/documents", {"documents": [new]})))
    assert off.value.status == 403
    monkeypatch.setenv("SCALELAB_ADMIN_TOKEN", TOKEN)
    with pytest.raises(HttpError) as wrong:
        asyncio.run(svc.documents(post("/v1/documents", {"documents": [new]},
                                       {"Authorization": "Bearer not-it"})))
    assert wrong.value.status == 401
    auth = {"Authorization": f"Bearer {TOKEN}"}
    out = asyncio.run(svc.documents(post("/v1/documents", {"documents": [new]}, auth)))
    assert (out["added"], out["ntotal"]) == (1, NDOCS + 1)
    hit = asyncio.run(svc.retrieve(post("/v1/retrieve", {"query": new["text"], "k": 1})))
    assert hit["results"][0][0]["key"] == "new-1"
    with pytest.raises(HttpError) as bad:
        asyncio.run(svc.documents(post("/v1/documents", {"documents": [{"key": "x"}]}, auth)))
    assert bad.value.status == 422 and "documents[0].text" in str(bad.value)


def test_probes_and_metrics(built: Built) -> None:
    svc = service(built)
    live = asyncio.run(svc.live(local_request("GET", "/health/live")))
    ready = asyncio.run(svc.ready(local_request("GET", "/health/ready")))
    assert json.loads(bytes(live.body)) == {"live": True}
    assert json.loads(bytes(ready.body)) == {"ready": True, "index": "exact", "ntotal": NDOCS,
                                      "rebuilt_at_start": False}
    page = bytes(asyncio.run(svc.metrics(local_request("GET", "/metrics"))).body).decode()
    assert f"scalelab_retrieval_index_vectors {float(NDOCS)}" in page


def test_route_counts_errors_and_refuses_past_the_inflight_limit(built: Built) -> None:
    svc = service(built, max_inflight=1)
    bad = asyncio.run(svc.route("retrieve", svc.retrieve)(post("/v1/retrieve", {"k": 2})))
    assert bad.status_code == 422 and b"give exactly one of field" in bad.body
    assert svc.prom.registry.get_sample_value(
        "scalelab_retrieval_requests_total", {"route": "retrieve", "code": "422"}) == 1.0

    async def held() -> tuple[int, int, str | None, int]:
        gate = asyncio.Event()

        async def slow(request: Any) -> dict[str, Any]:
            await gate.wait()
            return {"ok": True}

        route = svc.route("slow", slow)
        first = asyncio.ensure_future(route(post("/x", {})))
        while svc.inflight.count == 0:
            await asyncio.sleep(0)
        second = await route(post("/x", {}))
        gate.set()
        done = await first
        return done.status_code, second.status_code, second.headers.get("retry-after"), \
            svc.inflight.count

    assert asyncio.run(held()) == (200, 503, "1", 0)  # and the count is whole again
    assert svc.prom.registry.get_sample_value("scalelab_retrieval_rejected_total") == 1.0


def test_a_traced_route_writes_its_spans_without_a_server(built: Built, tmp_path: Path
                                                          ) -> None:
    out = tmp_path / "spans.jsonl"
    svc = service(built, trace=TraceConfig(sample=1.0, out=str(out)))
    resp = asyncio.run(svc.route("retrieve", svc.retrieve)(
        post("/v1/retrieve", {"query": "JFK", "k": 2})))
    svc.hook.shutdown()
    spans = [json.loads(line) for line in out.read_text().splitlines()]
    root = next(s for s in spans if s["parent_id"] is None)
    assert resp.status_code == 200
    assert resp.headers["traceparent"] == f"00-{root['trace_id']}-{root['span_id']}-01"
    assert sorted(s["name"] for s in spans) == ["POST /v1/retrieve", "embed", "search"]
    assert {s["parent_id"] for s in spans if s is not root} == {root["span_id"]}
