"""`scalelab autoscale simulate`: replay a traffic trace against HPA-scaled replicas."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import click
from rich import box
from rich.console import Console
from rich.table import Table

from scalelab.cli._output import emit, json_option
from scalelab.cli._prices import prices_option, resolve_prices
from scalelab.lab.autoscale.replica_model import EXTERNAL_SIGNALS, SIGNALS, ReplicaModel
from scalelab.lab.autoscale.simulator import (
    SimConfig,
    SimResult,
    default_target,
    rank,
    scale_to_zero,
    simulate,
)
from scalelab.lab.autoscale.traffic import BUILTINS, load_traffic
from scalelab.lab.core.errors import BadInputError, BadUsageError
from scalelab.lab.core.records import read_records
from scalelab.lab.core.units import parse_duration
from scalelab.lab.load.slo import parse_slo


@click.group(no_args_is_help=True)
def app() -> None:
    """Simulate Kubernetes HPA autoscaling against measured replica capacity."""


@app.command("simulate")
@click.option("--capacity", "capacity", type=click.Path(path_type=Path), required=True,
              help="Load records of ONE replica (`scalelab load --records` or `load capacity`).")
@click.option("--trace", required=True,
              help="CSV of time,rate; a request trace CSV (timestamp,input_tokens,"
                   "output_tokens: what `load --replay` sends); or a built-in: "
                   f"{', '.join(BUILTINS)}.")
@click.option("--signal", type=click.Choice(list(SIGNALS)), default="cpu", show_default=True)
@click.option("--target", type=float,
              help="Target per pod for --signal (cpu, kv: percent; rps: req/s; inflight, queue, "
                   "sequences: requests; tokens: tokens/s). Default: the signal's value at "
                   "--design-load.")
@click.option("--design-load", default="70%", show_default=True,
              help="Default targets hold each replica at this share of its SLO capacity.")
@click.option("--slo", help='Latency objective, e.g. "p95<50ms" (default: the records\').')
@click.option("--startup", default="30s", show_default=True,
              help="Replica startup delay, or 'measure': start the server on --model-repo here "
                   "and time it to ready.")
@click.option("--model-repo", type=click.Path(path_type=Path, file_okay=False),
              help="Model repository whose server start-up --startup measure times.")
@click.option("--min", "min_replicas", type=int, default=1, show_default=True,
              help="minReplicas; 0 scales to zero (needs --external) and reports the cold "
                   "starts against the same run at --min 1.")
@click.option("--external", is_flag=True,
              help="Read --signal as one External metric (the total, which sees requests "
                   "waiting while no pod runs), as the HPA needs for --min 0.")
@click.option("--max", "max_replicas", type=int, default=20, show_default=True)
@click.option("--metric-window", default="15s", show_default=True,
              help="The HPA sees metrics averaged over this window.")
@prices_option
@click.option("--replica-cores", type=click.FloatRange(min=0, min_open=True),
              help="vCPUs one replica is priced at (default: the cores of the machine the "
                   "records were measured on).")
@click.option("--replica-gpus", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="GPUs one replica is priced at.")
@click.option("--base-rate", type=float, help="Built-in traces: lowest rate (default: 1 replica "
                                                 "at the design load).")
@click.option("--peak-rate", type=float, help="Built-in traces: highest rate (default: 8× base).")
@click.option("--compare-signals", is_flag=True, help="Run every signal and rank them.")
@click.option("--experiment", help="Only this experiment's records.")
@click.option("--plot", type=click.Path(path_type=Path), help="Write replicas over time (PNG/SVG).")
@json_option
def simulate_cmd(capacity: Path, trace: str, signal: str, target: float | None, design_load: str,
                 slo: str | None, startup: str, model_repo: Path | None, min_replicas: int,
                 external: bool, max_replicas: int,
                 metric_window: str, prices_file: Path | None, replica_cores: float | None,
                 replica_gpus: float, base_rate: float | None,
                 peak_rate: float | None, compare_signals: bool, experiment: str | None,
                 plot: Path | None, as_json: bool) -> None:
    """Replay TRACE; report replicas, SLO violations, cost and oscillations per signal."""
    recs = [r for r in read_records(capacity)
            if r.stage.startswith(("load", "llm"))  # llm: `load llm` records (latency = TTFT)
            and (experiment is None or r.experiment == experiment)]
    model = ReplicaModel.from_records(recs)
    # A replica-hour is priced from the one price table, at the cores the replica was measured on.
    cores = replica_cores if replica_cores is not None else max(r.machine.cores for r in recs)
    table = resolve_prices(prices_file)
    price = table.hourly_usd(cores, replica_gpus)
    slo_text = slo or next((str(r.extras["slo"]) for r in recs
                            if r.extras.get("slo") and r.stage.startswith("load")), None)
    if not slo_text:
        raise BadUsageError("give --slo \"p95<50ms\" (the records name no SLO)")
    objective = parse_slo(slo_text)
    if not objective.latency:
        raise BadUsageError("--slo needs a latency objective, e.g. \"p95<50ms\"")
    obj = objective.latency[0]
    dl = design_load.strip()
    try:
        design = float(dl[:-1]) / 100 if dl.endswith("%") else float(dl)
    except ValueError:
        raise BadUsageError(f"--design-load {design_load!r} is not a percentage") from None
    if not (0 < design <= 1):
        raise BadUsageError("--design-load must be in (0%, 100%]")
    per_replica = design * min(model.slo_capacity(obj), model.saturation_rps)
    if per_replica <= 0:
        raise BadInputError(f"one replica never meets {obj.label} in {capacity}")
    base = base_rate if base_rate is not None else per_replica
    tr = load_traffic(trace, base=base, peak=peak_rate if peak_rate is not None else 8 * base)
    if target is not None and compare_signals:
        raise BadUsageError("--target applies to one --signal; drop it with --compare-signals")
    signals = list(model.signals()) if compare_signals else [signal]
    if external and compare_signals:
        signals = [s for s in signals if s in EXTERNAL_SIGNALS]
    startup_s, measured = _startup(startup, model_repo)
    results: list[SimResult] = []
    floor: list[SimResult] = []
    for s in signals:
        tgt = target if target is not None else default_target(s, model, obj, design)  # type: ignore[arg-type]
        cfg = SimConfig(signal=s, target=tgt, slo=obj, min_replicas=min_replicas,  # type: ignore[arg-type]
                        max_replicas=max_replicas, startup_s=startup_s,
                        metric_window_s=parse_duration(metric_window, what="--metric-window"),
                        price_per_replica_hour=price, external=external)
        results.append(simulate(tr, model, cfg))
        if min_replicas == 0:
            floor.append(simulate(tr, model, dataclasses.replace(cfg, min_replicas=1)))
    if plot is not None:
        _plot(results, tr.name, plot)
    doc: dict[str, Any] = {
        "trace": tr.name, "duration_s": tr.duration_s, "slo": obj.label,
        "replica": {"saturation_rps": model.saturation_rps, "slo_capacity_rps":
                    model.slo_capacity(obj), "design_rps": per_replica},
        "results": [_result_json(r) for r in results],
        "ranking": rank(results) if compare_signals else None,
        "plot": str(plot) if plot else None,
        "startup_s": startup_s, "startup_measured": measured,
        "price": {"replica_hour_usd": price, "replica_cores": cores, "replica_gpus": replica_gpus,
                  "core_hour_usd": table.core_hour_usd, "gpu_hour_usd": table.gpu_hour_usd},
        "scale_to_zero": [scale_to_zero(z, one, price) for z, one in zip(results, floor,
                                                                         strict=True)]
        if floor else None,
    }
    emit(doc, as_json, lambda c: _render(c, doc))


def _startup(text: str, repo: Path | None) -> tuple[float, bool]:
    """(seconds, measured): a duration, or 'measure' (the server's start-up on this machine)."""
    if text.strip() != "measure":
        if repo is not None:
            raise BadUsageError("--model-repo is only read by --startup measure")
        return parse_duration(text, what="--startup"), False
    if repo is None:
        raise BadUsageError("--startup measure needs --model-repo DIR (the server to time)")
    from scalelab.system.serve.k8s import measure_startup

    return measure_startup(repo), True


def _result_json(r: SimResult) -> dict[str, Any]:
    d = {k: v for k, v in r.__dict__.items() if k not in ("decisions", "cold_start")}
    d["decisions"] = [x.__dict__ for x in r.decisions]
    d["cold_start"] = dataclasses.asdict(r.cold_start) if r.cold_start is not None else None
    return d


def _render(c: Console, doc: dict[str, Any]) -> None:
    rep = doc["replica"]
    c.print(f"trace {doc['trace']} ({doc['duration_s'] / 3600:.2f} h), SLO {doc['slo']}; one "
            f"replica: saturates at {rep['saturation_rps']:.1f} req/s, meets the SLO up to "
            f"{rep['slo_capacity_rps']:.1f}, designed for {rep['design_rps']:.1f}")
    t = Table(box=box.SIMPLE, pad_edge=False, collapse_padding=True)
    for col in ("signal", "target", "viol. req %", "viol. min", "replica-h", "cost", "max",
                "mean", "scales", "osc."):
        t.add_column(col, justify="right")
    for r in doc["results"]:
        t.add_row(r["signal"], f"{r['target']:.3g}", f"{r['violating_share']:.3%}",
                  f"{r['violation_minutes']:.1f}", f"{r['replica_hours']:.2f}",
                  f"{r['cost']:.2f}", str(r["max_replicas"]), f"{r['mean_replicas']:.2f}",
                  str(r["scale_events"]), str(r["oscillations"]))
    c.print(t)
    if doc["ranking"]:
        best = doc["ranking"][0]
        c.print("ranking (fewest SLO-violating requests, then cost): "
                + " > ".join(x["signal"] for x in doc["ranking"])
                + f"; pick {best['signal']}")
    pr = doc["price"]
    cores = pr["replica_cores"]
    c.print(f"cost: replica-hours × ${pr['replica_hour_usd']:.4g} ({cores:g} "
            f"{'core' if cores == 1 else 'cores'} × ${pr['core_hour_usd']:g}"
            + (f" + {pr['replica_gpus']:g} GPUs × ${pr['gpu_hour_usd']:g}"
               if pr["replica_gpus"] else "") + "; --prices, --replica-cores)")
    for z in doc["scale_to_zero"] or []:
        c.print(_zero_text(z, doc["startup_s"], doc["startup_measured"]))
    if doc["plot"]:
        c.print(f"plot written to {doc['plot']}")


def _zero_text(z: dict[str, Any], startup_s: float, measured: bool) -> str:
    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v / 1e3:.1f} s"

    how = "measured" if measured else "given"
    return (f"scale to zero ({z['signal']}, start-up {startup_s:.1f} s {how}): "
            f"{z['cold_requests']:.0f} requests met no ready replica in {z['episodes']} cold "
            f"start(s), waiting p50 {ms(z['added_p50_ms'])}, p99 {ms(z['added_p99_ms'])} more"
            + (f" ({z['unserved']:.0f} still waiting at the end)" if z["unserved"] else "")
            + f"; {z['zero_seconds'] / 3600:.2f} h at zero saves "
            f"{z['replica_seconds_saved'] / 3600:.2f} replica-h (${z['cost_saved']:.2f}) "
            f"vs --min 1, for {z['added_violating_requests']:.0f} more slow requests")


def _plot(results: list[SimResult], name: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    tl0 = results[0].timeline
    hours = [t / 3600 for t in tl0["t_s"]]
    ax2 = ax.twinx()
    ax2.fill_between(hours, tl0["rate"], color="lightgrey", alpha=0.6, label="offered rate")
    ax2.set_ylabel("offered rate (req/s)")
    for r in results:
        ax.step([t / 3600 for t in r.timeline["t_s"]], r.timeline["replicas"], where="post",
                label=f"{r.signal} ({r.violating_share:.2%} slow)")
    ax.set_zorder(ax2.get_zorder() + 1)
    ax.patch.set_visible(False)
    ax.set_xlabel("time (h)")
    ax.set_ylabel("replicas")
    ax.set_title(f"HPA replicas over the {name} trace")
    ax.legend(loc="upper left")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
