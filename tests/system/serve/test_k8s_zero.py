"""Scale to zero in the manifests: an External metric, or a refusal that names what is needed;
and the cold starts it costs, from the real server's start-up measured on this machine."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest
import yaml
from serve_fixtures import add_model

from requires import requires
from scalelab.cli import run
from scalelab.lab.core.errors import BadUsageError
from scalelab.lab.core.records import Latency, append_records, make_record
from scalelab.system.serve.k8s import DeploySpec, manifests

kv = requires("kubernetes_validate")


def test_min_zero_writes_an_external_metric_hpa() -> None:
    docs = manifests(DeploySpec(min_replicas=0, max_replicas=5, target=4, startup_s=12,
                                external_metric="gateway_queued_requests"))
    for doc in docs.values():
        kv.validate(doc, kv.utils.latest_version(), strict=True)
    hpa = docs["hpa.yaml"]["spec"]
    assert (hpa["minReplicas"], hpa["maxReplicas"]) == (0, 5)
    assert hpa["metrics"] == [{"type": "External", "external": {
        "metric": {"name": "gateway_queued_requests",
                   "selector": {"matchLabels": {"service": "scalelab-serve"}}},
        "target": {"type": "AverageValue", "averageValue": "4"}}}]
    assert docs["deployment.yaml"]["spec"]["replicas"] == 0


@pytest.mark.parametrize(("kw", "match"), [
    ({}, "needs --external-metric NAME: the HPA scales from zero only on an Object or External"),
    ({"signal": "cpu", "external_metric": "q"}, "cannot scale on cpu"),
    ({"external_metric": " "}, "must name a metric"),
])
def test_min_zero_without_a_usable_metric_is_refused(kw: dict, match: str) -> None:
    with pytest.raises(BadUsageError, match=match):
        DeploySpec(min_replicas=0, startup_s=5, **kw)


def test_cli_min_zero(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    argv = ["deploy", "k8s", "--model-repo", str(repo), "--out", str(tmp_path / "k8s"),
            "--min", "0", "--startup-seconds", "9"]
    # Refused before any start-up measurement (none is given here either way).
    assert run(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "scalelab_queue_depth vanishes with its last pod" in err
    assert run([*argv, "--external-metric", "gateway_queued_requests", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    hpa = yaml.safe_load((tmp_path / "k8s" / "hpa.yaml").read_text())
    assert out["startup_seconds"] == 9 and hpa["spec"]["minReplicas"] == 0
    assert hpa["spec"]["metrics"][0]["type"] == "External"


def test_cold_starts_follow_the_measured_startup(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """`autoscale simulate --min 0 --startup measure`: the server is started here and timed to
    ready, and the cold starts are those of that start-up. Nothing until t=99, 100 req/s for
    t=100..399: the HPA's sync at t=105 asks for 2 pods from zero, ready ceil(S) s later, so
    the requests of t=100..(104 + ceil(S)) wait, the first of them 5 + ceil(S) s."""
    repo = tmp_path / "repo"
    add_model(repo, "flights", {1: 1})
    lat = Latency(p50_ms=10, p90_ms=12, p95_ms=15, p99_ms=20, p999_ms=25, max_ms=30)
    recs = tmp_path / "cap.jsonl"
    append_records(recs, [make_record(experiment="cap", stage="load", variable="rate", level=lv,
                                      rate=lv, latency=lat,
                                      extras={"offered_rps": lv, "mean_ms": 11.0,
                                              "slo": "p95<50ms"}) for lv in (50.0, 100.0)])
    tr = tmp_path / "t.csv"
    tr.write_text("time,rate\n0,0\n99,0\n100,100\n399,100\n400,0\n1200,0\n")
    t0 = time.monotonic()
    assert run(["autoscale", "simulate", "--capacity", str(recs), "--trace", str(tr),
                "--signal", "rps", "--target", "50", "--metric-window", "1s", "--min", "0",
                "--external", "--startup", "measure", "--model-repo", str(repo),
                "--json"]) == 0
    elapsed = time.monotonic() - t0
    doc = json.loads(capsys.readouterr().out)
    startup = doc["startup_s"]
    # Measured within this call (a given or default start-up would not have to fit in it);
    # no bound of its own: how fast a server starts depends on the machine.
    assert doc["startup_measured"] is True and 0 < startup < elapsed
    (zero,) = doc["scale_to_zero"]
    waited = 5 + math.ceil(startup)
    assert zero["startup_s"] == startup
    assert (zero["cold_requests"], zero["added_max_ms"]) == (100.0 * waited, 1000.0 * waited)
    assert [(d["t_s"], d["current"], d["desired"]) for d in doc["results"][0]["decisions"]] \
        == [(105.0, 0, 2), (705.0, 2, 0)]
