"""Manifests for running the transformer trainer on a Kubernetes cluster, one pod per node.

Two forms of the same job:
- `job.yaml` + `service.yaml`: a plain batch/v1 Indexed Job with a headless Service, which any
  cluster runs. Pod i is `<name>-i.<name>`; pod 0 hosts the c10d rendezvous (its hostname is the
  endpoint's), every pod runs the same `scalelab train --model transformer --nnodes N ...`, and a
  ReadWriteMany claim mounted at /shared holds the run directory and the checkpoints, so a
  restarted pod (the Job's backoffLimit, torchrun's --max-restarts) resumes from the newest one.
- `pytorchjob.yaml`: the Kubeflow training operator's PyTorchJob (kubeflow.org/v1) with an
  elastic policy, where that operator is installed.
This is the path the two-node rehearsal (`multinode.py`) stands in for on one machine.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scalelab.lab.core.errors import BadUsageError
from scalelab.layers.deploy.kube import app_labels, check_name, resources, write_manifests

PORT = 29400


@dataclass(frozen=True, kw_only=True)
class TrainJobSpec:
    """One distributed training job."""

    name: str = "scalelab-train"
    """Job, Service and rendezvous id (a DNS label)."""
    image: str = "scalelab:latest"
    nodes: int = 2
    """Pods, one per machine."""
    nproc_per_node: int = 1
    """Worker processes per pod (GPUs per machine on a GPU cluster)."""
    claim: str = "scalelab-train"
    """ReadWriteMany PersistentVolumeClaim mounted at /shared (run directory, checkpoints)."""
    cpu: str = "2"
    memory: str = "4Gi"
    max_restarts: int = 3
    """torchrun restarts of a node's worker group before the pod fails."""
    args: list[str] = field(default_factory=list)
    """Further `scalelab train` options (strategy, model size, steps, ...)."""

    def __post_init__(self) -> None:
        check_name(self.name, most=50)
        if self.nodes < 1 or self.nproc_per_node < 1 or self.max_restarts < 0:
            raise BadUsageError("--nodes and --nproc must be >= 1, --max-restarts >= 0")

    def command(self, endpoint: str) -> list[str]:
        return ["scalelab", "train", "--model", "transformer", "--nnodes", str(self.nodes),
                "--nproc", str(self.nproc_per_node), "--rdzv-endpoint", endpoint,
                "--rdzv-id", self.name, "--max-restarts", str(self.max_restarts),
                "--run-dir", "/shared/run", "--checkpoint-dir", "/shared/checkpoints",
                "--checkpoint-interval", "50", *self.args]


def _container(spec: TrainJobSpec, endpoint: str) -> dict[str, Any]:
    return {
        "name": "train", "image": spec.image, "command": spec.command(endpoint),
        "ports": [{"containerPort": PORT, "name": "rendezvous"}],
        "resources": resources(spec.cpu, spec.memory),
        "volumeMounts": [{"name": "shared", "mountPath": "/shared"}],
    }


def manifests(spec: TrainJobSpec) -> dict[str, dict[str, Any]]:
    labels = app_labels(spec.name)
    volumes = [{"name": "shared", "persistentVolumeClaim": {"claimName": spec.claim}}]
    service = {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": spec.name, "labels": labels},
        "spec": {"clusterIP": "None", "selector": labels,
                 "ports": [{"name": "rendezvous", "port": PORT, "targetPort": PORT}],
                 # Pods must resolve each other before they are Ready (they never are).
                 "publishNotReadyAddresses": True},
    }
    job = {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": spec.name, "labels": labels},
        "spec": {
            "completions": spec.nodes, "parallelism": spec.nodes, "completionMode": "Indexed",
            "backoffLimit": spec.nodes * 2,
            "template": {
                "metadata": {"labels": labels},
                "spec": {"subdomain": spec.name, "restartPolicy": "OnFailure",
                         "containers": [_container(spec, f"{spec.name}-0.{spec.name}:{PORT}")],
                         "volumes": volumes},
            },
        },
    }
    worker_pod = {"spec": {"containers": [_container(spec, f"{spec.name}-worker-0:{PORT}")],
                           "volumes": volumes}}
    pytorchjob = {
        "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
        "metadata": {"name": spec.name, "labels": labels},
        "spec": {
            "elasticPolicy": {"rdzvBackend": "c10d", "minReplicas": spec.nodes,
                              "maxReplicas": spec.nodes, "maxRestarts": spec.max_restarts},
            "pytorchReplicaSpecs": {"Worker": {"replicas": spec.nodes,
                                               "restartPolicy": "OnFailure",
                                               "template": worker_pod}},
        },
    }
    return {"service.yaml": service, "job.yaml": job, "pytorchjob.yaml": pytorchjob}


def write(spec: TrainJobSpec, out: Path) -> list[Path]:
    return write_manifests(manifests(spec), out)
