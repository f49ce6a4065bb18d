"""`scalelab deploy load-job`: the scheduler and worker manifests validate strictly against the
Kubernetes schema, and the workers join the scheduler the Service names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from requires import requires
from scalelab.cli import run
from scalelab.lab.core.errors import BadUsageError
from scalelab.lab.load.k8s import LoadJobSpec, manifests

kv = requires("kubernetes_validate")


def test_scheduler_and_workers_validate_and_agree_on_the_address() -> None:
    docs = manifests(LoadJobSpec(name="gen", workers=5, cpu="2"))
    for doc in [*docs["scheduler.yaml"], *docs["workers.yaml"]]:
        kv.validate(doc, kv.utils.latest_version(), strict=True)
    deploy, service = docs["scheduler.yaml"]
    (workers,) = docs["workers.yaml"]
    assert service["metadata"]["name"] == "gen-scheduler" and service["kind"] == "Service"
    assert service["spec"]["selector"] == deploy["spec"]["template"]["metadata"]["labels"]
    assert workers["spec"]["replicas"] == 5
    pod = workers["spec"]["template"]["spec"]
    cmd = pod["containers"][0]["command"]
    # Workers join the Service's address, one generator thread each.
    assert cmd[:3] == ["dask", "worker", "tcp://gen-scheduler:8786"]
    assert cmd[cmd.index("--nthreads") + 1] == "1"
    assert pod["containers"][0]["resources"]["limits"]["cpu"] == "2"
    assert pod["topologySpreadConstraints"][0]["topologyKey"] == "kubernetes.io/hostname"


def test_cli_writes_plain_yaml(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["deploy", "load-job", "--out", str(tmp_path), "--workers", "3", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["cluster"] == "tcp://scalelab-load-scheduler:8786"
    text = (tmp_path / "scheduler.yaml").read_text(encoding="utf-8")
    assert "&id" not in text
    assert [x["kind"] for x in yaml.safe_load_all(text)] == ["Deployment", "Service"]
    assert run(["deploy", "load-job", "--out", str(tmp_path), "--workers", "0"]) == 2
    with pytest.raises(BadUsageError, match="DNS label"):
        LoadJobSpec(name="Bad_Name")
