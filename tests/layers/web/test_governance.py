"""The Governor with injected clocks (exact transitions) and its config's errors."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from scalelab.lab.core.errors import BadInputError
from scalelab.layers.web.governance.config import load_governance, parse_governance
from scalelab.layers.web.governance.governor import Governor, GovernorCollector, summary

DAY0 = 1_796_169_600.0  # 2026-12-02T00:00:00Z


class Clocks:
    """Monotonic, wall and CPU clocks a test moves by hand."""

    def __init__(self) -> None:
        self.mono, self.wall, self.cpu = 100.0, DAY0 + 3600.0, 0.0

    def kw(self) -> dict[str, Any]:
        return {"clock": lambda: self.mono, "wall": lambda: self.wall, "cpu": lambda: self.cpu}


def gov(doc: dict[str, Any], clocks: Clocks) -> Governor:
    return Governor(parse_governance(doc, "test.yaml"), **clocks.kw())


def hdr(**h: str) -> list[tuple[bytes, bytes]]:
    return [(k.replace("_", "-").encode(), v.encode()) for k, v in h.items()]


def metric(g: Governor, family: str, **labels: str) -> float:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(GovernorCollector(g))
    for fam in text_string_to_metric_families(generate_latest(reg).decode()):
        for s in fam.samples:
            if s.name == family and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    raise AssertionError(f"no sample {family} {labels}")


def test_identity_by_key_header_or_default_and_the_key_is_never_the_name() -> None:
    c = Clocks()
    key = "sk-batch-0123456789"
    g = gov({"client_header": "X-Client-Id",
             "clients": {"batch-jobs": {"keys": [key]},
                         "hashed": {"keys_sha256": [hashlib.sha256(b"sk-hashed-99").hexdigest()]},
                         "dash": {}}}, c)
    assert g.identify(hdr(authorization=f"Bearer {key}")).name == "batch-jobs"
    assert g.identify(hdr(x_api_key="sk-hashed-99")).name == "hashed"
    assert g.identify(hdr(x_client_id="dash")).name == "dash"
    # a header cannot claim a client that has keys; an unknown key is the default class
    assert g.identify(hdr(x_client_id="batch-jobs")).name == "default"
    assert g.identify(hdr(authorization="Bearer sk-unknown-000")).name == "default"
    assert g.identify([]).name == "default"
    assert key not in str(g.state())


def test_burst_then_429_naming_the_limit_then_release_after_refill() -> None:
    c = Clocks()
    g = gov({"clients": {"batch-jobs": {"keys": ["sk-batch-0123456789"], "rate": 4,
                                        "burst": 2}}}, c)
    cl = g.client("batch-jobs")
    assert g.admit(cl, "flights") is None
    g.release(cl, "flights")
    assert g.admit(cl, "flights") is None
    g.release(cl, "flights")
    r = g.admit(cl, "flights")
    assert r is not None and r.status == 429 and r.reason == "rate"
    assert r.message == "client 'batch-jobs' over its rate limit of 4 req/s (burst 2)"
    assert r.retry_after_s == 1  # 0.25 s to a token, rounded up
    c.mono += 0.25
    assert g.admit(cl, "flights") is None
    assert metric(g, "scalelab_governance_refusals_total", client="batch-jobs",
                  reason="rate") == 1.0


def test_concurrency_cap_refuses_while_full_and_admits_after_a_release() -> None:
    c = Clocks()
    g = gov({"default": {"max_concurrency": 2}}, c)
    d = g.default
    assert g.admit(d, "m") is None and g.admit(d, "m") is None
    r = g.admit(d, "m")
    assert r is not None and (r.status, r.reason, r.retry_after_s) == (429, "concurrency", 1)
    assert r.message == "client 'default' over its concurrency cap of 2 requests in flight"
    g.release(d, "m")
    assert g.admit(d, "m") is None
    assert g.state()["clients"]["default"]["inflight"] == 2


def test_request_budget_exhausts_and_resets_at_the_utc_window() -> None:
    c = Clocks()
    g = gov({"default": {"budgets": [{"unit": "requests", "period": "day", "limit": 3}]},
             "models": {"flights": {"budgets": [{"unit": "requests", "period": "hour",
                                                 "limit": 2}]}}}, c)
    d = g.default
    assert g.admit(d, "flights") is None and g.admit(d, "flights") is None
    r = g.admit(d, "flights")  # the model's hourly budget of 2 is spent first
    assert r is not None and r.reason == "budget"
    assert r.message == ("model 'flights' used its budget of 2 requests per hour (2 requests "
                         "used); it resets at 2026-12-02T02:00:00Z")
    assert r.retry_after_s == 3600
    assert g.admit(d, "other") is None  # the client's daily budget: 3 of 3 now
    r = g.admit(d, "other")
    assert r is not None and r.message.startswith(
        "client 'default' used its budget of 3 requests per day (3 requests used); it "
        "resets at 2026-12-03T00:00:00Z")
    assert metric(g, "scalelab_budget_used", client="default", model="*", unit="requests",
                  period="day") == 3.0
    assert metric(g, "scalelab_budget_limit", client="*", model="flights", unit="requests",
                  period="hour") == 2.0
    c.wall = DAY0 + 86400.0  # the next UTC day: both windows roll
    assert g.admit(d, "flights") is None
    assert metric(g, "scalelab_budget_used", client="default", model="*", unit="requests",
                  period="day") == 1.0


def test_token_budget_charges_what_the_server_reports() -> None:
    c = Clocks()
    g = gov({"clients": {"chat": {"keys": ["sk-chat-0123456789"],
                                  "budgets": [{"unit": "tokens", "period": "minute",
                                               "limit": 100}]}}}, c)
    cl = g.client("chat")
    assert g.admit(cl, "tiny") is None
    g.release(cl, "tiny", {"tokens": 60.0})
    assert g.admit(cl, "tiny") is None  # 60 < 100: admitted, and it runs past the limit
    g.release(cl, "tiny", {"tokens": 60.0})
    r = g.admit(cl, "tiny")
    assert r is not None and r.message.startswith(
        "client 'chat' used its budget of 100 tokens per minute (120 tokens used)")
    c.wall += 60.0
    assert g.admit(cl, "tiny") is None


def test_core_seconds_share_the_measured_cpu_among_finished_requests() -> None:
    c = Clocks()
    g = gov({"cpu_tick_s": 1.0, "clients": {
        "a": {"keys": ["sk-aaaaaaaaaa"], "budgets": [{"unit": "core_seconds", "period": "hour",
                                                       "limit": 1.5}]},
        "b": {"keys": ["sk-bbbbbbbbbb"], "budgets": [{"unit": "core_seconds", "period": "hour",
                                                       "limit": 10}]}}}, c)
    a, b = g.client("a"), g.client("b")
    for cl in (a, b, b):
        assert g.admit(cl, "m") is None
    c.cpu = 3.0  # 3 core-seconds burnt while they ran
    g.release(a, "m")
    g.release(b, "m")
    c.mono += 1.0
    g.release(b, "m")  # closes the tick: a gets 1 of 3, b 2 of 3
    s = g.state()["clients"]
    assert s["a"]["budgets"][0]["used"] == 1.0 and s["b"]["budgets"][0]["used"] == 2.0
    assert g.admit(a, "m") is None
    c.cpu = 4.0
    c.mono += 1.0
    g.release(a, "m")
    r = g.admit(a, "m")
    assert r is not None and r.message.startswith(
        "client 'a' used its budget of 1.5 core-seconds per hour (2 core-seconds used)")


def test_kill_switch_stops_a_model_or_a_client_at_once_and_is_reversible() -> None:
    c = Clocks()
    g = gov({"client_stop_status": 429,
             "clients": {"batch-jobs": {"keys": ["sk-batch-0123456789"]}}}, c)
    cl, d = g.client("batch-jobs"), g.default
    assert g.admit(d, "flights") is None  # in flight before the stop: it finishes
    g.stop_model("flights")
    r = g.admit(cl, "flights")
    assert r is not None and (r.status, r.reason) == (503, "stopped_model")
    assert g.admit(cl, "other") is None
    assert g.inflight_of("models", "flights") == 1
    g.release(d, "flights")
    assert g.inflight_of("models", "flights") == 0
    cl.stopped = True
    r = g.admit(cl, "other")
    assert r is not None and (r.status, r.reason) == (429, "stopped_client")
    assert g.summary() == "kill switches: model flights, client batch-jobs stopped"
    assert metric(g, "scalelab_governance_stopped", kind="model", name="flights") == 1.0
    g.release_model("flights")
    cl.stopped = False
    assert g.admit(cl, "flights") is None
    assert metric(g, "scalelab_governance_stopped", kind="model", name="flights") == 0.0
    assert g.summary() == "kill switches: none engaged"
    with pytest.raises(KeyError, match="no client 'nobody'"):
        g.client("nobody")


def test_summary_is_the_sheets_governance_cell() -> None:
    cfg = parse_governance({"governance": {
        "default": {"rate": 100, "budgets": [{"unit": "requests", "period": "day",
                                              "limit": 1_000_000}]},
        "clients": {"batch-jobs": {"keys": ["sk-batch-0123456789"], "rate": 50, "burst": 100,
                                   "max_concurrency": 4}}}}, "f.yaml")
    assert summary(cfg, [], []) == ("rate limits: 2 clients; concurrency caps: 1 client; "
                                    "budgets: requests/day default 1,000,000; kill switches: "
                                    "none engaged")
    assert summary(None, [], []) == "none configured"


@pytest.mark.parametrize(("doc", "message"), [
    ({"clients": {"x": {"rate": 0}}}, "governance.clients.x.rate: Input should be greater"),
    ({"default": {"burst": 3}}, "governance.default: Value error, burst needs a rate"),
    ({"clients": {"x": {"keys": ["short"]}}}, "at least 8 characters"),
    ({"clients": {"default": {}}}, "'default' is reserved"),
    ({"default": {"budgets": [{"unit": "euros", "period": "day", "limit": 1}]}},
     "governance.default.budgets.0.unit"),
    ({"limits": {}}, "governance.limits: Extra inputs are not permitted"),
    ({"clients": {"a": {"keys": ["same-key-123"]}, "b": {"keys": ["same-key-123"]}}},
     "share an API key"),
])
def test_config_errors_name_the_file_and_field(doc: dict[str, Any], message: str) -> None:
    with pytest.raises(BadInputError, match=r"^gov\.yaml: ") as e:
        parse_governance(doc, "gov.yaml")
    assert message in str(e.value)


def test_load_governance_reads_yaml_and_names_unreadable_files(tmp_path: Path) -> None:
    f = tmp_path / "gov.yaml"
    f.write_text("governance:\n  default:\n    rate: 5\n", encoding="utf-8")
    assert load_governance(f).default.rate == 5.0
    f.write_text("governance: [unclosed\n", encoding="utf-8")
    with pytest.raises(BadInputError, match="not valid YAML or JSON"):
        load_governance(f)
    with pytest.raises(BadInputError, match="cannot read it"):
        load_governance(tmp_path / "missing.yaml")


def _asgi(app: Any, method: str, path: str, **kw: Any) -> Any:
    import asyncio

    import httpx

    async def go() -> Any:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://t") as c:
            return await c.request(method, path, **kw)

    return asyncio.run(go())


def test_no_config_means_no_layer_and_admin_routes_say_what_is_wrong() -> None:
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    from scalelab.layers.web.governance.middleware import governed

    async def ok(_: Any) -> PlainTextResponse:
        return PlainTextResponse("ok")

    async def metrics(_: Any) -> PlainTextResponse:
        return PlainTextResponse("app_up 1.0\n")

    app = Starlette(routes=[Route("/work", ok, methods=["POST"]), Route("/metrics", metrics)])
    assert governed(app, None, route=lambda s: None, admin_token="t") is app
    g = governed(app, parse_governance({"default": {"rate": 1, "burst": 1}}, "f"),
                 route=lambda s: "m" if s["path"] == "/work" else None, admin_token="t")
    auth = {"Authorization": "Bearer t"}
    assert _asgi(g, "POST", "/work").status_code == 200
    refused = _asgi(g, "POST", "/work")
    assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
    text = _asgi(g, "GET", "/metrics").text
    assert text.startswith("app_up 1.0\n") and "scalelab_governance_refusals_total" in text
    assert _asgi(g, "POST", "/admin/governance", headers=auth).status_code == 405
    assert _asgi(g, "GET", "/admin/governance/models/m/stop", headers=auth).status_code == 405
    bad = _asgi(g, "POST", "/admin/governance/models/m/pause", headers=auth)
    assert bad.status_code == 404 and "stop|release" in bad.json()["error"]
    wait = _asgi(g, "POST", "/admin/governance/models/m/stop?wait_s=-1", headers=auth)
    assert wait.status_code == 400 and "wait_s" in wait.json()["error"]
    assert _asgi(g, "POST", "/admin/governance/models/bad%20name/stop",
                 headers=auth).status_code == 404
    off = governed(app, parse_governance({}, "f"), route=lambda s: None, admin_token=None)
    assert _asgi(off, "GET", "/admin/governance", headers=auth).status_code == 403


def test_governance_refuses_several_workers(tmp_path: Path) -> None:
    from scalelab.lab.core.errors import BadUsageError
    from scalelab.system.serve.settings import ServerSettings

    s = ServerSettings(model_repo=tmp_path, governance_file="g.yaml")
    assert ServerSettings.from_json(s.to_json()).governance_file == "g.yaml"  # to the workers
    with pytest.raises(BadUsageError, match="--governance keeps its state in one process"):
        ServerSettings(model_repo=tmp_path, workers=2, governance_file="g.yaml")
