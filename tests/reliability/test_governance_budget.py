"""Budget exhaustion under 50 concurrent clients without overspend (issue 35): a real governed
`scalelab serve` process on 127.0.0.1 with a small model budget that 50 clients (each its own
key) race to spend at once. Exactly `limit` requests are admitted, by the server's own
accounting too; every other one is a 429 with Retry-After naming the budget; nothing is left in
flight afterwards.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).parent))

from serve_helpers import Server, add_model, infer_body, start_server

pytestmark = pytest.mark.reliability

TOKEN = "adm1n-token-budget"
CLIENTS = 50
PER_CLIENT = 3
LIMIT = 40
KEYS = {f"c{i:02d}": f"sk-c{i:02d}-0123456789" for i in range(CLIENTS)}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("budget-repo")
    add_model(root, "flights", {1: 1})
    gov = root.parent / "governance.json"
    gov.write_text(json.dumps({"governance": {
        "clients": {name: {"keys": [k]} for name, k in KEYS.items()},
        "models": {"flights": {"budgets": [{"unit": "requests", "period": "day",
                                            "limit": LIMIT}]}}}}), encoding="utf-8")
    srv = start_server(root, root.parent / "server.log", "--admin-token", TOKEN,
                       "--governance", str(gov))
    yield srv
    srv.stop()


def metric(url: str, family: str, **labels: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    total = 0.0
    for fam in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=10).text):
        for sm in fam.samples:
            if sm.name == family and all(sm.labels.get(k) == v for k, v in labels.items()):
                total += sm.value
    return total


def test_50_concurrent_clients_spend_exactly_the_budget_and_no_more(server: Server) -> None:
    start = threading.Barrier(CLIENTS)

    def client(name: str) -> list[httpx.Response]:
        with httpx.Client(headers={"X-API-Key": KEYS[name]}, timeout=60) as c:
            start.wait(timeout=60)  # every client fires together
            return [c.post(f"{server.url}/v2/models/flights/infer", json=infer_body(1))
                    for _ in range(PER_CLIENT)]

    with cf.ThreadPoolExecutor(CLIENTS) as ex:
        answers = [r for rs in ex.map(client, KEYS) for r in rs]
    codes = [r.status_code for r in answers]
    assert len(codes) == CLIENTS * PER_CLIENT
    assert codes.count(200) == LIMIT and codes.count(429) == CLIENTS * PER_CLIENT - LIMIT
    for r in answers:
        if r.status_code == 429:
            assert r.json()["error"].startswith(
                f"model 'flights' used its budget of {LIMIT} requests per day")
            assert 1 <= int(r.headers["retry-after"]) <= 86400
        else:
            assert r.json()["outputs"], r.text

    # the server's own accounting says the same: spent == limit, the rest refused, none in
    # flight (the governor is whole again)
    state = httpx.get(f"{server.url}/admin/governance", timeout=10,
                      headers={"Authorization": f"Bearer {TOKEN}"}).json()
    budget = state["models"]["flights"]["budgets"][0]
    assert (budget["used"], budget["limit"]) == (LIMIT, LIMIT)
    assert state["models"]["flights"]["inflight"] == 0
    assert all(c["inflight"] == 0 for c in state["clients"].values())
    labels = {"model": "flights", "unit": "requests", "period": "day"}
    assert metric(server.url, "scalelab_budget_used", **labels) == LIMIT
    assert metric(server.url, "scalelab_governance_refusals_total", reason="budget") \
        == CLIENTS * PER_CLIENT - LIMIT
    assert metric(server.url, "scalelab_responses_total", model="flights", status="200") \
        == LIMIT
    # once spent, it stays spent: the next request is refused too, and the server lives
    r = httpx.post(f"{server.url}/v2/models/flights/infer", json=infer_body(1), timeout=30,
                   headers={"X-API-Key": KEYS["c00"]})
    assert r.status_code == 429 and server.proc.poll() is None
