"""`online.calibrate`: the rule that picks the drift threshold, as pure functions with exact
numbers, on hand-made trials and on a synthetic error stream whose right threshold is known."""

from __future__ import annotations

import numpy as np
import pytest

from scalelab.lab.core.errors import BadInputError
from scalelab.system.online.calibrate import (
    CalibrationConfig,
    Trial,
    calibrate,
    choose_threshold,
    trials_from_rows,
)
from scalelab.system.online.policy import Drift, Periodic, make_policy


def _t(policy: str, f1: float, samples: int) -> Trial:
    threshold = float(policy.split(":")[1]) if policy.startswith("drift:") else None
    return Trial(policy=policy, macro_f1=f1, update_samples=samples, threshold=threshold)


REFS = [_t("monthly", 0.36, 100), _t("weekly", 0.395, 450), _t("daily", 0.40, 3000)]


def test_best_f1_within_a_third_of_the_best_fixed_periods_compute() -> None:
    cands = [_t("drift:50", 0.404, 1400), _t("drift:150", 0.394, 490),
             _t("drift:300", 0.390, 300), _t("drift:400", 0.370, 170)]
    c = choose_threshold(REFS, cands, 1 / 3)
    # daily is best (0.40): the budget is 1,000 samples; drift:50 (1,400) is over it
    assert (c.reference, c.budget_samples, c.within_budget) == ("daily", 1000.0, True)
    assert (c.policy, c.threshold, c.update_samples) == ("drift:150", 150.0, 490)
    assert c.gap_points == pytest.approx(0.6)
    assert c.trials == [*REFS, *cands]


def test_ties_go_to_the_cheaper_then_the_higher_threshold() -> None:
    refs = [_t("weekly", 0.40, 450), _t("daily", 0.40, 3000)]
    c = choose_threshold(refs, [_t("drift:100", 0.39, 140), _t("drift:200", 0.39, 120),
                                _t("drift:300", 0.39, 120)], 1 / 3)
    assert c.reference == "weekly" and c.budget_samples == 150.0
    assert c.policy == "drift:300"


def test_nothing_within_budget_takes_the_cheapest_and_says_so() -> None:
    c = choose_threshold(REFS, [_t("drift:25", 0.41, 2000), _t("drift:50", 0.404, 1400)], 0.1)
    assert (c.policy, c.within_budget) == ("drift:50", False)
    assert "no threshold within 0.1 x daily's" in c.reason and "higher thresholds" in c.reason


def test_config_checks_and_rows() -> None:
    assert CalibrationConfig(thresholds=[50, 150.5]).policies() == [
        "monthly", "weekly", "daily", "drift:50", "drift:150.5"]
    for bad, match in (({"budget": 0.0}, "budget 0.0"), ({"budget": 1.5}, "budget"),
                       ({"thresholds": [0.0]}, "thresholds must be > 0"),
                       ({"thresholds": []}, "thresholds"),
                       ({"references": ["drift"]}, "'drift' must be a fixed period"),
                       ({"references": []}, "reference")):
        with pytest.raises(BadInputError, match=match):
            CalibrationConfig(**bad)  # type: ignore[arg-type]
    rows = [{"policy": "daily", "macro_f1": 0.4, "update_samples": 30},
            {"policy": "drift:150", "macro_f1": 0.39, "update_samples": 9}]
    assert trials_from_rows(rows) == {"daily": _t("daily", 0.4, 30),
                                      "drift:150": _t("drift:150", 0.39, 9)}


# A synthetic stream: three spans of 5,000 calm events (error rate 0.2) each followed by 2,000
# drifted ones (0.6) that last until the model is updated; an update costs 100 samples. A fixed
# period every 250 events is the best reference (it answers each drift within 250 events) and
# sets the budget: 84 updates x 100 / 3 = 2,800 samples. Page-Hinkley fires on the calm noise
# at low thresholds (10: 32 updates, over the budget), answers each drift later the higher the
# threshold: the right threshold is the lowest whose false alarms fit the budget -- 15 here.
CALM, DRIFTED, SPANS, COST = 5000, 2000, 3, 100


def _simulate(policy: str) -> Trial:
    u = np.random.default_rng(7).random(SPANS * (CALM + DRIFTED))
    onsets = {s * (CALM + DRIFTED) + CALM for s in range(SPANS)}
    p = make_policy(policy)
    drifted, updates, errors = False, 0, 0.0
    for i, x in enumerate(u.tolist()):
        drifted = drifted or i in onsets
        e = float(x < (0.6 if drifted else 0.2))
        errors += e
        if isinstance(p, Periodic):
            fire = (i + 1) % p.every == 0
        else:
            assert isinstance(p, Drift)
            fire = bool(p.detector.update(np.array([e])))
        if fire:
            updates, drifted = updates + 1, False
    return _t(policy, 1 - errors / len(u), updates * COST)


def test_the_rule_finds_the_known_threshold_on_a_synthetic_stream() -> None:
    cfg = CalibrationConfig(thresholds=[5, 10, 15, 20, 50, 300],
                            references=["every-250", "every-1000", "every-3000"])
    c = calibrate(cfg, _simulate)
    samples = {t.policy: t.update_samples for t in c.trials}
    assert samples == {"every-250": 8400, "every-1000": 2100, "every-3000": 700,
                       "drift:5": 11200, "drift:10": 3200, "drift:15": 1000, "drift:20": 600,
                       "drift:50": 300, "drift:300": 300}
    assert (c.reference, c.budget_samples) == ("every-250", 2800.0)
    assert (c.threshold, c.within_budget) == (15.0, True)
    # answering each drift within a few hundred events beats every fixed period's F1
    assert c.macro_f1 > c.reference_macro_f1
