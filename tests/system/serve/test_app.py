"""End-to-end: a real `scalelab serve` process on 127.0.0.1, spoken to over HTTP."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from serve_client import fire, samples, wait_for
from serve_fixtures import Server, infer_body, sample_inputs

from scalelab.layers.nets.registry import load_module

TOKEN = {"Authorization": "Bearer s3cret"}


def post(server: Server, path: str, body: object, **kw: object) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, timeout=30, **kw)  # type: ignore[arg-type]


def expected(repo: Path, model: str, version: int, n: int, seed: int) -> np.ndarray:
    cat, num = sample_inputs(n, seed)
    net = load_module(repo / model / str(version))
    with torch.inference_mode():
        return torch.softmax(net(torch.from_numpy(cat), torch.from_numpy(num)), dim=1).numpy()


# -- protocol basics ----------------------------------------------------------------------------

def test_health_and_metadata(server: Server) -> None:
    assert httpx.get(f"{server.url}/v2/health/live").json() == {"live": True}
    assert httpx.get(f"{server.url}/v2/health/ready").status_code == 200
    meta = httpx.get(f"{server.url}/v2").json()
    assert meta["name"] == "scalelab" and "binary_tensor_data" in meta["extensions"]
    m = httpx.get(f"{server.url}/v2/models/flights").json()
    assert m["versions"] == ["1", "2"]
    assert [i["name"] for i in m["inputs"]] == ["categorical", "numeric"]
    assert m["inputs"][1] == {"name": "numeric", "datatype": "FP32", "shape": [-1, 14]}
    assert httpx.get(f"{server.url}/v2/models/flights/versions/1").json()["versions"] == ["1"]
    assert httpx.get(f"{server.url}/v2/models/flights/ready").json()["ready"] is True
    assert httpx.get(f"{server.url}/v2/models/flights/versions/2/ready").status_code == 200
    assert httpx.get(f"{server.url}/v2/models/flights/versions/9/ready").status_code == 404
    assert httpx.get(f"{server.url}/v2/models/nope/ready").status_code == 404


def test_infer_matches_the_network(server: Server, repo: Path) -> None:
    r = post(server, "/v2/models/flights/infer", infer_body(3, seed=5, rid="abc"))
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["model_name"] == "flights" and doc["model_version"] == "2" and doc["id"] == "abc"
    out = {o["name"]: o for o in doc["outputs"]}
    probs = np.array(out["probabilities"]["data"], dtype=np.float32).reshape(3, 4)
    assert out["probabilities"]["shape"] == [3, 4] and out["label"]["shape"] == [3]
    np.testing.assert_allclose(probs, expected(repo, "flights", 2, 3, 5), rtol=1e-5, atol=1e-6)
    assert out["label"]["data"] == probs.argmax(axis=1).tolist()
    r1 = post(server, "/v2/models/flights/versions/1/infer", infer_body(3, seed=5))
    assert r1.json()["model_version"] == "1"
    p1 = np.array(r1.json()["outputs"][0]["data"], dtype=np.float32).reshape(3, 4)
    np.testing.assert_allclose(p1, expected(repo, "flights", 1, 3, 5), rtol=1e-5, atol=1e-6)


def test_flat_and_nested_data_agree_and_outputs_can_be_chosen(server: Server) -> None:
    nested = infer_body(2, seed=9)
    flat = json.loads(json.dumps(nested))
    flat["inputs"][0]["data"] = [x for row in flat["inputs"][0]["data"] for x in row]
    flat["outputs"] = [{"name": "label"}]
    a = post(server, "/v2/models/flights/infer", nested).json()
    b = post(server, "/v2/models/flights/infer", flat).json()
    assert [o["name"] for o in b["outputs"]] == ["label"]
    assert b["outputs"][0]["data"] == a["outputs"][1]["data"]


@pytest.mark.parametrize(("mutate", "status", "needle"), [
    (lambda b: b["inputs"][1].update(datatype="INT64"), 400, "input 'numeric': datatype INT64"),
    (lambda b: b["inputs"][1]["data"].pop(), 400, "input 'numeric': shape [1, 14] needs 14"),
    (lambda b: b["inputs"][0].update(shape=[1, 5]), 400, "input 'categorical': shape [1, 5]"),
    (lambda b: b["inputs"].pop(), 400, "input 'numeric' is missing"),
    (lambda b: b["inputs"][0].update(name="cats"), 400, "input 'cats' is not an input"),
    (lambda b: b["inputs"][0].update(data=[["a", "b", "c", "d"]]), 400, "are not INT64"),
    (lambda b: b["inputs"][0].update(data=[[1.5, 1, 1, 1]]), 400, "are not INT64"),
    (lambda b: b["inputs"][0].pop("shape"), 422, "field 'inputs.0.shape'"),
    (lambda b: b.pop("inputs"), 422, "field 'inputs'"),
    (lambda b: b.update(outputs=[{"name": "nope"}]), 400, "output 'nope' is not an output"),
])
def test_malformed_requests_name_the_field(server: Server, mutate, status: int,  # type: ignore[no-untyped-def]
                                           needle: str) -> None:
    body = infer_body(1)
    mutate(body)
    r = post(server, "/v2/models/flights/infer", body)
    assert r.status_code == status, r.text
    assert needle in r.json()["error"]


def test_bad_bodies_and_headers(server: Server) -> None:
    url = f"{server.url}/v2/models/flights/infer"
    r = httpx.post(url, content=b"{not json")
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]
    r = post(server, "/v2/models/flights/infer", infer_body(65))
    assert r.status_code == 400 and "max_batch_size=64" in r.json()["error"]
    r = post(server, "/v2/models/flights/infer", infer_body(1),
             headers={"X-Request-Timeout-Ms": "soon"})
    assert r.status_code == 400 and "X-Request-Timeout-Ms" in r.json()["error"]
    assert post(server, "/v2/models/flights/versions/x/infer", infer_body(1)).status_code == 400
    assert post(server, "/v2/models/flights/versions/7/infer", infer_body(1)).status_code == 404


def test_body_limit_is_413(server: Server) -> None:
    big = infer_body(64)
    big["inputs"][1]["data"] = [1.0e-30] * (64 * 14)
    big["pad"] = "x" * (70 * 1024)
    r = post(server, "/v2/models/flights/infer", big)
    assert r.status_code == 413 and "limit" in r.json()["error"]

    def chunks():  # type: ignore[no-untyped-def]
        for _ in range(80):
            yield b" " * 1024  # no Content-Length: the limit is enforced while streaming

    r = httpx.post(f"{server.url}/v2/models/flights/infer", content=chunks())
    assert r.status_code == 413


def test_request_id_is_echoed_and_logged(server: Server) -> None:
    r = post(server, "/v2/models/flights/infer", infer_body(1), headers={"X-Request-Id": "rq-77"})
    assert r.headers["x-request-id"] == "rq-77"
    generated = post(server, "/v2/models/flights/infer", infer_body(1)).headers["x-request-id"]
    assert len(generated) == 32

    def logged() -> bool:
        for line in server.logs().splitlines():
            if line.startswith("{"):
                rec = json.loads(line)
                if rec.get("request_id") == "rq-77" and rec.get("status") == 200:
                    return True
        return False

    wait_for(logged, "the access log line for rq-77")


# -- batching, deadlines, queues, isolation ------------------------------------------------------

def test_concurrent_requests_are_batched(server: Server) -> None:
    before_rows = samples(server.url, "scalelab_batch_size_sum", model="batchy")
    before_n = samples(server.url, "scalelab_batch_size_count", model="batchy")
    rs = fire(f"{server.url}/v2/models/batchy/infer", 32, lambda i: infer_body(1, seed=100 + i))
    assert [r.status_code for r in rs] == [200] * 32
    rows = samples(server.url, "scalelab_batch_size_sum", model="batchy") - before_rows
    batches = samples(server.url, "scalelab_batch_size_count", model="batchy") - before_n
    assert rows == 32
    assert batches < 32  # some forward pass carried more than one request


def test_expired_in_queue_is_504(server: Server) -> None:
    rs = fire(f"{server.url}/v2/models/slow/infer", 6, lambda i: infer_body(1, seed=i),
              headers=lambda i: {"X-Request-Timeout-Ms": "20"})
    codes = [r.status_code for r in rs]
    assert set(codes) <= {200, 504} and 504 in codes
    err = next(r for r in rs if r.status_code == 504).json()["error"]
    assert "dropped before compute" in err


def test_full_queue_is_429_with_retry_after(server: Server) -> None:
    rs = fire(f"{server.url}/v2/models/slow/infer", 24, lambda i: infer_body(1, seed=i))
    codes = [r.status_code for r in rs]
    assert set(codes) <= {200, 429} and 429 in codes and 200 in codes
    r429 = next(r for r in rs if r.status_code == 429)
    assert int(r429.headers["retry-after"]) >= 1
    assert "queue full" in r429.json()["error"]


def test_overload_every_request_answered_and_others_unaffected(server: Server) -> None:
    n = 120
    rs = fire(f"{server.url}/v2/models/slow/infer", n, lambda i: infer_body(1, seed=i),
              headers=lambda i: {"X-Request-Timeout-Ms": str(100 + 10 * (i % 20))})
    codes = [r.status_code for r in rs]
    assert len(codes) == n and set(codes) <= {200, 429, 504}
    assert httpx.get(f"{server.url}/v2/health/live").status_code == 200
    assert post(server, "/v2/models/flights/infer", infer_body(1)).status_code == 200


def test_poison_input_fails_alone(server: Server) -> None:
    rs = fire(f"{server.url}/v2/models/poison/infer", 8,
              lambda i: infer_body(1, seed=i, poison=(i == 3)))
    codes = [r.status_code for r in rs]
    assert codes == [200, 200, 200, 500, 200, 200, 200, 200]
    assert "poison value" in rs[3].json()["error"]
    assert post(server, "/v2/models/flights/infer", infer_body(1)).status_code == 200
    assert post(server, "/v2/models/poison/infer", infer_body(1)).status_code == 200


# -- cache and coalescing ------------------------------------------------------------------------

def test_cache_hits_and_identical_requests_coalesce(server: Server) -> None:
    body = infer_body(2, seed=42)
    a = post(server, "/v2/models/cached/infer", body).json()
    b = post(server, "/v2/models/cached/infer", body).json()
    assert a["outputs"] == b["outputs"]
    assert samples(server.url, "scalelab_cache_hits_total", model="cached") >= 1
    assert samples(server.url, "scalelab_cache_misses_total", model="cached") >= 1
    rs = fire(f"{server.url}/v2/models/batchy/infer", 10, lambda i: infer_body(1, seed=4242))
    assert len({r.text for r in rs}) == 1
    assert samples(server.url, "scalelab_coalesced_requests_total", model="batchy") >= 1


# -- metrics -------------------------------------------------------------------------------------

def test_metrics_are_histograms_labelled_by_model_and_version(server: Server) -> None:
    post(server, "/v2/models/flights/infer", infer_body(1))
    text = httpx.get(f"{server.url}/metrics").text
    for h in ("scalelab_request_duration_seconds", "scalelab_queue_wait_seconds",
              "scalelab_batch_formation_seconds", "scalelab_compute_seconds",
              "scalelab_batch_size"):
        assert f"# TYPE {h} histogram" in text
        assert f'{h}_bucket{{le="+Inf",model="flights",version="2"}}' in text
    assert "summary" not in text
    assert "# TYPE scalelab_queue_depth gauge" in text
    assert "# TYPE scalelab_inflight_requests gauge" in text
    assert samples(server.url, "scalelab_responses_total", model="flights", status="200") >= 1


def test_request_sample_has_flat_feature_columns(server: Server, tmp_path: Path) -> None:
    post(server, "/v2/models/flights/infer", infer_body(2, seed=3),
         headers={"X-Request-Id": "sampled-1"})
    sample_dir = server.log.parent / "samples"

    def rows() -> list[dict[str, object]]:
        out = []
        for f in sample_dir.glob("requests-*.jsonl"):
            out += [json.loads(x) for x in f.read_text().splitlines()]
        return [r for r in out if r["request_id"] == "sampled-1"]

    wait_for(lambda: len(rows()) == 2, "two sampled rows")
    row = rows()[0]
    assert row["carrier"] in {"UA", "B6", "EV", "DL", None}
    assert isinstance(row["distance"], float) and row["model"] == "flights"
    assert len(row["out_probabilities"]) == 4 and row["out_label"] in range(4)  # type: ignore[arg-type]


# -- repository, auth, safety --------------------------------------------------------------------

def test_admin_endpoints_need_the_token(server: Server) -> None:
    assert post(server, "/v2/repository/index", {}).status_code == 401
    assert post(server, "/v2/repository/index", {},
                headers={"Authorization": "Bearer wrong"}).status_code == 403
    r = post(server, "/v2/repository/index", {}, headers=TOKEN)
    assert r.status_code == 200
    states = {(m["name"], m.get("version")): m["state"] for m in r.json()}
    assert states[("flights", "1")] == "READY" and states[("broken", "1")] == "UNAVAILABLE"
    assert post(server, "/v2/repository/models/cached/unload", {}).status_code == 401


def test_unload_and_load(server: Server) -> None:
    assert post(server, "/v2/repository/models/cached/unload", {}, headers=TOKEN).status_code \
        == 200
    assert post(server, "/v2/models/cached/infer", infer_body(1)).status_code == 404
    r = post(server, "/v2/repository/models/cached/load", {}, headers=TOKEN)
    assert r.status_code == 200 and r.json()["ready_versions"] == [1]
    assert post(server, "/v2/models/cached/infer", infer_body(1)).status_code == 200


def test_pickle_payload_is_never_unpickled(server: Server, repo: Path) -> None:
    r = post(server, "/v2/models/broken/infer", infer_body(1))
    assert r.status_code == 503
    r = post(server, "/v2/repository/models/broken/load", {}, headers=TOKEN)
    assert r.status_code == 400 and "safetensors" in r.json()["error"]
    assert not (repo.parent / "PWNED").exists()


def test_names_and_paths_never_escape_the_repository(server: Server) -> None:
    for path in ("/v2/models/..%2F..%2Fetc/ready", "/v2/models/%2E%2E/ready",
                 "/v2/models/escape/ready", "/v2/models/.hidden/ready"):
        assert httpx.get(f"{server.url}{path}").status_code in (400, 404), path
    r = post(server, "/v2/repository/models/escape/load", {}, headers=TOKEN)
    assert r.status_code == 400 and "outside the model repository" in r.json()["error"]
    r = post(server, "/v2/repository/models/..%2Fx/load", {}, headers=TOKEN)
    assert r.status_code in (400, 404)
    names = {m["name"] for m in post(server, "/v2/repository/index", {}, headers=TOKEN).json()}
    assert "escape" not in names
