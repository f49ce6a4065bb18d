"""`scalelab deploy train-job`: the Indexed Job and headless Service validate strictly against
the Kubernetes schema; every pod runs the same multi-node `scalelab train` command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from requires import requires
from scalelab.cli import run
from scalelab.lab.core.errors import BadUsageError
from scalelab.system.train.parallel.k8s import TrainJobSpec, manifests

kv = requires("kubernetes_validate")


def test_job_and_service_validate_and_agree_on_the_endpoint() -> None:
    docs = manifests(TrainJobSpec(nodes=3, nproc_per_node=2, args=["--strategy", "fsdp"]))
    for name in ("service.yaml", "job.yaml"):
        kv.validate(docs[name], kv.utils.latest_version(), strict=True)
    job = docs["job.yaml"]["spec"]
    cmd = job["template"]["spec"]["containers"][0]["command"]
    assert (job["completions"], job["completionMode"]) == (3, "Indexed")
    assert cmd[cmd.index("--nnodes") + 1] == "3" and cmd[cmd.index("--nproc") + 1] == "2"
    host = cmd[cmd.index("--rdzv-endpoint") + 1].split(":")[0]
    # Pod 0's DNS name under the headless Service hosts the rendezvous.
    assert host == f"{job['template']['spec']['subdomain']}-0.scalelab-train"
    assert docs["service.yaml"]["spec"]["clusterIP"] == "None"
    assert cmd[-2:] == ["--strategy", "fsdp"]
    el = docs["pytorchjob.yaml"]["spec"]["elasticPolicy"]
    assert (el["rdzvBackend"], el["minReplicas"]) == ("c10d", 3)


def test_cli_writes_plain_yaml(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["deploy", "train-job", "--out", str(tmp_path), "--json", "--", "--steps",
                "100"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["command"][-2:] == ["--steps", "100"]
    text = (tmp_path / "job.yaml").read_text(encoding="utf-8")
    assert "&id" not in text and yaml.safe_load(text)["kind"] == "Job"
    with pytest.raises(BadUsageError, match="DNS label"):
        TrainJobSpec(name="Bad_Name")
