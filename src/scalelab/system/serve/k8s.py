"""Kubernetes manifests for the server: Deployment, Service and an autoscaling/v2
HorizontalPodAutoscaler scaling on queue depth or in-flight requests (a Prometheus custom metric
served to the HPA by prometheus-adapter as a Pods metric) or on CPU.

The startup time matters twice. Probes: a startupProbe gives the pod that long (three times,
plus slack) before liveness may kill it. Behavior: the HPA must not add pods again before the
last ones could have become ready (their load is not yet off the metric), so the scale-up period
is at least the startup time; scale-down waits several startup times, since a pod removed too
early costs a full startup to get back.

Scale to zero (min replicas 0): the HPA accepts minReplicas 0 only with an Object or External
metric (and the HPAScaleToZero feature gate on the cluster), because a per-pod metric vanishes
with the last pod and nothing would ever scale it up again. The server's own queue depth is
such a per-pod metric, so min 0 needs a metric of the demand *in front of* the service (a
gateway's in-flight requests or request rate) served by an external-metrics adapter; without one
the manifests are refused with that said. A backlog alone will not do: under light load nothing
waits, the metric reads 0 and the HPA removes the last pod while traffic still flows (the
simulator shows the thrashing). Every request that arrives at zero waits the start-up
time: `scalelab autoscale simulate --min 0 --external` counts them and what min 0 saves.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from scalelab.lab.core.errors import BadUsageError, RunFailedError
from scalelab.layers.deploy.kube import app_labels, resources, write_manifests
from scalelab.layers.web.spawn import start_server, stop_group

Signal = Literal["queue", "inflight", "cpu"]
METRIC = {"queue": "scalelab_queue_depth", "inflight": "scalelab_inflight_requests"}


@dataclass(kw_only=True, frozen=True)
class DeploySpec:
    """What to deploy and how it scales."""

    name: str = "scalelab-serve"
    """Name of the Deployment, Service and HPA (a DNS label)."""
    image: str = "scalelab:latest"
    """Container image with scalelab installed."""
    claim: str = "scalelab-models"
    """PersistentVolumeClaim holding the model repository, mounted read-only at /models."""
    port: int = 8000
    min_replicas: int = 1
    max_replicas: int = 10
    signal: Signal = "queue"
    """What the HPA follows: queue depth, in-flight requests (per pod) or CPU utilisation."""
    external_metric: str | None = None
    """An External metric that exists while no pod runs (e.g. a gateway's in-flight requests for
    this service), AverageValue target per pod; needed for min_replicas 0."""
    target: float | None = None
    """Per-pod target: queue depth (default 8), in-flight (default 16) or CPU percent (70)."""
    startup_s: float = 10.0
    """Measured seconds from process start to ready."""
    cpu: str = "1"
    memory: str = "1Gi"
    graceful_s: int = 30
    """Seconds a terminating pod has to finish in-flight requests."""

    def __post_init__(self) -> None:
        if not (0 <= self.min_replicas <= self.max_replicas and self.max_replicas >= 1):
            raise BadUsageError(f"need 0 <= --min ({self.min_replicas}) <= --max "
                                f"({self.max_replicas}) and --max >= 1")
        problem = scale_to_zero_problem(self.min_replicas, self.signal, self.external_metric)
        if problem:
            raise BadUsageError(problem)
        if self.signal not in ("queue", "inflight", "cpu"):
            raise BadUsageError(f"--signal {self.signal!r} must be queue, inflight or cpu")
        if self.startup_s <= 0 or not math.isfinite(self.startup_s):
            raise BadUsageError("--startup-seconds must be a positive number")
        if self.target is not None and self.target <= 0:
            raise BadUsageError("--target must be positive")
        if not 0 < self.port < 65536:
            raise BadUsageError("--port must lie in 1..65535")

    def target_value(self) -> float:
        if self.target is not None:
            return self.target
        return {"queue": 8.0, "inflight": 16.0, "cpu": 70.0}[self.signal]


def scale_to_zero_problem(min_replicas: int, signal: str, external_metric: str | None
                          ) -> str | None:
    """Why these settings cannot scale to zero (or from it), or None (pure)."""
    if external_metric is not None and not external_metric.strip():
        return "--external-metric must name a metric"
    if min_replicas > 0:
        return None
    if signal == "cpu":
        return ("--min 0 cannot scale on cpu: a pod's CPU does not exist while no pod runs; "
                "use --signal queue with --external-metric NAME")
    if external_metric is None:
        return ("--min 0 needs --external-metric NAME: the HPA scales from zero only on an "
                f"Object or External metric, and the server's own {METRIC[signal]} vanishes "
                "with its last pod; name a metric of the demand in front of the service that "
                "exists without pods (your gateway's in-flight requests or request rate, served "
                "by an external-metrics adapter; a backlog alone falls to 0 under light load and "
                "scales the last pod away while traffic flows) and enable the HPAScaleToZero "
                "feature gate")
    return None


def behavior(startup_s: float) -> dict[str, Any]:
    """HPA scaling behaviour for a pod that takes `startup_s` to become ready (pure)."""
    up_period = max(15, math.ceil(startup_s))
    return {
        "scaleUp": {"stabilizationWindowSeconds": 0, "selectPolicy": "Max",
                    "policies": [{"type": "Percent", "value": 100, "periodSeconds": up_period},
                                 {"type": "Pods", "value": 2, "periodSeconds": up_period}]},
        "scaleDown": {"stabilizationWindowSeconds": max(300, math.ceil(3 * startup_s)),
                      "selectPolicy": "Min",
                      "policies": [{"type": "Percent", "value": 50, "periodSeconds": 60}]},
    }


def _probe(path: str, port: int, period: int, failures: int) -> dict[str, Any]:
    return {"httpGet": {"path": path, "port": port}, "periodSeconds": period,
            "timeoutSeconds": 2, "failureThreshold": failures}


def manifests(spec: DeploySpec) -> dict[str, dict[str, Any]]:
    """File name -> manifest for the Deployment, Service and HPA (pure)."""
    labels = app_labels(spec.name)
    startup_failures = math.ceil(3 * spec.startup_s / 2) + 5  # 3x the measured time, 2 s period
    container = {
        "name": "server", "image": spec.image,
        "command": ["scalelab", "serve"],
        "args": ["--model-repo", "/models", "--host", "0.0.0.0", "--port", str(spec.port),
                 "--graceful-seconds", str(spec.graceful_s)],
        "ports": [{"name": "http", "containerPort": spec.port}],
        "env": [{"name": "SCALELAB_ADMIN_TOKEN",
                 "valueFrom": {"secretKeyRef": {"name": f"{spec.name}-admin", "key": "token",
                                                "optional": True}}}],
        "resources": resources(spec.cpu, spec.memory),
        "startupProbe": _probe("/v2/health/ready", spec.port, 2, startup_failures),
        "readinessProbe": _probe("/v2/health/ready", spec.port, 5, 2),
        "livenessProbe": _probe("/v2/health/live", spec.port, 10, 3),
        # keep serving while the endpoint is removed from the Service, then drain
        "lifecycle": {"preStop": {"sleep": {"seconds": 5}}},
        "volumeMounts": [{"name": "models", "mountPath": "/models", "readOnly": True}],
    }
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": spec.name, "labels": labels},
        "spec": {
            "replicas": spec.min_replicas,
            "selector": {"matchLabels": labels},
            "strategy": {"type": "RollingUpdate",
                         "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
            "template": {
                "metadata": {"labels": labels,
                             "annotations": {"prometheus.io/scrape": "true",
                                             "prometheus.io/port": str(spec.port),
                                             "prometheus.io/path": "/metrics"}},
                "spec": {"terminationGracePeriodSeconds": spec.graceful_s + 10,
                         "containers": [container],
                         "volumes": [{"name": "models", "persistentVolumeClaim": {
                             "claimName": spec.claim, "readOnly": True}}]},
            },
        },
    }
    service = {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": spec.name, "labels": labels},
        "spec": {"selector": labels,
                 "ports": [{"name": "http", "port": spec.port, "targetPort": "http"}]},
    }
    t = spec.target_value()
    if spec.external_metric is not None:
        # One value for the whole service (it can see demand with no pod running), divided by
        # the replica count against the per-pod target.
        metric: dict[str, Any] = {"type": "External", "external": {
            "metric": {"name": spec.external_metric,
                       "selector": {"matchLabels": {"service": spec.name}}},
            "target": {"type": "AverageValue", "averageValue": _quantity(t)}}}
    elif spec.signal == "cpu":
        metric = {"type": "Resource", "resource": {
            "name": "cpu", "target": {"type": "Utilization", "averageUtilization": round(t)}}}
    else:
        metric = {"type": "Pods", "pods": {
            "metric": {"name": METRIC[spec.signal]},
            "target": {"type": "AverageValue", "averageValue": _quantity(t)}}}
    hpa = {
        "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": spec.name, "labels": labels},
        "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                                    "name": spec.name},
                 "minReplicas": spec.min_replicas, "maxReplicas": spec.max_replicas,
                 "metrics": [metric], "behavior": behavior(spec.startup_s)},
    }
    return {"deployment.yaml": deployment, "service.yaml": service, "hpa.yaml": hpa}


def _quantity(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{round(x * 1000)}m"


def write(spec: DeploySpec, out: Path) -> list[Path]:
    """Write the Deployment, Service and HPA files under `out`."""
    return write_manifests(manifests(spec), out)


def measure_startup(model_repo: Path, *, timeout_s: float = 120.0) -> float:
    """Seconds from starting `scalelab serve` on this machine until /v2/health/ready is 200."""

    def command(port: int) -> list[str]:
        return [sys.executable, "-m", "scalelab", "serve", "--model-repo", str(model_repo),
                "--port", str(port), "--log-level", "warning"]

    try:
        spawned = start_server(command, timeout_s=timeout_s)
    except RunFailedError as e:
        raise RunFailedError(f"{e}; run `scalelab serve --model-repo {model_repo}` to see why, "
                             "or pass --startup-seconds instead") from None
    stop_group(spawned.proc, grace_s=30.0)
    return spawned.ready_s
