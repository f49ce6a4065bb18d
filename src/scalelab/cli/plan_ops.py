"""`scalelab plan hpa | checkpoint | lr`: the operational planning calculators.

Thin: parse flags or the state file, call hpa / core.checkpoint / core.lr, print.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from scalelab.cli._output import emit, err_console, json_option
from scalelab.lab.autoscale.hpa import (
    Behavior,
    ControllerConfig,
    HpaSpec,
    HpaState,
    MetricTarget,
    PodSample,
    ScalingRules,
    SyncDecision,
    decide,
    state_from_json,
)
from scalelab.lab.core.checkpoint import CheckpointPlan, plan_checkpoints
from scalelab.lab.core.errors import BadInputError, BadUsageError
from scalelab.lab.core.lr import LrScaling
from scalelab.lab.core.units import format_duration, parse_duration

_UNBOUNDED = 2**31 - 1


def _simple_state(current: int, observed: float, target: float, target_type: str,
                  min_replicas: int, max_replicas: int | None, tolerance: float,
                  up_tol: float | None, down_tol: float | None) -> HpaState:
    """The flags' one-metric state: `current` ready pods, each at the `observed` average."""
    if current < 0:
        raise BadUsageError(f"--current must be >= 0 replicas (got {current})")
    if not target > 0:
        raise BadUsageError(f"--target must be > 0 (got {target:g}); e.g. --target 60")
    if not observed >= 0:
        raise BadUsageError(f"--observed must be >= 0 (got {observed:g})")
    if min_replicas < 0:
        raise BadUsageError(f"--min must be >= 0 (got {min_replicas})")
    if max_replicas is not None and max_replicas < max(1, min_replicas):
        raise BadUsageError(f"--max must be >= 1 and >= --min (got {max_replicas})")
    for flag, t in (("--tolerance", tolerance), ("--scale-up-tolerance", up_tol),
                    ("--scale-down-tolerance", down_tol)):
        if t is not None and not t >= 0:
            raise BadUsageError(f"{flag} must be >= 0 (got {t:g}); e.g. 0.1 for 10%")
    if target_type == "Utilization":
        if not float(target).is_integer():
            raise BadUsageError(f"--target for Utilization is a whole percent (got {target:g})")
        metric = MetricTarget(name="cpu", source="Resource", target_type="Utilization",
                              target=target)
        usage, requests = {"cpu": observed / 100.0}, {"cpu": 1.0}
    elif target_type == "AverageValue":
        metric = MetricTarget(name="metric", source="Pods", target_type="AverageValue",
                              target=target)
        usage, requests = {"metric": observed}, {}
    else:
        metric = MetricTarget(name="metric", source="Object", target_type="Value", target=target)
        usage, requests = {}, {}
    # A per-direction tolerance lives in spec.behavior, and any behavior switches the controller
    # from the max(2×, 4) limit to the default policies; the flags keep that consequence.
    behavior = None
    if up_tol is not None or down_tol is not None:
        behavior = Behavior(scale_up=ScalingRules(tolerance=up_tol),
                            scale_down=ScalingRules(tolerance=down_tol))
    spec = HpaSpec(min_replicas=min_replicas,
                   max_replicas=_UNBOUNDED if max_replicas is None else max_replicas,
                   metrics=(metric,), behavior=behavior,
                   controller=ControllerConfig(tolerance=tolerance))
    pods = tuple(PodSample(name=f"pod-{i}", usage=usage, requests=requests)
                 for i in range(current))
    values = {"metric": observed} if target_type == "Value" else {}
    return HpaState(spec=spec, current_replicas=current, pods=pods, values=values)


def _read_state(path: Path) -> tuple[HpaState, float]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise BadInputError(f"{path}: no such file; pass --state with an HPA state JSON file") \
            from None
    except (OSError, UnicodeDecodeError) as e:
        raise BadInputError(f"{path}: cannot read it ({e})") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise BadInputError(f"{path}: not valid JSON (line {e.lineno}, column {e.colno}: "
                            f"{e.msg})") from None
    try:
        return state_from_json(doc)
    except BadInputError as e:
        raise BadInputError(f"{path}: {e}") from None


def _render_hpa(d: SyncDecision, detailed: bool) -> Any:
    def render(c: Console) -> None:
        move = ("scale up" if d.desired_replicas > d.current_replicas else
                "scale down" if d.desired_replicas < d.current_replicas else "no change")
        c.print(f"desired replicas: [bold]{d.desired_replicas}[/] "
                f"(current {d.current_replicas}, {move})")
        c.print(f"reason: {d.reason} — {d.message}", soft_wrap=True)
        if d.proposal is not None:
            ratio = "n/a" if d.usage_ratio is None else f"{d.usage_ratio:.3f}"
            c.print(f"usage ratio {ratio}; proposal {d.proposal} → stabilized {d.stabilized} "
                    f"→ limited {d.limited}; tolerance down {d.tolerances[0]:g} / "
                    f"up {d.tolerances[1]:g}", soft_wrap=True)
        if detailed:
            for m in d.metrics:
                line = f"metric {m.metric}: {m.outcome}"
                if m.error is not None:
                    line += f" ({m.error})"
                if m.current is not None:
                    line += f"; current {m.current:g} vs target {m.target:g}"
                if m.usage_ratio is not None:
                    line += f", ratio {m.usage_ratio:.3f}"
                if m.recomputed_ratio is not None:
                    line += f", {m.recomputed_ratio:.3f} with missing/unready pods filled in"
                if m.proposal is not None:
                    line += f" → {m.proposal}"
                c.print(line, soft_wrap=True)
                c.print(f"  pods: {m.ready_pods} ready; unready: {', '.join(m.unready_pods) or '-'}"
                        f"; missing: {', '.join(m.missing_pods) or '-'}; "
                        f"ignored: {', '.join(m.ignored_pods) or '-'}", soft_wrap=True)
    return render


@click.command()
@click.option("--current", type=int, help="Current replicas (simple form).")
@click.option("--observed", type=float,
              help="Observed metric: percent of request for Utilization, per-pod average for "
                   "AverageValue, total for Value.")
@click.option("--target", type=float, help="Target, in the same unit as --observed.")
@click.option("--target-type", type=click.Choice(["Utilization", "AverageValue", "Value"]),
              default="Utilization", show_default=True, help="The metric target's type.")
@click.option("--min", "min_replicas", type=int, default=1, show_default=True,
              help="minReplicas.")
@click.option("--max", "max_replicas", type=int, default=None,
              help="maxReplicas (default: unbounded).")
@click.option("--tolerance", type=float, default=0.1, show_default=True,
              help="The controller's tolerance (--horizontal-pod-autoscaler-tolerance).")
@click.option("--scale-up-tolerance", type=float, default=None,
              help="behavior.scaleUp.tolerance (sets a behavior: default policies apply).")
@click.option("--scale-down-tolerance", type=float, default=None,
              help="behavior.scaleDown.tolerance (sets a behavior: default policies apply).")
@click.option("--state", "state_file", type=click.Path(path_type=Path, dir_okay=False),
              help="Full form: a JSON state file (pods, behavior, history); see the docs.")
@json_option
def hpa(current: int | None, observed: float | None, target: float | None, target_type: str,
        min_replicas: int, max_replicas: int | None, tolerance: float,
        scale_up_tolerance: float | None, scale_down_tolerance: float | None,
        state_file: Path | None, as_json: bool) -> None:
    """What the Kubernetes HorizontalPodAutoscaler would decide, and which rule decided.

    Simple: scalelab plan hpa --current 4 --observed 90 --target 60   (→ 6)

    Full: scalelab plan hpa --state hpa.json   (pods with readiness and samples, behavior,
    recent recommendations and scale events)
    """
    ctx = click.get_current_context()
    if state_file is not None:
        given = [f"--{p.replace('_', '-')}" for p in
                 ("current", "observed", "target", "target_type", "min_replicas",
                  "max_replicas", "tolerance", "scale_up_tolerance", "scale_down_tolerance")
                 if ctx.get_parameter_source(p) is click.core.ParameterSource.COMMANDLINE]
        if given:
            raise BadUsageError(f"--state carries the whole HPA; drop {', '.join(given)} "
                                "(or drop --state)")
        state, now = _read_state(state_file)
    else:
        missing = [f for f, v in (("--current", current), ("--observed", observed),
                                  ("--target", target)) if v is None]
        if missing:
            raise BadUsageError(f"give {', '.join(missing)} (e.g. --current 4 --observed 90 "
                                "--target 60), or --state FILE.json")
        assert current is not None and observed is not None and target is not None
        state, now = _simple_state(current, observed, target, target_type, min_replicas,
                                   max_replicas, tolerance, scale_up_tolerance,
                                   scale_down_tolerance), 0.0
    d = decide(state, now)
    emit(d, as_json, _render_hpa(d, detailed=state_file is not None))


def _dur(seconds: float) -> str:
    return format_duration(seconds) if seconds > 0 else "0 s"


def _render_checkpoint(p: CheckpointPlan) -> Any:
    def render(c: Console) -> None:
        c.print(f"save cost δ {format_duration(p.save_cost_s)}, MTBF M "
                f"{format_duration(p.mtbf_s)}, restart R {_dur(p.restart_s)}"
                + ("" if p.work_s is None else f", work {format_duration(p.work_s)}"),
                soft_wrap=True)
        t = Table()
        t.add_column("")
        t.add_column("Young sqrt(2δM)", justify="right")
        t.add_column("Daly (higher order)", justify="right")
        y, d = p.young, p.daly
        t.add_row("checkpoint every", format_duration(y.interval_s), format_duration(d.interval_s))
        t.add_row("wall time lost", f"{y.lost_fraction:.2%}", f"{d.lost_fraction:.2%}")
        t.add_row("  writing checkpoints", f"{y.checkpoint_fraction:.2%}",
                  f"{d.checkpoint_fraction:.2%}")
        t.add_row("  to failures (rework, restarts)", f"{y.failure_fraction:.2%}",
                  f"{d.failure_fraction:.2%}")
        if y.wall_time_s is not None and d.wall_time_s is not None:
            t.add_row("expected wall time", format_duration(y.wall_time_s),
                      format_duration(d.wall_time_s))
            t.add_row("checkpoints", f"{y.checkpoints:.1f}", f"{d.checkpoints:.1f}")
            t.add_row("failures", f"{y.failures:.1f}", f"{d.failures:.1f}")
        c.print(t)
    return render


@click.command()
@click.option("--save-cost", required=True, help="Time to write one checkpoint (δ), e.g. 5m.")
@click.option("--mtbf", required=True, help="Mean time between failures (M), e.g. 24h.")
@click.option("--restart", default="0s", show_default=True,
              help="Time to restart after a failure (R), e.g. 10m.")
@click.option("--work", default=None, help="Failure-free compute of the job (T_s), e.g. 500h.")
@json_option
def checkpoint(save_cost: str, mtbf: str, restart: str, work: str | None, as_json: bool) -> None:
    """How often to checkpoint: Young's and Daly's intervals and the time each loses.

    Example: scalelab plan checkpoint --save-cost 5m --mtbf 24h --restart 10m --work 500h
    """
    plan = plan_checkpoints(
        parse_duration(save_cost, what="--save-cost"), parse_duration(mtbf, what="--mtbf"),
        parse_duration(restart, what="--restart"),
        None if work is None else parse_duration(work, what="--work"))
    emit(plan, as_json, _render_checkpoint(plan))


@click.command(short_help="Learning rate for a larger batch: linear scaling and warmup.")
@click.option("--base-lr", type=float, required=True, help="Rate tuned at --base-batch.")
@click.option("--base-batch", type=int, required=True, help="Batch the base rate was tuned at.")
@click.option("--batch", type=int, required=True, help="Global batch you will train with.")
@click.option("--warmup-epochs", type=float, default=5.0, show_default=True,
              help="Epochs of gradual warmup (0: none).")
@click.option("--start-lr", type=float, default=None,
              help="Rate at step 0 (default: --base-lr, as in the paper).")
@click.option("--per", type=click.Choice(["step", "epoch"]), default="step", show_default=True,
              help="Raise the rate every step (the paper) or once per epoch.")
@click.option("--steps-per-epoch", type=int, default=None,
              help="Also report warmup steps and the per-step increment.")
@click.option("--epochs", type=int, default=None,
              help="List the schedule through this epoch (default: the end of warmup).")
@json_option
def lr(base_lr: float, base_batch: int, batch: int, warmup_epochs: float, start_lr: float | None,
       per: str, steps_per_epoch: int | None, epochs: int | None, as_json: bool) -> None:
    """Linear scaling rule + gradual warmup (Goyal et al. 2017).

    Example: scalelab plan lr --base-lr 0.1 --base-batch 256 --batch 8192 --warmup-epochs 5
    """
    s = LrScaling(base_lr=base_lr, base_batch=base_batch, batch=batch,
                  warmup_epochs=warmup_epochs, start_lr=start_lr, per=per)
    if steps_per_epoch is not None and steps_per_epoch < 1:
        raise BadUsageError(f"--steps-per-epoch must be >= 1 (got {steps_per_epoch})")
    if epochs is not None and epochs < 0:
        raise BadUsageError(f"--epochs must be >= 0 (got {epochs})")
    rows = s.epochs(epochs)
    data: dict[str, Any] = {
        "base_lr": s.base_lr, "base_batch": s.base_batch, "batch": s.batch, "k": s.k,
        "scaled_lr": s.scaled_lr, "warmup_epochs": s.warmup_epochs,
        "warmup_start_lr": s.warmup_start_lr, "per": s.per,
        "schedule": rows, "warnings": s.warnings,
        "formula": "lr(step) = start + (scaled - start) * step / warmup_steps for step < "
                   "warmup_steps, else scaled",
    }
    if steps_per_epoch is not None:
        warmup_steps = s.warmup_epochs * steps_per_epoch
        data["steps_per_epoch"] = steps_per_epoch
        data["warmup_steps"] = warmup_steps
        data["increment_per_step"] = ((s.scaled_lr - s.warmup_start_lr) / warmup_steps
                                      if warmup_steps > 0 and per == "step" else None)
    for w in s.warnings:
        err_console.print(f"[yellow]warning:[/] {w}", soft_wrap=True)

    def render(c: Console) -> None:
        c.print(f"scaled lr: [bold]{s.scaled_lr:.6g}[/] = {s.base_lr:g} × {s.batch} / "
                f"{s.base_batch} (k = {s.k:g})")
        if s.warmup_epochs > 0:
            c.print(f"warmup: {s.warmup_start_lr:.6g} → {s.scaled_lr:.6g} linearly over "
                    f"{s.warmup_epochs:g} epochs, every {s.per}")
        else:
            c.print("warmup: none")
        if steps_per_epoch is not None and data["warmup_steps"]:
            inc = data["increment_per_step"]
            c.print(f"{data['warmup_steps']:g} warmup steps"
                    + (f", +{inc:.6g} per step" if inc is not None else ""))
        t = Table()
        t.add_column("epoch", justify="right")
        t.add_column("lr at its first step", justify="right")
        for r in rows:
            t.add_row(str(r.epoch), f"{r.lr:.6g}")
        c.print(t)
    emit(data, as_json, render)
