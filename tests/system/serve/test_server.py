"""Process-level behaviour: graceful shutdown, admin disabled without a token, several workers."""

from __future__ import annotations

import signal
import threading
from pathlib import Path

import httpx
import pytest
from serve_client import fire, samples, wait_for
from serve_fixtures import add_model, infer_body, start_server


def test_sigterm_finishes_in_flight_requests(tmp_path: Path) -> None:
    # 6 serial requests of 0.5 s each: at least 3 stay in flight for about 1.5 s, a window
    # that a poll every 50 ms catches even on a loaded machine (40 ms rows left ~0.1 s)
    repo = tmp_path / "repo"
    add_model(repo, "drain", {1: 3}, arch="delay_mlp", extra_params={"batch_ms": 500, "row_ms": 0},
              max_batch_size=1, dynamic_batching={"max_queue_size": 8, "max_queue_delay_ms": 1,
                                                  "default_timeout_ms": 30000})
    srv = start_server(repo, tmp_path / "server.log")
    try:
        results: list[httpx.Response] = []
        t = threading.Thread(target=lambda: results.extend(
            fire(f"{srv.url}/v2/models/drain/infer", 6, lambda i: infer_body(1, seed=i))))
        t.start()
        wait_for(lambda: samples(srv.url, "scalelab_inflight_requests", model="drain") >= 3,
                 "requests in flight")
        rc = srv.stop()
        t.join(timeout=60)
        assert [r.status_code for r in results] == [200] * 6
        # uvicorn re-raises SIGTERM after its graceful shutdown, so -15 is a clean exit too
        assert rc in (0, -signal.SIGTERM)
        assert "Application shutdown complete" in srv.logs()
    finally:
        srv.stop()


# A server without an admin token refuses every admin call (403, "disabled"):
# tests/reliability/test_serve_abuse.py::test_admin_disabled_without_a_configured_token.


@pytest.mark.slow
def test_two_workers_merge_metrics(repo: Path, tmp_path: Path) -> None:
    srv = start_server(repo, tmp_path / "server.log", "--workers", "2", "--torch-threads", "1")
    try:
        rs = fire(f"{srv.url}/v2/models/flights/infer", 20, lambda i: infer_body(1, seed=i))
        assert all(r.status_code == 200 for r in rs)
        wait_for(lambda: samples(srv.url, "scalelab_responses_total", model="flights",
                                 status="200") == 20, "20 responses counted across workers")
    finally:
        srv.stop()
