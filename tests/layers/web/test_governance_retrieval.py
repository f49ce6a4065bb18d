"""Governance on the retrieval server (under uvicorn on 127.0.0.1, in a thread of this
process): a model budget sheds /v1/retrieve, the kill switch stops it while health still
answers, and /metrics carries both the server's families and governance's."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from scalelab.layers.web.spawn import free_port

TOKEN = "adm1n-token"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    import uvicorn

    from scalelab.system.retrieval.app import RetrievalServerSettings, create_app
    from scalelab.system.retrieval.corpus import CorpusSpec, build_corpus, write_corpus
    from scalelab.system.retrieval.embed import CachedEmbedder, HashingEmbedder
    from scalelab.system.retrieval.retriever import build_index_dir

    tmp = tmp_path_factory.mktemp("retgov")
    corpus = write_corpus(build_corpus(CorpusSpec(level=1, base_docs=200, questions=10,
                                                  fresh_questions=2)), tmp / "corpus")
    cache = tmp / "cache.sqlite"
    build_index_dir(corpus, tmp / "idx", spec="exact", embedder=CachedEmbedder(
        embedder=HashingEmbedder(), path=cache), lineage=None)
    gov = tmp / "gov.yaml"
    gov.write_text("governance:\n  models:\n    idx:\n      budgets:\n"
                   "        - {unit: requests, period: hour, limit: 2}\n", "utf-8")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SCALELAB_ADMIN_TOKEN", TOKEN)
        app = create_app(RetrievalServerSettings(index_dir=str(tmp / "idx"), cache=str(cache),
                                                 governance_file=str(gov)))
        port = free_port()
        srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                            log_config=None, access_log=False))
        t = threading.Thread(target=srv.run, daemon=True)
        t.start()
        t0 = time.monotonic()
        while not srv.started and time.monotonic() - t0 < 60 and t.is_alive():
            time.sleep(0.01)
        yield f"http://127.0.0.1:{port}"
        srv.should_exit = True
        t.join(timeout=30)


def retrieve(url: str) -> httpx.Response:
    return httpx.post(url + "/v1/retrieve", json={"query": "flights from JFK", "k": 3},
                      timeout=30)


def test_model_budget_kill_switch_and_metrics(server: str) -> None:
    stop = httpx.post(server + "/admin/governance/models/idx/stop", headers=ADMIN, timeout=10)
    assert stop.status_code == 200
    r = retrieve(server)
    assert r.status_code == 503 and "model 'idx' is stopped" in r.json()["error"]
    assert httpx.get(server + "/health/ready", timeout=10).status_code == 200  # not governed
    assert httpx.post(server + "/admin/governance/models/idx/release", headers=ADMIN,
                      timeout=10).status_code == 200
    assert [retrieve(server).status_code for _ in range(2)] == [200, 200]
    shed = retrieve(server)
    assert shed.status_code == 429
    assert shed.json()["error"].startswith("model 'idx' used its budget of 2 requests per hour")
    text = httpx.get(server + "/metrics", timeout=10).text
    assert 'scalelab_budget_used{client="*",model="idx",period="hour",unit="requests"} 2.0' \
        in text
    assert 'scalelab_retrieval_requests_total{code="200",route="retrieve"} 2.0' in text
    assert 'reason="stopped_model"' in text and 'reason="budget"' in text
    # the "model" of a retrieval server is its index directory's name
    s = httpx.get(server + "/admin/governance", headers=ADMIN, timeout=10).json()
    assert s["models"]["idx"]["budgets"][0]["used"] == 2.0

