"""Governance end to end: a real `scalelab serve --governance FILE` process on 127.0.0.1 (the
tabular server's bare-ASGI infer path under the middleware), and the generative server's
token budget on the tiny model. Waits are bounded polls of observable state, never sleeps."""

from __future__ import annotations

import concurrent.futures as cf
import json
import math
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).parents[2] / "system" / "serve"))

from serve_client import wait_for
from serve_fixtures import Server, add_model, infer_body, start_server

from scalelab.cli import run as cli_run
from scalelab.layers.web.spawn import free_port

TOKEN = "adm1n-token"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
KEYS = {name: f"sk-{name}-0123456789" for name in
        ("bursty", "quick", "capped", "metered", "stoppable")}
GOVERNANCE = {"governance": {
    "client_header": "X-Client-Id",
    "clients": {
        # 10 s to earn a token back: the burst is exact unless 4 requests take 10 s
        "bursty": {"keys": [KEYS["bursty"]], "rate": 0.1, "burst": 3},
        # a token every 0.25 s: refused when two requests come close, released soon after
        "quick": {"keys": [KEYS["quick"]], "rate": 4, "burst": 1},
        "capped": {"keys": [KEYS["capped"]], "max_concurrency": 1},
        "metered": {"keys": [KEYS["metered"]],
                    "budgets": [{"unit": "requests", "period": "day", "limit": 2}]},
        "stoppable": {"keys": [KEYS["stoppable"]]},
    }}}


def metric(base: str, family: str, **labels: str) -> float:
    """Sum of the samples of `family` whose labels include `labels`."""
    from prometheus_client.parser import text_string_to_metric_families

    total = 0.0
    for fam in text_string_to_metric_families(httpx.get(f"{base}/metrics", timeout=10).text):
        for sm in fam.samples:
            if sm.name == family and all(sm.labels.get(k) == v for k, v in labels.items()):
                total += sm.value
    return total


def key(name: str) -> dict[str, str]:
    return {"X-API-Key": KEYS[name]}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("govrepo")
    add_model(root, "flights", {1: 1})
    # one request holds the model 1.5 s: long enough to be seen in flight on a busy machine
    add_model(root, "slow", {1: 3}, arch="delay_mlp", extra_params={"batch_ms": 1500,
                                                                   "row_ms": 0},
              max_batch_size=1, dynamic_batching={"default_timeout_ms": 10000})
    gov = root.parent / "governance.json"
    gov.write_text(json.dumps(GOVERNANCE), encoding="utf-8")
    srv = start_server(root, root.parent / "server.log", "--admin-token", TOKEN,
                       "--governance", str(gov))
    yield srv
    srv.stop()


def infer(srv: Server, model: str = "flights", headers: dict[str, str] | None = None
          ) -> httpx.Response:
    return httpx.post(f"{srv.url}/v2/models/{model}/infer", json=infer_body(1),
                      headers=headers or {}, timeout=30)


def state(srv: Server) -> dict[str, Any]:
    r = httpx.get(f"{srv.url}/admin/governance", headers=ADMIN, timeout=10)
    assert r.status_code == 200, r.text
    return dict(r.json())


def in_background(fn: Callable[[], httpx.Response]) -> cf.Future[httpx.Response]:
    pool = cf.ThreadPoolExecutor(1)
    fut = pool.submit(fn)
    pool.shutdown(wait=False)
    return fut


def test_burst_plus_one_is_429_naming_the_limit_and_refill_releases(server: Server) -> None:
    t0 = time.monotonic()
    statuses = [infer(server, headers=key("bursty")) for _ in range(4)]
    elapsed = time.monotonic() - t0
    assert [r.status_code for r in statuses] == [200, 200, 200, 429]
    refused = statuses[3]
    # one token at 0.1/s is 10 s away less the time the burst took, rounded up
    assert math.ceil(10 - elapsed) <= int(refused.headers["retry-after"]) <= 10
    assert refused.json() == {"error": "client 'bursty' over its rate limit of 0.1 req/s "
                                       "(burst 3)"}
    assert refused.headers["x-request-id"]
    # the refill, on a client that earns a token every 0.25 s: refused once, then let in
    quick = [infer(server, headers=key("quick")).status_code for _ in range(2)]
    while quick[-1] != 429 and len(quick) < 50:  # back-to-back requests: ms apart
        quick.append(infer(server, headers=key("quick")).status_code)
    assert quick[0] == 200 and quick[-1] == 429
    wait_for(lambda: infer(server, headers=key("quick")).status_code == 200,
             "a token to refill", deadline_s=10)
    assert metric(server.url, "scalelab_governance_refusals_total", client="bursty",
                   reason="rate") == 1


def test_concurrency_cap_refuses_the_second_in_flight(server: Server) -> None:
    first = in_background(lambda: infer(server, "slow", key("capped")))
    wait_for(lambda: state(server)["clients"]["capped"]["inflight"] == 1, "one in flight")
    second = infer(server, "flights", key("capped"))
    assert second.status_code == 429
    assert second.json()["error"] == ("client 'capped' over its concurrency cap of 1 "
                                      "requests in flight")
    assert first.result(timeout=30).status_code == 200
    assert infer(server, "flights", key("capped")).status_code == 200


def test_budget_sheds_load_and_metrics_show_the_burn(server: Server) -> None:
    assert [infer(server, headers=key("metered")).status_code for _ in range(2)] == [200, 200]
    r = infer(server, headers=key("metered"))
    assert r.status_code == 429
    assert r.json()["error"].startswith("client 'metered' used its budget of 2 requests per "
                                        "day (2 requests used); it resets at ")
    assert 1 <= int(r.headers["retry-after"]) <= 86400
    labels = {"client": "metered", "model": "*", "unit": "requests", "period": "day"}
    assert metric(server.url, "scalelab_budget_used", **labels) == 2.0
    assert metric(server.url, "scalelab_budget_limit", **labels) == 2.0
    assert metric(server.url, "scalelab_governance_refusals_total", client="metered",
                   reason="budget") == 1.0
    # the server's own metrics are still there, beside governance's
    assert metric(server.url, "scalelab_responses_total", model="flights", status="200") >= 2


def test_kill_switch_drains_a_model_and_releases_it(server: Server) -> None:
    inflight = in_background(lambda: infer(server, "slow"))
    wait_for(lambda: state(server)["inflight"].get("slow") == 1, "slow in flight")
    stop = httpx.post(f"{server.url}/admin/governance/models/slow/stop?wait_s=20",
                      headers=ADMIN, timeout=30)
    assert stop.status_code == 200, stop.text
    assert stop.json()["inflight"] == 0  # the request admitted before the stop finished...
    assert inflight.result(timeout=30).status_code == 200  # ...with its answer
    r = infer(server, "slow")
    assert r.status_code == 503
    assert r.json()["error"] == ("model 'slow' is stopped by an operator (kill switch); "
                                 "requests are refused until it is released")
    assert infer(server, "flights").status_code == 200  # other models are untouched
    s = state(server)
    assert s["stopped"]["models"] == ["slow"]
    assert "kill switches: model slow stopped" in s["summary"]
    assert metric(server.url, "scalelab_governance_stopped", kind="model", name="slow") == 1
    rel = httpx.post(f"{server.url}/admin/governance/models/slow/release", headers=ADMIN,
                     timeout=10)
    assert rel.status_code == 200 and rel.json()["stopped"] is False
    assert infer(server, "slow").status_code == 200
    assert metric(server.url, "scalelab_governance_stopped", kind="model", name="slow") == 0


def test_kill_switch_stops_one_client_with_403(server: Server) -> None:
    url = f"{server.url}/admin/governance/clients/stoppable"
    assert httpx.post(url + "/stop", headers=ADMIN, timeout=10).status_code == 200
    r = infer(server, headers=key("stoppable"))
    assert r.status_code == 403 and "client 'stoppable' is stopped" in r.json()["error"]
    assert infer(server).status_code == 200  # the default class is another client
    assert httpx.post(url + "/release", headers=ADMIN, timeout=10).status_code == 200
    assert infer(server, headers=key("stoppable")).status_code == 200


def test_admin_needs_the_token(server: Server) -> None:
    base = f"{server.url}/admin/governance"
    none = httpx.post(base + "/models/flights/stop", timeout=10)
    assert none.status_code == 401 and none.headers["www-authenticate"] == "Bearer"
    wrong = httpx.get(base, headers={"Authorization": "Bearer nope"}, timeout=10)
    assert wrong.status_code == 403
    # an API key is not the admin token
    assert httpx.get(base, headers={"Authorization": f"Bearer {KEYS['bursty']}"},
                     timeout=10).status_code == 403
    assert state(server)["stopped"]["models"] == []
    unknown = httpx.post(base + "/clients/nobody/stop", headers=ADMIN, timeout=10)
    assert unknown.status_code == 404 and "no client 'nobody'" in unknown.json()["error"]


def test_malformed_config_is_one_line_and_exit_2(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "gov.yaml"
    bad.write_text("governance:\n  clients:\n    batch-jobs:\n      rate: -5\n", "utf-8")
    code = cli_run(["serve", "--model-repo", str(tmp_path), "--governance", str(bad)])
    err = capsys.readouterr().err
    assert code == 2
    assert "governance.clients.batch-jobs.rate: Input should be greater than 0" in err
    assert str(bad) in err.replace("\n", "") and "Traceback" not in err


@pytest.fixture(scope="module")
def generator(tmp_path_factory: pytest.TempPathFactory,
              monkeypatch_module: pytest.MonkeyPatch) -> Iterator[str]:
    """The generative server on the tiny model, under uvicorn on 127.0.0.1 in a thread of
    this process (torch is imported already: a process would spend ~15 s starting)."""
    import uvicorn

    from scalelab.system.generate.app import ApiSettings, build_app, engine_from_settings, wrap

    gov = tmp_path_factory.mktemp("gengov") / "gov.yaml"
    gov.write_text("governance:\n  default:\n    budgets:\n"
                   "      - {unit: tokens, period: day, limit: 20}\n", "utf-8")
    monkeypatch_module.setenv("SCALELAB_ADMIN_TOKEN", TOKEN)
    settings = ApiSettings(model="tiny", engine={"max_model_len": 256, "block_size": 8,
                                                 "kv_cache_bytes": 2 << 20},
                           governance_file=str(gov))
    app = wrap(build_app(settings, engine_from_settings(settings)), settings)
    port = free_port()
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None,
                                        access_log=False, lifespan="on"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: srv.started, "the generative server to start", deadline_s=60)
    yield url
    srv.should_exit = True
    thread.join(timeout=30)


@pytest.fixture(scope="module")
def monkeypatch_module() -> Iterator[pytest.MonkeyPatch]:
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def test_generative_server_charges_reported_tokens(generator: str) -> None:
    body = {"model": "tiny-llama", "prompt": "hello", "max_tokens": 7, "temperature": 0,
            "ignore_eos": True}
    first = httpx.post(generator + "/v1/completions", json=body, timeout=60)
    assert first.status_code == 200 and first.json()["usage"]["total_tokens"] == 12
    streamed = httpx.post(generator + "/v1/completions", json={**body, "stream": True},
                          timeout=60)
    assert streamed.status_code == 200 and "[DONE]" in streamed.text
    r = httpx.post(generator + "/v1/completions", json=body, timeout=60)
    assert r.status_code == 429
    err = r.json()["error"]
    assert "client 'default' used its budget of 20 tokens per day (24 tokens used)" in \
        err["message"]
    assert err["type"] == "rate_limit_exceeded"  # OpenAI's shape: its clients back off
    s = httpx.get(generator + "/admin/governance", headers=ADMIN, timeout=10).json()
    assert s["clients"]["default"]["budgets"][0]["used"] == 24.0
    assert metric(generator, "scalelab_budget_used", client="default", unit="tokens") \
        == 24.0
