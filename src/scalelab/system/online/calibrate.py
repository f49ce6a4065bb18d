"""Choosing the drift policy's Page-Hinkley threshold by a stated rule, on a calibration period
that the evaluation never sees.

The threshold is the drift policy's one knob: a low one retrains on every wobble of the error
rate, a high one reacts late. Reading it off the replay it is then judged on would be fitting
the answer to the test. The rule instead, on an earlier period (e.g. January-April, when the
evaluation replays May-December):

1. replay the reference fixed periods (monthly, weekly, daily) and take the best by macro F1
   (ties: the cheaper);
2. the budget is `budget` x that period's update compute (rows x epochs trained by updates;
   1/3 by default, the target's bound);
3. replay drift:T for each candidate T; among those within the budget take the best macro F1
   (ties: the cheaper, then the higher threshold); if none fits, the cheapest, flagged.

River's detectors leave this to the user too (PageHinkley's `threshold`, ADWIN's `delta`);
stating it as a compute budget on held-out history is what a user can check and repeat.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from scalelab.lab.core.errors import BadInputError
from scalelab.system.online.bench import OnlineBenchConfig, run_bench
from scalelab.system.online.policy import PERIODS, Periodic, make_policy


@dataclass(frozen=True, kw_only=True)
class Trial:
    """One policy replayed on the calibration period."""

    policy: str
    macro_f1: float
    update_samples: int
    """Rows x epochs trained by updates (the bootstrap, common to all, left out)."""
    threshold: float | None = None
    """The drift policy's threshold; None for a fixed period."""


@dataclass(kw_only=True)
class CalibrationConfig:
    """Which thresholds are tried, against which fixed periods, under which budget."""

    thresholds: list[float] = field(
        default_factory=lambda: [25.0, 50.0, 100.0, 150.0, 200.0, 300.0, 400.0])
    """Page-Hinkley thresholds (errors of evidence) tried."""
    references: list[str] = field(default_factory=lambda: ["monthly", "weekly", "daily"])
    """Fixed periods whose best (by macro F1) sets the budget."""
    budget: float = 1 / 3
    """Largest update compute allowed, as a share of the best reference's."""

    def __post_init__(self) -> None:
        if not self.thresholds or any(not t > 0 for t in self.thresholds):
            raise BadInputError(f"calibration thresholds must be > 0, got {self.thresholds}; "
                                "e.g. 25,50,100,150")
        if not 0 < self.budget <= 1:
            raise BadInputError(f"calibration budget {self.budget} must lie in (0, 1]: a share "
                                "of the best fixed period's update compute, e.g. 0.3333")
        if not self.references:
            raise BadInputError("give at least one reference fixed period, e.g. weekly,daily")
        for r in self.references:
            if not isinstance(make_policy(r), Periodic):
                raise BadInputError(f"calibration reference {r!r} must be a fixed period: "
                                    f"{', '.join(PERIODS)} or every-K")

    def policies(self) -> list[str]:
        """What to replay: the references, then drift:T per threshold."""
        return [*self.references, *(drift_policy(t) for t in self.thresholds)]


def drift_policy(threshold: float) -> str:
    """The policy name of a drift threshold: drift:150 (no trailing .0)."""
    return f"drift:{threshold:g}"


@dataclass(kw_only=True)
class Choice:
    """The threshold the rule picked, and everything it was picked from."""

    threshold: float
    policy: str
    reference: str
    """The best fixed period on the calibration period."""
    reference_macro_f1: float
    reference_update_samples: int
    budget: float
    budget_samples: float
    within_budget: bool
    macro_f1: float
    update_samples: int
    gap_points: float
    """Reference macro F1 minus the chosen one's, in points, on the calibration period."""
    reason: str
    trials: list[Trial]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def choose_threshold(references: Sequence[Trial], candidates: Sequence[Trial],
                     budget: float) -> Choice:
    """The rule of the module docstring, as a pure function of the calibration replays."""
    if not references or not candidates:
        raise BadInputError("calibration needs at least one reference and one drift trial")
    if any(c.threshold is None for c in candidates):
        raise BadInputError("every drift trial needs its threshold")
    best = max(references, key=lambda t: (t.macro_f1, -t.update_samples))
    cap = budget * best.update_samples
    fits = [c for c in candidates if c.update_samples <= cap]
    if fits:
        pick = max(fits, key=lambda c: (c.macro_f1, -c.update_samples, c.threshold or 0.0))
        reason = (f"best calibration macro F1 among {len(fits)} of {len(candidates)} thresholds "
                  f"within {budget:.4g} x {best.policy}'s update compute")
    else:
        pick = min(candidates, key=lambda c: (c.update_samples, -(c.threshold or 0.0)))
        reason = (f"no threshold within {budget:.4g} x {best.policy}'s update compute "
                  f"({cap:,.0f} samples): the cheapest; try higher thresholds")
    assert pick.threshold is not None
    return Choice(threshold=pick.threshold, policy=pick.policy, reference=best.policy,
                  reference_macro_f1=best.macro_f1,
                  reference_update_samples=best.update_samples, budget=budget,
                  budget_samples=cap, within_budget=bool(fits), macro_f1=pick.macro_f1,
                  update_samples=pick.update_samples,
                  gap_points=(best.macro_f1 - pick.macro_f1) * 100, reason=reason,
                  trials=[*references, *candidates])


def calibrate(cfg: CalibrationConfig, replay: Callable[[str], Trial]) -> Choice:
    """Replay every reference and candidate with `replay` (policy name -> its Trial on the
    calibration period) and apply the rule."""
    refs = [replay(p) for p in cfg.references]
    cands = [replay(drift_policy(t)) for t in cfg.thresholds]
    return choose_threshold(refs, cands, cfg.budget)


def trials_from_rows(rows: Sequence[dict[str, Any]]) -> dict[str, Trial]:
    """Trials from `online.bench.run_bench` result rows, by policy name."""
    out = {}
    for r in rows:
        name = r["policy"]
        t = float(name.split(":", 1)[1]) if name.startswith("drift:") else None
        out[name] = Trial(policy=name, macro_f1=float(r["macro_f1"]),
                          update_samples=int(r["update_samples"]), threshold=t)
    return out


def run_calibration(cfg: CalibrationConfig, bench: OnlineBenchConfig, work: Path,
                    experiment: str) -> tuple[Choice, dict[str, Any]]:
    """Ingest `bench.stream` (the calibration period: its own log and inferred schema in
    `work`), replay every policy the rule needs on it, and choose. Returns the choice and the
    run (`online.bench.run_bench`'s result)."""
    res = run_bench(replace(bench, policies=cfg.policies()), work, experiment)
    trials = trials_from_rows([p["result"] for p in res["policies"]])
    return calibrate(cfg, trials.__getitem__), res
