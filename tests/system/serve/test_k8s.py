"""Manifests: valid against the Kubernetes schemas, and startup-aware scaling behaviour."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from requires import requires
from scalelab.cli import run
from scalelab.system.serve.k8s import DeploySpec, behavior, manifests

kv = requires("kubernetes_validate")


def validate(doc: dict[str, object]) -> None:
    kv.validate(doc, kv.utils.latest_version(), strict=True)


@pytest.mark.parametrize("signal", ["queue", "inflight", "cpu"])
def test_manifests_validate_strictly(signal: str) -> None:
    docs = manifests(DeploySpec(signal=signal, startup_s=42, min_replicas=2,  # type: ignore[arg-type]
                                max_replicas=7))
    for doc in docs.values():
        validate(doc)
    hpa = docs["hpa.yaml"]["spec"]
    assert (hpa["minReplicas"], hpa["maxReplicas"]) == (2, 7)
    metric = hpa["metrics"][0]
    if signal == "cpu":
        assert metric["resource"]["target"] == {"type": "Utilization", "averageUtilization": 70}
    else:
        assert metric["type"] == "Pods"
        names = {"queue": "scalelab_queue_depth", "inflight": "scalelab_inflight_requests"}
        assert metric["pods"]["metric"]["name"] == names[signal]
    pod = docs["deployment.yaml"]["spec"]["template"]["spec"]["containers"][0]
    assert pod["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert pod["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert pod["startupProbe"]["failureThreshold"] == 68  # ceil(3 * 42 / 2) + 5


def test_behavior_follows_startup_time() -> None:
    fast, slow = behavior(5), behavior(120)
    assert fast["scaleUp"]["policies"][0]["periodSeconds"] == 15
    assert slow["scaleUp"]["policies"][0]["periodSeconds"] == 120
    assert fast["scaleDown"]["stabilizationWindowSeconds"] == 300
    assert slow["scaleDown"]["stabilizationWindowSeconds"] == 360


def test_cli_writes_valid_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    rc = run(["deploy", "k8s", "--model-repo", str(repo), "--out", str(tmp_path / "k8s"),
              "--signal", "inflight", "--min", "1", "--max", "4", "--startup-seconds", "20",
              "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["startup_measured"] is False and len(out["files"]) == 3
    for f in out["files"]:
        text = Path(f).read_text()
        validate(yaml.safe_load(text))
        # written through deploy.kube: the labels shared by three places are plain copies
        assert "&id" not in text and "*id" not in text
    assert run(["deploy", "k8s", "--model-repo", str(repo), "--out", str(tmp_path / "x"),
                "--min", "5", "--max", "2", "--startup-seconds", "1"]) == 2
    assert "--min" in capsys.readouterr().err


@pytest.mark.slow
def test_cli_measures_startup(repo: Path, tmp_path: Path,
                              capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["deploy", "k8s", "--model-repo", str(repo), "--out", str(tmp_path),
                "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["startup_measured"] is True and out["startup_seconds"] > 0
