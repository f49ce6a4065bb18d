"""The weekly review's unit-cost table from records: cost and energy per unit at every level,
a training run's whole cost, and the report's section and JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from recordkit import M, rec
from scalelab.lab.core.economics import review_lines, unit_costs
from scalelab.lab.core.energy import with_energy
from scalelab.lab.core.objectives import Objective
from scalelab.lab.core.records import Cost, Record
from scalelab.lab.core.sheet import build_sheet
from scalelab.lab.core.verdict import StageGoal, judge
from scalelab.lab.report.document import write_report

PRICE = 0.036  # $ per core-hour: $0.00001 per core-second
PRED = "1,000 predictions"


def _records() -> list[Record]:
    out = [
        # 1 core-second over 5 units, then 3 core-seconds over 30 units
        rec("serve", "rate", 40, series="batching=on",
            cost=Cost(usd=1e-5, per_unit_usd=2e-6, unit=PRED)),
        rec("serve", "rate", 400, series="batching=on",
            cost=Cost(usd=3e-5, per_unit_usd=1e-6, unit=PRED)),
        # a capacity step measured no cost: not a unit-cost line
        rec("serve", "rate", 800, series="batching=on capacity"),
        # one training run: 3.6 core-seconds for 10,000 samples
        rec("train", "workers", 1, series="strong",
            cost=Cost(usd=3.6e-5, per_unit_usd=3.6e-3, unit="1M training samples"),
            extras={"cost_per_run_usd": 3.6e-5}),
    ]
    return [with_energy(r, core_hour_usd=PRICE, watts_per_core=3.5) for r in out]


def test_unit_costs_at_every_level() -> None:
    sheet = build_sheet(_records())
    serve_on = next(r for r in sheet if r.series == "batching=on" and r.level == 40)
    assert serve_on.energy_per_unit_j == pytest.approx(0.7, rel=1e-12)
    assert serve_on.energy_basis == "estimated (model: 3.5 W/core)"
    costs = unit_costs(sheet)
    assert [(u.stage, u.level, u.usd_per_unit) for u in costs] == [
        ("train", 1, 3.6e-3), ("serve", 40, 2e-6), ("serve", 400, 1e-6)]
    train = costs[0]
    assert train.usd_per_run == 3.6e-5
    assert train.j_per_run == pytest.approx(12.6, rel=1e-12)
    assert train.j_per_unit == pytest.approx(1260.0, rel=1e-12)
    assert review_lines(costs) == [
        "train strong: $0.0036 and 1.26 kJ / 1M training samples (one run: $3.6e-05, 12.6 J) "
        "at workers 1 [estimated (model: 3.5 W/core)]",
        "serve batching=on: $2e-06 and 0.7 J / 1,000 predictions at rate 40, $1e-06 and 0.35 J "
        "at rate 400 [estimated (model: 3.5 W/core)]",
    ]


def test_report_carries_the_review_and_the_energy_column(tmp_path: Path) -> None:
    sheet = build_sheet(_records())
    goals = [StageGoal(stage="serve", objectives=[Objective(metric="rate", min=0)],
                       baseline_series="batching=on")]
    verdict = judge(goals, sheet, cores=M.cores, memory_bytes=M.memory_bytes)
    files = write_report(tmp_path, sheet, verdict, goals, M, {"mode": "quick"})
    doc = json.loads(files.json.read_text())
    assert doc["unit_economics"]["review"][1].startswith("serve batching=on: $2e-06 and 0.7 J")
    assert len(doc["unit_economics"]["rows"]) == 3
    md = files.markdown.read_text()
    assert "## Unit economics (weekly review)" in md
    assert "| 0.7 J/1,000 predictions (estimated) |" in md
    page = files.html.read_text()
    assert "Unit economics (weekly review)" in page and "energy/unit" in page
