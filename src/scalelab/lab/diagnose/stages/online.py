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

import datetime as dt
import functools
from dataclasses import dataclass
from pathlib import Path

from pydantic import Field

from scalelab.lab.core.sheet import SheetRow
from scalelab.lab.core.verdict import Advice, AdviceInput, StageGoal, num_text
from scalelab.lab.diagnose.budget import Part, Work
from scalelab.lab.diagnose.commands import Command
from scalelab.lab.diagnose.schema import StageSettings
from scalelab.lab.diagnose.sizing import target_level
from scalelab.lab.diagnose.stages.base import Context, FixedStage
from scalelab.lab.diagnose.steps import Step, restage

BASELINE = "fixed"
START_S = 6.5
"""Quiet 2-core seconds of a bench's start: imports, the schema inferred, the replay built and
ingested into the event log. The policies' costs below split the stage's quiet time by the
CPU seconds of a whole bench measured at load 10–11 (2026-12-07: 31.5 CPU-s; policies' walls
never 10.8 s, monthly 6.1, weekly 7.6, daily 34.6, drift 8.7); this start is what is left of
the whole bench's wall on the quiet 2-core VM (2026-12-07, load 1.0–1.1, the demo's replay
to 2013-05-01): monthly and daily 14.3 s, with never 16.4 s, all five 19.1 s."""
SCORE_S_PER_DAY = 0.011
"""Quiet seconds a replayed day's windows take to score (predict, then learn the labels)."""
UPDATE_S = 0.061
"""Quiet seconds of one update attempt (a fine-tune on the lookback windows, the gate)."""
DRIFT_UPDATES_PER_30D = 5.9
"""Update attempts per 30 days the drift policy made on the default replay (records of
2026-12-07)."""
YEAR_START = dt.datetime(2013, 1, 1)
YEAR_END = dt.datetime(2014, 1, 1)


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


def per_30_days(policy: str) -> float | None:
    """A fixed period's nominal updates per 30 days (pure): monthly 1, weekly 30/7, daily 30,
    every-K 30/K; None for never and drift (series of their own)."""
    nominal = {"monthly": 1.0, "weekly": 30.0 / 7.0, "daily": 30.0}
    if policy in nominal:
        return nominal[policy]
    if policy.startswith("every-") and policy[6:].isdigit() and int(policy[6:]) > 0:
        return 30.0 / int(policy[6:])
    return None


def needed_policies(policies: list[str], target: float) -> list[str]:
    """The policies the decision needs (pure): the fixed series' lowest frequency (its
    multiples are read against it) and the one at the target multiple (or the highest under
    it); the other fixed periods are curve points, never and drift candidate series."""
    fixed = sorted((f, p) for p in policies if (f := per_30_days(p)) is not None)
    if not fixed:
        return policies[:1]
    base = fixed[0][0]
    top = target_level([f / base for f, _ in fixed], target)
    return list(dict.fromkeys([fixed[0][1], next(p for f, p in fixed
                                                  if abs(f / base - top) < 1e-9)]))


def replay_days(s: OnlineSettings) -> float:
    """Days the replay scores after its bootstrap (pure): from 2013's first flight to `end`
    (the year's end when null), less the bootstrap days."""
    end = dt.datetime.fromisoformat(s.end) if s.end else YEAR_END
    return max(0.0, (end - YEAR_START).total_seconds() / 86400.0 - s.bootstrap_days)


def policy_s(policy: str, days: float) -> float:
    """Quiet 2-core seconds of one policy's prequential replay over `days` (pure): scoring
    every window, and an update (a fine-tune, the gate) per period; drift's updates are what
    its detector triggers, `DRIFT_UPDATES_PER_30D` on the 2013 replay."""
    f = per_30_days(policy)
    if policy == "never":
        f = 0.0
    elif f is None:
        f = DRIFT_UPDATES_PER_30D
    return SCORE_S_PER_DAY * days + UPDATE_S * f * days / 30.0


class OnlineStage(FixedStage[OnlineSettings]):
    name = "online"
    settings = OnlineSettings

    def count(self, s: OnlineSettings, repeats: int) -> int:
        return repeats

    def work(self, s: OnlineSettings, repeats: int) -> Work:
        """One step a repeat: its start and ingestion, then each policy's replay."""
        needed = needed_policies(s.policies, s.target_multiple)
        days = replay_days(s)
        order = [*needed, *(p for p in s.policies if p not in needed)]
        return Work(fixed_s=START_S * repeats, parts=tuple(
            Part(name=f"policy {p}", cost_s=policy_s(p, days) * repeats, needed=p in needed,
                 role="curve point" if per_30_days(p) is not None else "candidate series")
            for p in order))

    def run(self, s: OnlineSettings, ctx: Context) -> None:
        plan = self.plan(s, ctx)
        if self.hopeless(ctx, plan.cost_s / ctx.repeats):
            return
        names = {p.name for p in plan.kept}
        policies = [p for p in s.policies if f"policy {p}" in names]
        per_repeat = plan.cost_s / ctx.repeats
        repeats = ctx.repeats
        if plan.share_s is not None:
            repeats = max(1, min(repeats, int(plan.share_s / plan.slow / per_repeat)))
        if repeats < ctx.repeats:
            ctx.note(f"online: {repeats} repeat(s) of {ctx.repeats}: its {plan.share_s:.3g} s "
                     f"share at this run's pace ({plan.slow:.3g}× the quiet estimates) pays "
                     f"for {repeats} of ~{per_repeat * plan.slow:.3g} s each")
        work = ctx.work / "online"
        for rep in range(repeats):
            rec = ctx.records(f"online-{rep}")
            cmd = OnlineBench(out=work / str(rep), policies=policies, end=s.end,
                              bootstrap_days=s.bootstrap_days,
                              price_per_core_hour=ctx.prices.core_hour_usd, records=rec)
            ctx.run(Step(stage=self.name, label=f"online bench #{rep + 1}", command=cmd,
                         records=rec, tag=functools.partial(restage, stage=self.name,
                                                            repeat=rep), timeout_s=3600,
                         estimate_s=per_repeat))

    def goals(self, s: OnlineSettings) -> list[StageGoal]:
        return [StageGoal(stage=self.name, objectives=s.built_objectives(),
                          baseline_series=BASELINE, target_multiple=s.target_multiple,
                          advisor=functools.partial(advise, min_gain=s.min_gain))]


STAGE = OnlineStage()
