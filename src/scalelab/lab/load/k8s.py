"""Manifests for a load-generator cluster on Kubernetes: a Dask scheduler and N workers.

`scalelab load URL --cluster tcp://<name>-scheduler:8786` (and `load capacity`, `load llm`,
`sweep`) run from a pod in the same cluster then puts one generator on each worker pod. The
workers run one thread each (one generator a process: the event loop is single-threaded), with
Dask's sampling profiler off (it walks every thread's stack under the GIL each 10 ms, which a
generator feels as lag), and spread one a node where the nodes allow (a generator sharing a
node with another, or with the server under test, shares its cores: what --cluster is for is
not to). Files: scheduler.yaml (Deployment + Service), workers.yaml (Deployment).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scalelab.lab.core.errors import BadUsageError
from scalelab.layers.deploy.kube import app_labels, check_name, resources, write_manifests

SCHEDULER_PORT = 8786
DASHBOARD_PORT = 8787


@dataclass(frozen=True, kw_only=True)
class LoadJobSpec:
    """One load-generator cluster."""

    name: str = "scalelab-load"
    """Prefix of every object (a DNS label); the scheduler's Service is `<name>-scheduler`."""
    image: str = "scalelab:latest"
    """An image with scalelab installed (its venv gives `dask` and `scalelab`)."""
    workers: int = 2
    """Generator pods (one generator each)."""
    cpu: str = "1"
    """CPU request and limit per worker pod: one core per generator."""
    memory: str = "1Gi"
    """Memory request and limit per worker pod."""

    def __post_init__(self) -> None:
        check_name(self.name, most=40)
        if self.workers < 1:
            raise BadUsageError(f"--workers must be at least 1, got {self.workers}")

    @property
    def scheduler(self) -> str:
        """The address `--cluster` takes, from inside the Kubernetes cluster."""
        return f"tcp://{self.name}-scheduler:{SCHEDULER_PORT}"


def manifests(spec: LoadJobSpec) -> dict[str, list[dict[str, Any]]]:
    sched_labels = app_labels(spec.name, "scheduler")
    worker_labels = app_labels(spec.name, "worker")
    env = [{"name": "DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED", "value": "False"}]
    scheduler = {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": f"{spec.name}-scheduler", "labels": sched_labels},
        "spec": {
            "replicas": 1, "selector": {"matchLabels": sched_labels},
            "template": {"metadata": {"labels": sched_labels}, "spec": {"containers": [{
                "name": "scheduler", "image": spec.image,
                "command": ["dask", "scheduler", "--port", str(SCHEDULER_PORT),
                            "--dashboard-address", f":{DASHBOARD_PORT}"],
                "ports": [{"containerPort": SCHEDULER_PORT, "name": "scheduler"},
                          {"containerPort": DASHBOARD_PORT, "name": "dashboard"}],
                "readinessProbe": {"tcpSocket": {"port": SCHEDULER_PORT},
                                   "periodSeconds": 5},
                "resources": resources("500m", "512Mi"),
            }]}},
        },
    }
    service = {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": f"{spec.name}-scheduler", "labels": sched_labels},
        "spec": {"selector": sched_labels,
                 "ports": [{"name": "scheduler", "port": SCHEDULER_PORT,
                            "targetPort": SCHEDULER_PORT},
                           {"name": "dashboard", "port": DASHBOARD_PORT,
                            "targetPort": DASHBOARD_PORT}]},
    }
    workers = {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": f"{spec.name}-worker", "labels": worker_labels},
        "spec": {
            "replicas": spec.workers, "selector": {"matchLabels": worker_labels},
            "template": {"metadata": {"labels": worker_labels}, "spec": {
                "topologySpreadConstraints": [{
                    "maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                    "whenUnsatisfiable": "ScheduleAnyway",
                    "labelSelector": {"matchLabels": worker_labels}}],
                "containers": [{
                    "name": "worker", "image": spec.image, "env": env,
                    "command": ["dask", "worker", spec.scheduler, "--nthreads", "1",
                                "--nworkers", "1", "--memory-limit", "0"],
                    "resources": resources(spec.cpu, spec.memory, cpu_limit=True),
                }]}},
        },
    }
    return {"scheduler.yaml": [scheduler, service], "workers.yaml": [workers]}


def write(spec: LoadJobSpec, out: Path) -> list[Path]:
    return write_manifests(manifests(spec), out)
