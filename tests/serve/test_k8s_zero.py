"""Scale to zero in the manifests: an External metric, or a refusal that names what is needed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from scalelab.cli import run
from scalelab.core.errors import BadUsageError
from scalelab.serve.k8s import DeploySpec, manifests

kv = pytest.importorskip("kubernetes_validate")


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
