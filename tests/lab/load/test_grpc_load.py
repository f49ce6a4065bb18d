"""`scalelab load grpc://HOST:PORT/MODEL`: the same open-loop schedule, histograms and records
over the KServe v2 gRPC protocol, against a real `scalelab serve --grpc-port`."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from requires import requires
from scalelab.cli import run
from scalelab.lab.core.records import read_records

requires("grpc")
# the serve tests' model repository and server helpers (one tiny flights-like model)
sys.path.insert(0, str(Path(__file__).parents[2] / "system" / "serve"))
from serve_fixtures import Server, add_model, free_port, start_server  # noqa: E402


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, int]]:
    root = tmp_path_factory.mktemp("repo")
    add_model(root, "flights", {1: 1})
    port = free_port()
    srv = start_server(root, tmp_path_factory.mktemp("log") / "server.log",
                       "--grpc-port", str(port))
    yield srv, port
    srv.stop()


def test_open_loop_over_grpc(served: tuple[Server, int], tmp_path: Path,
                             capsys: pytest.CaptureFixture[str]) -> None:
    srv, port = served
    recs = tmp_path / "load.jsonl"
    rc = run(["load", f"grpc://127.0.0.1:{port}/flights", "--rate", "50", "--requests", "60",
              "--warmup", "0s", "--no-cold-start", "--batch", "2", "--records", str(recs),
              "--json"])
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["payload"] == "oip (grpc)"
    lv = doc["levels"][0]
    assert (lv["requests"], lv["successes"], lv["failures"]) == (60, 60, 0)
    got = read_records(recs)
    assert [(r.stage, r.variable, r.level) for r in got] == [("load", "rate", 50.0)]
    assert got[0].latency is not None and got[0].latency.p50_ms is not None
    # the server saw exactly these: 60 requests of 2 rows, through the shared batcher
    stats = httpx.get(f"{srv.url}/v2/models/flights/stats").json()["model_stats"][0]
    assert stats["inference_count"] == 120
    assert stats["inference_stats"]["success"]["count"] == 60


@pytest.mark.parametrize(("args", "message"), [
    (["grpc://127.0.0.1:1"], "a grpc:// URL needs the model"),
    (["grpc://127.0.0.1:1/m", "--payload", "get"], "--payload get is HTTP-only"),
    (["grpc://127.0.0.1:1/m", "--model", "n"], "the URL names model 'm' but --model is 'n'"),
])
def test_bad_grpc_usage_exits_2(args: list[str], message: str,
                                capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["load", *args, "--rate", "10", "--requests", "5"]) == 2
    assert message in capsys.readouterr().err


def test_errors_keep_their_status(served: tuple[Server, int],
                                  capsys: pytest.CaptureFixture[str]) -> None:
    _, port = served
    rc = run(["load", f"grpc://127.0.0.1:{port}/flights", "--model-version", "9", "--rate",
              "20", "--requests", "10", "--warmup", "0s", "--no-cold-start", "--json"])
    assert rc == 1  # measured (and printed), and every request failed: exit 1
    out = capsys.readouterr()
    lv = json.loads(out.out)["levels"][0]
    assert lv["failures"] == 10 and lv["errors_by_status"] == {"404": 10}
    assert out.err.strip() == "every request failed (10 sent): 404: check the path"
