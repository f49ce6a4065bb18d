"""Several workers on one port with metrics merged across them, and the access log modes, on
real server processes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from serve_client import fire, samples, wait_for
from serve_fixtures import add_model, infer_body, start_server


@pytest.fixture(scope="module")
def small_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One model: each worker process loads the whole repository, so keep it small."""
    root = tmp_path_factory.mktemp("small-repo")
    add_model(root, "flights", {1: 1, 2: 2})
    return root


def infer_lines(log: str) -> list[dict[str, object]]:
    out = []
    for line in log.splitlines():
        if line.startswith("{"):
            rec = json.loads(line)
            if rec.get("logger") == "scalelab.system.serve.access":
                out.append(rec)
    return out


def test_two_workers_merge_counters_and_histograms(small_repo: Path, tmp_path: Path) -> None:
    # two processes import torch at once: slow to start on a busy 2-core machine
    srv = start_server(small_repo, tmp_path / "server.log", "--workers", "2",
                       "--torch-threads", "1", "--access-log", "off", deadline_s=180)
    try:
        rs = fire(f"{srv.url}/v2/models/flights/infer", 24, lambda i: infer_body(1, seed=i))
        assert [r.status_code for r in rs] == [200] * 24
        url = srv.url
        wait_for(lambda: samples(url, "scalelab_responses_total", model="flights",
                                 status="200") == 24, "24 responses counted across workers")
        # every histogram sums over both processes: one observation per request or row
        assert samples(url, "scalelab_request_duration_seconds_count", model="flights") == 24
        assert samples(url, "scalelab_batch_size_sum", model="flights") == 24
        assert samples(url, "scalelab_queue_wait_seconds_count", model="flights") == 24
        assert samples(url, "scalelab_inflight_requests", model="flights") == 0
        pids = {r.headers.get("x-request-id") for r in rs}
        assert len(pids) == 24  # ids are unique whichever worker answered
        assert infer_lines(srv.logs()) == []  # --access-log off
    finally:
        srv.stop()


def test_access_log_full_writes_one_line_per_request(small_repo: Path, tmp_path: Path) -> None:
    srv = start_server(small_repo, tmp_path / "server.log", "--access-log", "full")
    try:
        rs = fire(f"{srv.url}/v2/models/flights/infer", 12, lambda i: infer_body(1, seed=i),
                  headers=lambda i: {"X-Request-Id": f"full-{i}"})
        assert all(r.status_code == 200 for r in rs)
        bad = fire(f"{srv.url}/v2/models/flights/infer", 3, lambda i: {"inputs": []},
                   headers=lambda i: {"X-Request-Id": f"bad-{i}"})
        assert all(r.status_code == 422 for r in bad)

        def lines() -> list[dict[str, object]]:
            return [r for r in infer_lines(srv.logs())
                    if str(r.get("request_id", "")).startswith(("full-", "bad-"))]

        wait_for(lambda: len(lines()) == 15, "15 access lines")
        recs = {str(r["request_id"]): r for r in lines()}
        assert {recs[f"full-{i}"]["status"] for i in range(12)} == {200}
        assert {recs[f"bad-{i}"]["status"] for i in range(3)} == {422}
        r0 = recs["full-0"]
        assert r0["model"] == "flights" and r0["version"] == "2" and r0["msg"] == "infer"
        assert isinstance(r0["latency_ms"], float) and "skipped" not in r0
    finally:
        srv.stop()
