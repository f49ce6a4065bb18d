from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from scalelab.layers.web.spawn import Spawned, start_server
from scalelab.system.retrieval.embed import CachedEmbedder, HashingEmbedder
from scalelab.system.retrieval.retriever import build_index_dir
from scalelab.system.retrieval.service import prompt_messages

TOKEN = "test-admin-token"


@pytest.fixture(scope="module")
def server(small, chat: str, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[Spawned]:  # type: ignore[no-untyped-def]
    tmp = tmp_path_factory.mktemp("srv")
    cache = tmp / "cache.sqlite"
    out = tmp / "idx"
    build_index_dir(small.dir, out, spec="faiss:HNSW32", embedder=CachedEmbedder(
        embedder=HashingEmbedder(), path=cache), lineage=None, search_params={"ef": 64})
    env = {**os.environ, "SCALELAB_ADMIN_TOKEN": TOKEN}

    def cmd(port: int) -> list[str]:
        return [sys.executable, "-m", "scalelab", "retrieval", "serve", str(out), "--port",
                str(port), "--cache", str(cache), "--max-k", "50", "--max-body-bytes", "20000",
                "--max-inflight", "1",
                "--generate-url", chat, "--generate-model", "fake-chat"]

    with start_server(cmd, ready_path="/health/ready", env=env,
                        log=tmp / "server.log") as s:
        yield s


def _post(s: Spawned, path: str, body: Any, **kw: Any) -> httpx.Response:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(s.url + path, content=data, headers={"content-type": "application/json",
                                                         **kw.pop("headers", {})}, timeout=30,
                      **kw)


def test_retrieve_returns_the_ground_truth(server: Spawned, small) -> None:  # type: ignore[no-untyped-def]
    # a question whose document a brute-force search over the same vectors puts in its top 10
    top = np.argsort(-(small.q @ small.x.T), axis=1)[:, :10]
    i = next(i for i, t in enumerate(small.truth) if t in top[i, :5])
    q = small.corpus.questions[i]
    r = _post(server, "/v1/retrieve", {"query": q.text, "k": 10})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["ntotal"] == 1500 and body["k"] == 10 and body["index"] == "faiss:HNSW32"
    (hits,) = body["results"]
    assert len(hits) == 10
    assert [h["score"] for h in hits] == sorted((h["score"] for h in hits), reverse=True)
    assert set(hits[0]) == {"id", "key", "score", "text"}
    assert q.doc_key in [h["key"] for h in hits]
    assert [h["id"] for h in hits] == [small.corpus.key_to_id()[h["key"]] for h in hits]
    assert r.headers["x-request-id"]
    many = _post(server, "/v1/retrieve", {"queries": [q.text, "plane N14228"], "k": 3}).json()
    assert [len(x) for x in many["results"]] == [3, 3]
    assert many["results"][0] == hits[:3]


@pytest.mark.parametrize(("body", "status", "names"), [
    ({"query": "", "k": 5}, 422, "query"),
    ({"query": "   "}, 422, "query"),
    ({"query": "x" * 2001}, 422, "query"),
    ({"query": "ok", "k": 0}, 422, "'k'"),
    ({"query": "ok", "k": -3}, 422, "'k'"),
    ({"query": "ok", "k": 51}, 422, "'k'"),
    ({"query": "ok", "k": 10**12}, 422, "'k'"),
    ({"query": "ok", "k": "5"}, 422, "'k'"),
    ({"query": "ok", "k": True}, 422, "'k'"),
    ({"queries": []}, 422, "queries"),
    ({"queries": ["ok"] * 33}, 422, "queries"),
    ({"queries": ["ok", 3]}, 422, "queries[1]"),
    ({"query": "a", "queries": ["b"]}, 422, "exactly one"),
    ({"k": 3}, 422, "exactly one"),
    ({"query": "ok", "top": 3}, 422, "top"),
    ([1, 2], 422, "JSON object"),
    (b"{not json", 400, "not JSON"),
])
def test_bad_queries_get_4xx_naming_the_field(server: Spawned, body: Any, status: int,
                                              names: str) -> None:
    r = _post(server, "/v1/retrieve", body)
    assert r.status_code == status, r.text
    assert names in r.json()["error"]


def test_oversized_body_is_413(server: Spawned) -> None:
    r = _post(server, "/v1/retrieve", {"query": "x" * 30_000})
    assert r.status_code == 413


def test_answer_path_posts_context_to_chat_completions(server: Spawned, small,  # type: ignore[no-untyped-def]
                                                       fake_chat: Any) -> None:
    q = small.corpus.questions[0]
    r = _post(server, "/v1/answer", {"question": q.text, "k": 3})
    assert r.status_code == 200, r.text
    body = r.json()
    assert len(body["sources"]) == 3
    assert body["answer"] == f"[1] {body['sources'][0]['text']}"
    sent = fake_chat.seen[-1]
    assert sent["path"] == "/v1/chat/completions"
    assert sent["body"]["model"] == "fake-chat"  # the flag's, so /v1/models is never asked
    assert sent["body"]["messages"] == prompt_messages(q.text, [s["text"] for s in
                                                                body["sources"]])
    assert _post(server, "/v1/answer", {"question": ""}).status_code == 422


def test_admin_add_makes_a_new_document_answerable(server: Spawned, small) -> None:  # type: ignore[no-untyped-def]
    fq = small.corpus.fresh_questions[1]
    doc = next(d for d in small.corpus.fresh_docs if d.key == fq.doc_key)
    new = {"documents": [{"key": doc.key, "text": doc.text}]}
    assert _post(server, "/v1/documents", new).status_code == 401
    assert _post(server, "/v1/documents", new,
                 headers={"authorization": "Bearer wrong"}).status_code == 401
    before = _post(server, "/v1/retrieve", {"query": fq.text, "k": 10}).json()["results"][0]
    assert doc.key not in {h["key"] for h in before}
    r = _post(server, "/v1/documents", new, headers={"authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 200, r.text
    assert r.json()["added"] == 1
    after = _post(server, "/v1/retrieve", {"query": fq.text, "k": 10}).json()
    assert doc.key in {h["key"] for h in after["results"][0]}
    again = _post(server, "/v1/documents", new, headers={"authorization": f"Bearer {TOKEN}"})
    assert again.status_code == 409
    metrics = httpx.get(server.url + "/metrics").text
    assert 'scalelab_retrieval_requests_total{code="200",route="retrieve"}' in metrics
    assert "scalelab_retrieval_index_vectors 1501.0" in metrics


def test_admission_refuses_beyond_max_inflight(server: Spawned, small,  # type: ignore[no-untyped-def]
                                               fake_chat: Any) -> None:
    q = small.corpus.questions[2].text
    fake_chat.entered.clear()
    fake_chat.gate = threading.Event()
    out: list[httpx.Response] = []
    t = threading.Thread(target=lambda: out.append(
        _post(server, "/v1/answer", {"question": q, "k": 2})))
    t.start()
    try:
        assert fake_chat.entered.wait(timeout=60)
        # The answer holds the only slot (--max-inflight 1): the next request is refused.
        r = _post(server, "/v1/retrieve", {"query": q})
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        assert "limit 1" in r.json()["error"]
    finally:
        fake_chat.gate.set()
        t.join(timeout=60)
        fake_chat.gate = None
    assert out[0].status_code == 200
    assert _post(server, "/v1/retrieve", {"query": q}).status_code == 200
    assert "scalelab_retrieval_rejected_total 1.0" in httpx.get(server.url + "/metrics").text


def test_prompt_messages() -> None:
    m = prompt_messages("Q?", ["a.", "b."])
    assert m[1]["content"] == "Facts:\n[1] a.\n[2] b.\n\nQuestion: Q?"


def test_serve_refuses_a_directory_without_an_index(tmp_path: Path) -> None:
    from scalelab.cli import run

    assert run(["retrieval", "serve", str(tmp_path)]) == 2
