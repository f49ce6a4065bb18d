"""The diagnose online stage: the marginal-return advisor over sheet rows (exact numbers), its
command's flags against the CLI, and its settings from defaults.yaml."""

from __future__ import annotations

from typing import Any

import click

from scalelab.lab.core.objectives import Objective
from scalelab.lab.core.sheet import SheetRow
from scalelab.lab.core.verdict import AdviceInput, StageGoal
from scalelab.lab.diagnose.config import load_config
from scalelab.lab.diagnose.stages.online import (
    STAGE,
    OnlineBench,
    advise,
    marginal_returns,
    saturation,
)


def row(series: str, level: float, f1: float, samples: float, **extras: Any) -> SheetRow:
    return SheetRow(stage="online", series=series, variable="updates_per_30d", level=level,
                    multiple=level, repeats=1, failures=0, input_volume=1000.0,
                    input_unit="events", rate=1e5, rate_min=1e5, rate_max=1e5,
                    rate_unit="events/s", wall_s=1.0, p50_ms=100.0, p95_ms=200.0, p99_ms=None,
                    peak_memory_bytes=1, failure_rate=0.0, quality={"macro_f1": f1},
                    cost_per_unit_usd=None, cost_unit=None, recovery=None,
                    limiting_resource=None, extras={"update_samples": samples, **extras})


FIXED = [row("fixed", 1, 0.36, 1e5), row("fixed", 30 / 7, 0.39, 4e5),
         row("fixed", 30, 0.392, 3e6)]


def test_marginal_returns_and_where_they_stop() -> None:
    c = marginal_returns(FIXED)
    assert [round(p["gain"], 6) for p in c[1:]] == [0.03, 0.002]
    assert round(c[1]["gain_per_million_samples"], 6) == 0.1  # 0.03 per 0.3 M samples
    assert saturation(c, 0.005) == c[1]  # weekly: daily adds only 0.2 points
    assert saturation(c, 0.05) == c[0]
    assert saturation([], 0.005) is None


def test_the_advice_names_the_frequency_and_the_drift_policy() -> None:
    goal = StageGoal(stage="online", objectives=[Objective(metric="quality:macro_f1", min=0.3)],
                     baseline_series="fixed", target_multiple=30)
    by = {"fixed": FIXED, "drift": [row("drift", 2.0, 0.388, 1e5)],
          "never": [row("never", 0, 0.31, 0)]}
    a = advise(AdviceInput(goal=goal, base=FIXED, by_series=by, limits=[], miss=None))
    assert a.intervention == ("update 4.29 times per 30 days: more often gains < 0.5 macro-F1 "
                              "point per step; or trigger updates on drift (as good for less "
                              "compute)")
    assert "drift-triggered: 0.3880 macro F1 at 0.25x the compute of 4.29/30d" in a.predicted
    assert "never updating: 0.31 macro F1" in a.predicted
    rising = [row("fixed", 1, 0.36, 1e5), row("fixed", 30, 0.38, 3e6)]
    b = advise(AdviceInput(goal=goal, base=rising, by_series={"fixed": rising}, limits=[],
                           miss=None))
    assert b.intervention.startswith("update 30 times per 30 days, the most measured: its step "
                                     "up still gained 2 macro-F1 points")


def test_the_command_matches_the_cli_and_the_defaults_load() -> None:
    from scalelab.cli.online import bench_cmd

    assert isinstance(bench_cmd, click.Command)
    names = {o for p in bench_cmd.params for o in p.opts}
    assert set(OnlineBench.flags().values()) <= names
    d, q = load_config(None), load_config(None, "quick")
    s, sq = STAGE.of(d), STAGE.of(q)
    assert s.policies == ["never", "monthly", "weekly", "daily", "drift"]
    assert sq.end == "2013-02-12T00" and sq.objectives == s.objectives
    assert STAGE.goals(s)[0].baseline_series == "fixed"
