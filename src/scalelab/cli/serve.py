"""`scalelab serve`: run the model server, and manage which version answers.

    scalelab serve --model-repo DIR [--host 127.0.0.1 --port 8000 --workers N]
    scalelab serve canary   --model-repo DIR --model M --candidate V --weight 0.1
    scalelab serve shadow   --model-repo DIR --model M --candidate V
    scalelab serve promote  --model-repo DIR --model M --candidate V --holdout test.parquet
    scalelab serve rollback --model-repo DIR --model M
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from scalelab.cli._governance import governance_file, governance_option
from scalelab.cli._output import DefaultGroup, emit, json_option
from scalelab.cli._tracing import trace_config, trace_options
from scalelab.lab.core.units import parse_size

repo_option = click.option("--model-repo", "model_repo", required=True,
                           type=click.Path(path_type=Path, file_okay=False),
                           help="Model repository root (REPO/<model>/<version>/).")
model_option = click.option("--model", required=True, help="Model name in the repository.")


@click.group(cls=DefaultGroup)
def app() -> None:
    """Serve models over the Open Inference Protocol v2; canary, shadow, promote, rollback."""


@app.command("run")
@repo_option
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Bind address (0.0.0.0 to listen beyond this machine).")
@click.option("--port", default=8000, show_default=True, type=int)
@click.option("--grpc-port", default=None, type=int,
              help="Also answer the KServe v2 gRPC protocol on this port (same --host, same "
                   "queues and batcher as HTTP); needs grpcio.")
@click.option("--workers", default=1, show_default=True, type=int,
              help="uvicorn worker processes; metrics merge across them.")
@click.option("--admin-token", default=None,
              help="Bearer token for /v2/repository/* (or env SCALELAB_ADMIN_TOKEN); "
                   "without one those endpoints answer 403.")
@click.option("--max-body", default="1MiB", show_default=True,
              help="Largest request body; larger ones get 413.")
@click.option("--sample-dir", default=None, type=click.Path(path_type=Path, file_okay=False),
              help="Write a rotating JSONL sample of requests and responses here.")
@click.option("--sample-rate", default=1.0, show_default=True, type=float)
@click.option("--sample-max-rows", default=10_000, show_default=True, type=int)
@click.option("--sample-max-files", default=10, show_default=True, type=int)
@click.option("--graceful-seconds", default=30.0, show_default=True, type=float,
              help="How long shutdown waits for in-flight requests.")
@click.option("--read-timeout", default=10.0, show_default=True, type=float,
              help="Seconds a client may take to send one whole request; then it is "
                   "disconnected (slow-client protection).")
@click.option("--torch-threads", default=None, type=int,
              help="torch threads per process (default: cores / workers).")
@click.option("--poll-seconds", default=0.5, show_default=True, type=float,
              help="How often serving.json changes are picked up.")
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["debug", "info", "warning", "error"]))
@click.option("--http", "http", default="auto", show_default=True,
              type=click.Choice(["auto", "httptools", "h11"]),
              help="HTTP parser; auto = httptools when installed (faster), else h11.")
@click.option("--loop", "loop", default="auto", show_default=True,
              type=click.Choice(["auto", "uvloop", "asyncio"]),
              help="Event loop; auto = uvloop when installed (faster), else asyncio.")
@click.option("--access-log", "access_log", default="sampled", show_default=True,
              type=click.Choice(["off", "sampled", "full"]),
              help="Per-request log lines: none, every request while light and at most "
                   "--access-log-rate lines/s (successes and errors each) when not, or all.")
@click.option("--access-log-rate", "access_log_rate", default=20.0, show_default=True,
              type=float, help="Lines per second in sampled mode.")
@governance_option
@trace_options
def run_cmd(governance: Path | None,
            model_repo: Path, host: str, port: int, grpc_port: int | None, workers: int,
            admin_token: str | None, max_body: str, sample_dir: Path | None,
            sample_rate: float, sample_max_rows: int, sample_max_files: int,
            graceful_seconds: float, read_timeout: float,
            torch_threads: int | None,
            poll_seconds: float, log_level: str, http: str, loop: str, access_log: str,
            access_log_rate: float, trace_sample: float, trace_out: str | None,
            otlp_endpoint: str | None) -> None:
    """Serve every model in --model-repo until interrupted (Ctrl-C drains in-flight requests)."""
    from scalelab.system.serve.server import serve
    from scalelab.system.serve.settings import ServerSettings

    settings = ServerSettings(
        governance_file=governance_file(governance),
        model_repo=model_repo, host=host, port=port, grpc_port=grpc_port, workers=workers,
        admin_token=admin_token,
        max_body_bytes=parse_size(max_body, what="--max-body"), sample_dir=sample_dir,
        sample_rate=sample_rate, sample_max_rows=sample_max_rows,
        sample_max_files=sample_max_files, graceful_s=graceful_seconds,
        read_timeout_s=read_timeout,
        torch_threads=torch_threads, poll_s=poll_seconds, log_level=log_level, http=http,
        loop=loop, access_log=access_log, access_log_per_second=access_log_rate,
        trace=trace_config(trace_sample, trace_out, otlp_endpoint))
    serve(settings)


def _routing_table(title: str, routing: object) -> None:
    from rich import print as rprint

    rprint(f"[bold]{title}[/]")
    for k, v in dataclasses.asdict(routing).items():  # type: ignore[call-overload]
        rprint(f"  {k}: {v}")


@app.command("canary")
@repo_option
@model_option
@click.option("--candidate", required=True, type=int, help="Version under test.")
@click.option("--weight", required=True, type=float, help="Share of traffic, in [0, 1].")
@click.option("--seed", default=0, show_default=True, type=int,
              help="Salt of the request-id split (same seed + id = same version).")
@json_option
def canary_cmd(model_repo: Path, model: str, candidate: int, weight: float, seed: int,
               as_json: bool) -> None:
    """Send a weighted share of unversioned requests to a candidate version."""
    from scalelab.system.serve.canary import start_candidate

    r = start_candidate(model_repo, model, candidate, mode="canary", weight=weight, seed=seed)
    emit(dataclasses.asdict(r), as_json, lambda _c: _routing_table("canary started", r))


@app.command("shadow")
@repo_option
@model_option
@click.option("--candidate", required=True, type=int, help="Version to mirror traffic to.")
@json_option
def shadow_cmd(model_repo: Path, model: str, candidate: int, as_json: bool) -> None:
    """Mirror traffic to a candidate (responses still come from current); compare labels."""
    from scalelab.system.serve.canary import start_candidate

    r = start_candidate(model_repo, model, candidate, mode="shadow", weight=0.0)
    emit(dataclasses.asdict(r), as_json, lambda _c: _routing_table("shadow started", r))


@app.command("promote")
@repo_option
@model_option
@click.option("--candidate", required=True, type=int, help="Version to promote.")
@click.option("--holdout", required=True, type=click.Path(path_type=Path, dir_okay=False),
              help="Parquet table in the flights feature contract, with delay_class.")
@click.option("--tolerance", default=0.01, show_default=True, type=float,
              help="Largest allowed drop in accuracy, macro F1 or any class's F1.")
@click.option("--dry-run", is_flag=True, help="Evaluate only; write nothing.")
@json_option
def promote_cmd(model_repo: Path, model: str, candidate: int, holdout: Path, tolerance: float,
                dry_run: bool, as_json: bool) -> int:
    """Promote a candidate unless it is worse than current on the holdout (exit 1 if refused)."""
    from scalelab.system.serve.promote import gate

    d = gate(model_repo, model, candidate, holdout, tolerance=tolerance, dry_run=dry_run)

    def render(c: Console) -> None:
        t = Table(title=f"{model}: candidate {candidate} vs current {d.current.version} "
                        f"({d.current.rows} holdout rows, tolerance {tolerance})")
        t.add_column("metric")
        t.add_column("current", justify="right")
        t.add_column("candidate", justify="right")
        t.add_row("accuracy", f"{d.current.accuracy:.4f}", f"{d.candidate.accuracy:.4f}")
        t.add_row("macro F1", f"{d.current.macro_f1:.4f}", f"{d.candidate.macro_f1:.4f}")
        for cls, a in d.current.per_class_f1.items():
            b = d.candidate.per_class_f1.get(cls)
            t.add_row(f"F1 {cls}", "-" if a is None else f"{a:.4f}",
                      "-" if b is None else f"{b:.4f}")
        c.print(t)
        if d.accepted:
            c.print("[green]accepted[/]" + (" (dry run; nothing written)" if dry_run else
                                            f": version {candidate} is now current"))
        else:
            c.print("[red]refused[/]: " + "; ".join(d.reasons))

    emit(d, as_json, render)
    return 0 if d.accepted else 1


@app.command("rollback")
@repo_option
@model_option
@json_option
def rollback_cmd(model_repo: Path, model: str, as_json: bool) -> None:
    """Stop the live candidate, or restore the version current before the last promotion."""
    from scalelab.system.serve.canary import rollback

    r, what = rollback(model_repo, model)
    emit({"routing": dataclasses.asdict(r), "action": what}, as_json,
         lambda c: c.print(f"rolled back: {what}"))
