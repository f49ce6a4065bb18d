"""/v1/answer against a real `scalelab generate serve` (the tiny model) on 127.0.0.1, with no
--generate-model: the retrieval server asks the generate server which model it serves."""

from __future__ import annotations

import sys
from typing import Any

import httpx
import pytest

from scalelab.layers.web.errors import HttpError
from scalelab.layers.web.spawn import Spawned, free_port, start_server
from scalelab.system.retrieval.app import create_app
from scalelab.system.retrieval.embed import CachedEmbedder, HashingEmbedder
from scalelab.system.retrieval.retriever import build_index_dir
from scalelab.system.retrieval.service import served_model
from scalelab.system.retrieval.settings import RetrievalServerSettings


@pytest.fixture(scope="module")
def index_dir(small, tmp_path_factory: pytest.TempPathFactory) -> str:  # type: ignore[no-untyped-def]
    out = tmp_path_factory.mktemp("answer") / "idx"
    build_index_dir(small.dir, out, spec="exact",
                    embedder=CachedEmbedder(embedder=HashingEmbedder()), lineage=None)
    return str(out)


def test_answer_without_generate_model_uses_the_servers_own(
        tiny_generate: Spawned, index_dir: str, small, tmp_path_factory: pytest.TempPathFactory  # type: ignore[no-untyped-def]
) -> None:
    log = tmp_path_factory.mktemp("ret") / "server.log"

    def command(port: int) -> list[str]:
        return [sys.executable, "-m", "scalelab", "retrieval", "serve", index_dir, "--port",
                str(port), "--no-cache", "--generate-url", tiny_generate.url]

    with start_server(command, ready_path="/health/ready", log=log) as ret:
        for q in small.corpus.questions[:2]:  # the second answer reuses the model it learnt
            r = httpx.post(ret.url + "/v1/answer", json={"question": q.text, "k": 2},
                           timeout=120)
            assert r.status_code == 200, r.text
            body = r.json()
            assert isinstance(body["answer"], str) and len(body["sources"]) == 2
    assert log.read_text().count("serves model 'tiny-llama'") == 1


def test_no_model_list_is_a_clear_502(index_dir: str) -> None:
    from starlette.testclient import TestClient

    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    app = create_app(RetrievalServerSettings(index_dir=index_dir, generate_url=dead))
    with TestClient(app) as c:
        r = c.post("/v1/answer", json={"question": "Which airline is UA?"})
    assert r.status_code == 502
    err = r.json()["error"]
    assert f"{dead}/v1/models" in err and "--generate-model" in err


@pytest.mark.parametrize(("listing", "says"), [
    ({"data": []}, "lists 0 models []"),
    ({"data": [{"id": "a"}, {"id": "b"}]}, "lists 2 models ['a', 'b']"),
    ({"models": ["a"]}, "did not answer an OpenAI model list"),
    ([1], "did not answer an OpenAI model list"),
])
def test_served_model_refuses_none_or_several(listing: Any, says: str) -> None:
    with pytest.raises(HttpError) as e:
        served_model(listing, "http://g/v1/models")
    assert e.value.status == 502 and says in str(e.value) and "--generate-model" in str(e.value)


def test_served_model_picks_the_only_one() -> None:
    assert served_model({"object": "list", "data": [{"id": "tiny-llama"}]}, "u") == "tiny-llama"
