"""The online stage: how often to update a model from the stream, measured.

One `scalelab online bench` step per repeat replays the 2013 flights (late labels, validated
ingestion into the event log), then runs prequential evaluation per update policy: never, a
fixed period (monthly, weekly, daily: the "fixed" series, whose variable is updates per 30
days) and drift-triggered (Page-Hinkley on the live model's errors). Per level the sheet gets
events/s ingested, update time, staleness, quality on late labels, memory, the failure rate
(quarantined events; refused promotions in extras), cost per 1,000 predictions and per update,
and the rollback time. The advisor reads the marginal-return curve of the fixed series: the
update frequency past which quality stops improving for the compute spent, and where the drift
policy sits on it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from pydantic import Field

from scalelab.lab.core.sheet import SheetRow
from scalelab.lab.core.verdict import Advice, AdviceInput, StageGoal, num_text
from scalelab.lab.diagnose.commands import Command
from scalelab.lab.diagnose.schema import StageSettings
from scalelab.lab.diagnose.stages.base import MINIMUM_S, Context, Stage
from scalelab.lab.diagnose.steps import Step, restage

BASELINE = "fixed"


@dataclass(frozen=True, kw_only=True)
class OnlineBench(Command):
    """`scalelab online bench` (kept beside its only user, the online stage)."""

    path = ("online", "bench")
    out: Path
    policies: list[str]
    end: str | None = None
    bootstrap_days: float | None = None
    price_per_core_hour: float | None = None
    records: Path | None = None


class OnlineSettings(StageSettings):
    """`stages.online`: the replay and the update policies compared on it."""

    policies: list[str] = Field(default_factory=lambda: ["never", "monthly", "weekly", "daily",
                                                         "drift"])
    """never, monthly, weekly, daily, every-K (K daily windows) or drift."""
    end: str | None = "2013-05-01T00"
    """The replay stops before this hour (ISO); null replays all of 2013 (~4-8 min on 2 cores)."""
    bootstrap_days: float = Field(default=28.0, gt=0)
    """Days of labels the first model is fitted on (scoring starts after them)."""
    min_gain: float = Field(default=0.005, ge=0)
    """Macro-F1 gain per step up in update frequency below which more updates do not pay."""


def marginal_returns(rows: list[SheetRow]) -> list[dict[str, float]]:
    """The fixed series by update frequency: macro F1, update compute (rows x epochs) and the
    gain in macro F1 per million extra samples over the next lower frequency (pure)."""
    pts = sorted((r for r in rows if r.quality.get("macro_f1") is not None),
                 key=lambda r: r.level)
    out: list[dict[str, float]] = []
    for i, r in enumerate(pts):
        f1 = float(r.quality["macro_f1"])
        comp = float(r.extras.get("update_samples") or 0.0)
        gain = per_m = float("nan")
        if i:
            prev = out[-1]
            gain = f1 - prev["macro_f1"]
            extra = comp - prev["update_samples"]
            per_m = gain / (extra / 1e6) if extra > 0 else float("nan")
        out.append({"level": r.level, "macro_f1": f1, "update_samples": comp, "gain": gain,
                    "gain_per_million_samples": per_m})
    return out


def saturation(curve: list[dict[str, float]], min_gain: float) -> dict[str, float] | None:
    """The lowest frequency from which no step up gains `min_gain` macro F1 or more."""
    if not curve:
        return None
    for i, p in enumerate(curve):
        if all(not (q["gain"] >= min_gain) for q in curve[i + 1:]):
            return p
    return curve[-1]


def advise(inp: AdviceInput, *, min_gain: float = 0.005) -> Advice:
    """Update frequency where quality stops improving for the compute spent (pure)."""
    curve = marginal_returns(inp.by_series.get(BASELINE, []))
    sat = saturation(curve, min_gain)
    if sat is None:
        return Advice(intervention="measure at least two fixed update periods")
    if sat is curve[-1] and len(curve) > 1 and curve[-1]["gain"] >= min_gain:
        parts = [f"update {sat['level']:.3g} times per 30 days, the most measured: its step up "
                 f"still gained {curve[-1]['gain'] * 100:.2g} macro-F1 points (measure a higher "
                 "frequency or a longer replay to see the curve flatten)"]
    else:
        parts = [f"update {sat['level']:.3g} times per 30 days: more often gains < "
                 f"{min_gain * 100:g} macro-F1 point per step"]
    pred = [" → ".join(f"{p['level']:.3g}/30d: {p['macro_f1']:.4f}" for p in curve)
            + " macro F1 (fixed periods)"]
    drift = inp.by_series.get("drift", [])
    if drift:
        d = drift[0]
        f1 = d.quality.get("macro_f1")
        comp = d.extras.get("update_samples")
        if f1 is not None and isinstance(comp, int | float) and sat["update_samples"]:
            pred.append(f"drift-triggered: {f1:.4f} macro F1 at "
                        f"{comp / sat['update_samples']:.2f}x the compute of "
                        f"{sat['level']:.3g}/30d ({d.level:.3g} attempts/30d)")
            if f1 >= sat["macro_f1"] - 0.01 and comp < sat["update_samples"]:
                parts.append("or trigger updates on drift (as good for less compute)")
    never = inp.by_series.get("never", [])
    if never and never[0].quality.get("macro_f1") is not None:
        pred.append(f"never updating: {num_text(never[0].quality['macro_f1'])} macro F1")
    return Advice(intervention="; ".join(parts), predicted="; ".join(pred))


class OnlineStage(Stage[OnlineSettings]):
    name = "online"
    settings = OnlineSettings

    def count(self, s: OnlineSettings, repeats: int) -> int:
        return repeats

    def minimum_s(self, s: OnlineSettings, repeats: int) -> float:
        """Its fixed work per repeat (one step each) times the repeats."""
        return MINIMUM_S[self.name] * repeats

    def run(self, s: OnlineSettings, ctx: Context) -> None:
        work = ctx.work / "online"
        for rep in range(ctx.repeats):
            rec = ctx.records(f"online-{rep}")
            cmd = OnlineBench(out=work / str(rep), policies=s.policies, end=s.end,
                              bootstrap_days=s.bootstrap_days,
                              price_per_core_hour=ctx.prices.core_hour_usd, records=rec)
            ctx.run(Step(stage=self.name, label=f"online bench #{rep + 1}", command=cmd,
                         records=rec, tag=functools.partial(restage, stage=self.name,
                                                            repeat=rep), timeout_s=3600))

    def goals(self, s: OnlineSettings) -> list[StageGoal]:
        return [StageGoal(stage=self.name, objectives=s.built_objectives(),
                          baseline_series=BASELINE, target_multiple=s.target_multiple,
                          advisor=functools.partial(advise, min_gain=s.min_gain))]


STAGE = OnlineStage()
