"""A model and a feature version that do not match are refused by the server (a real process on
127.0.0.1), while the matching version next to it serves."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import polars as pl

from scalelab.layers.nets.feature_version import mismatch
from scalelab.system.online.features import FeatureSpec
from scalelab.system.online.learner import Learner, TrainConfig
from scalelab.system.online.stream import ReplayConfig, build_stream

TOKEN = "online-test-token"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _repo(root: Path) -> tuple[str, str]:
    s = build_stream(ReplayConfig(start="2013-01-01T00", end="2013-01-03T00"))
    ev = s.events
    a = FeatureSpec.fit(ev.filter(pl.col("origin") != "LGA"))
    b = FeatureSpec.fit(ev)  # other vocabularies: another feature version
    assert a.version != b.version
    cfg = TrainConfig(hidden=[8])
    Learner(a, cfg).save(root, "flights", manifest={})
    v2 = Learner(a, cfg).save(root, "flights", manifest={})
    # someone ships version 2 with the newer preprocess.json beside the old weights
    (v2 / "preprocess.json").write_text(json.dumps(b.to_dict()), encoding="utf-8")
    return a.version, b.version


def test_the_server_refuses_a_model_with_another_feature_version(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    trained, shipped = _repo(repo)
    assert mismatch(repo / "flights" / "1") is None
    reason = mismatch(repo / "flights" / "2")
    assert reason is not None and trained in reason and shipped in reason

    port = _free_port()
    env = {**os.environ, "SCALELAB_ADMIN_TOKEN": TOKEN}
    proc = subprocess.Popen([sys.executable, "-m", "scalelab", "serve", "--model-repo",
                             str(repo), "--port", str(port)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:  # poll readiness (the server answers once its models are loaded)
            assert proc.poll() is None, "server exited"
            assert time.monotonic() < deadline, "server not ready"
            try:
                if httpx.get(f"{url}/v2/health/ready", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        assert httpx.get(f"{url}/v2/models/flights/versions/1/ready").status_code == 200
        assert httpx.get(f"{url}/v2/models/flights/versions/2/ready").status_code == 503
        index = httpx.post(f"{url}/v2/repository/index",
                           headers={"Authorization": f"Bearer {TOKEN}"}).json()
        v2 = next(e for e in index if e.get("version") == "2")
        assert v2["state"] == "UNAVAILABLE" and "feature version mismatch" in v2["reason"]
        body = {"inputs": [
            {"name": "categorical", "datatype": "INT64", "shape": [1, 4], "data": [1, 1, 1, 1]},
            {"name": "numeric", "datatype": "FP32", "shape": [1, 14], "data": [0.0] * 14}]}
        r = httpx.post(f"{url}/v2/models/flights/versions/2/infer", json=body)
        assert r.status_code == 503 and "feature version" in r.text
        assert httpx.post(f"{url}/v2/models/flights/versions/1/infer",
                          json=body).status_code == 200
    finally:
        proc.terminate()
        proc.wait(timeout=30)
