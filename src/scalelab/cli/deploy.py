"""`scalelab deploy k8s`: Kubernetes manifests for the model server; `scalelab deploy grafana`:
its dashboard and alerting rules."""

from __future__ import annotations

from pathlib import Path

import click

from scalelab.cli._output import emit, json_option
from scalelab.lab.core.errors import BadUsageError


@click.group()
def app() -> None:
    """Write deployment manifests for the model server, and its dashboard and alert rules."""


@app.command("k8s")
@click.option("--model-repo", "model_repo", required=True,
              type=click.Path(path_type=Path, file_okay=False),
              help="Local model repository (used to measure startup time).")
@click.option("--out", required=True, type=click.Path(path_type=Path, file_okay=False),
              help="Folder for deployment.yaml, service.yaml and hpa.yaml.")
@click.option("--name", default="scalelab-serve", show_default=True)
@click.option("--image", default="scalelab:latest", show_default=True)
@click.option("--claim", default="scalelab-models", show_default=True,
              help="PersistentVolumeClaim with the model repository (mounted at /models).")
@click.option("--min", "min_replicas", default=1, show_default=True, type=int,
              help="minReplicas; 0 (scale to zero) needs --external-metric.")
@click.option("--max", "max_replicas", default=10, show_default=True, type=int)
@click.option("--external-metric", default=None,
              help="Scale on this External metric (one value that exists while no pod runs, "
                   "e.g. a gateway's in-flight requests), --target per pod.")
@click.option("--signal", default="queue", show_default=True,
              type=click.Choice(["queue", "inflight", "cpu"]),
              help="Scale on queue depth or in-flight requests per pod, or on CPU.")
@click.option("--target", default=None, type=float,
              help="Per-pod target (queue 8, inflight 16, cpu 70% by default).")
@click.option("--startup-seconds", default=None, type=float,
              help="Pod startup time; measured by starting the server here when omitted.")
@click.option("--port", default=8000, show_default=True, type=int)
@json_option
def k8s_cmd(model_repo: Path, out: Path, name: str, image: str, claim: str, min_replicas: int,
            max_replicas: int, external_metric: str | None, signal: str, target: float | None,
            startup_seconds: float | None, port: int, as_json: bool) -> None:
    """Deployment + Service + autoscaling/v2 HPA with probes and startup-aware behavior."""
    from scalelab.system.serve import k8s

    if not model_repo.is_dir():
        raise BadUsageError(f"--model-repo {model_repo} is not a directory")
    problem = k8s.scale_to_zero_problem(min_replicas, signal, external_metric)
    if problem:  # before the start-up measurement, which takes seconds
        raise BadUsageError(problem)
    measured = startup_seconds is None
    startup = k8s.measure_startup(model_repo) if startup_seconds is None else startup_seconds
    spec = k8s.DeploySpec(name=name, image=image, claim=claim, port=port,
                          min_replicas=min_replicas, max_replicas=max_replicas,
                          signal=signal,  # type: ignore[arg-type]
                          target=target, startup_s=startup, external_metric=external_metric)
    paths = k8s.write(spec, out)
    data = {"files": [str(p) for p in paths], "startup_seconds": round(startup, 3),
            "startup_measured": measured, "signal": signal,
            "behavior": k8s.behavior(startup)}
    emit(data, as_json, lambda c: c.print(
        f"wrote {', '.join(str(p) for p in paths)} (startup {startup:.1f} s"
        f"{' measured here' if measured else ''}; scaling on {signal})"))


@app.command("grafana")
@click.option("--out", required=True, type=click.Path(path_type=Path, file_okay=False),
              help="Folder for dashboard.json and rules.yaml.")
@click.option("--datasource", default="Prometheus", show_default=True,
              help="Name of the Grafana Prometheus data source the dashboard selects first.")
@click.option("--slo-file", "slo_file", default=None,
              type=click.Path(path_type=Path, dir_okay=False),
              help="Objectives file (diagnose's scalelab.yaml format) the SLOs come from; "
                   "diagnose's defaults when omitted.")
@json_option
def grafana_cmd(out: Path, datasource: str, slo_file: Path | None, as_json: bool) -> None:
    """Grafana dashboard + Prometheus recording and burn-rate alerting rules."""
    import json

    import yaml

    from scalelab.layers.observe.dashboards import dashboard
    from scalelab.layers.observe.rules import read_objectives, rules_document, slos_from_objectives

    if not datasource.strip():
        raise BadUsageError("--datasource is empty; name the Grafana Prometheus data source")
    slos = slos_from_objectives(read_objectives(slo_file))
    board = dashboard(slos, datasource=datasource)
    rules = rules_document(slos)
    out.mkdir(parents=True, exist_ok=True)
    board_path, rules_path = out / "dashboard.json", out / "rules.yaml"
    board_path.write_text(json.dumps(board, indent=2, ensure_ascii=False) + "\n", "utf-8")
    rules_path.write_text(yaml.safe_dump(rules, sort_keys=False, allow_unicode=True,
                                         width=100), "utf-8")
    n_rules = sum(len(g["rules"]) for g in rules["groups"])
    data = {"files": [str(board_path), str(rules_path)],
            "panels": sum(1 for p in board["panels"] if p["type"] != "row"),
            "rules": n_rules,
            "slos": [{"name": s.name, "objective": s.label, "target": s.target,
                      "boundary_s": s.boundary_s} for s in slos]}
    emit(data, as_json, lambda c: c.print(
        f"wrote {board_path} ({data['panels']} panels) and {rules_path} ({n_rules} rules: "
        + ", ".join(s.label for s in slos) + ")"))


from scalelab.cli.deploy_load import load_job_cmd  # noqa: E402
from scalelab.cli.deploy_train import train_job_cmd  # noqa: E402

app.add_command(train_job_cmd)
app.add_command(load_job_cmd)
