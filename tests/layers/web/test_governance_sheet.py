"""The sheet's governance cell: read from a server's /metrics, carried by records, shown in
the report."""

from __future__ import annotations

import sys
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest

sys.path.insert(0, str(Path(__file__).parents[2]))

from recordkit import M, rec
from scalelab.lab.core.objectives import Objective
from scalelab.lab.core.sheet import build_sheet
from scalelab.lab.core.verdict import StageGoal, judge
from scalelab.lab.report.document import render_markdown, report_json, stage_governance
from scalelab.layers.web.governance.config import parse_governance
from scalelab.layers.web.governance.governor import Governor, GovernorCollector
from scalelab.layers.web.governance.middleware import governance_from_metrics

CELL = ("rate limits: 2 clients; budgets: requests/day default 1,000,000; kill switches: "
        "none engaged")


def test_the_cell_comes_from_the_servers_metrics_text() -> None:
    g = Governor(parse_governance({
        "default": {"rate": 100, "budgets": [{"unit": "requests", "period": "day",
                                              "limit": 1_000_000}]},
        "clients": {"batch-jobs": {"keys": ["sk-batch-0123456789"], "rate": 50}}}, "f"))
    reg = CollectorRegistry(auto_describe=False)
    reg.register(GovernorCollector(g))
    text = "scalelab_responses_total 3.0\n" + generate_latest(reg).decode()
    assert governance_from_metrics(text) == CELL
    g.stop_model("flights")
    engaged = governance_from_metrics(generate_latest(reg).decode())
    assert engaged.endswith("kill switches: model flights stopped")
    assert governance_from_metrics("scalelab_responses_total 3.0\n") == "none configured"


def test_sheet_row_and_report_show_the_stages_governance() -> None:
    records = [rec("serve", "rate", lvl, rate=lvl, p95=5.0, extras={"governance": CELL})
               for lvl in (50, 100)] + [rec("data", "scale", 1, rate=10.0)]
    sheet = build_sheet(records)
    assert [(r.stage, r.governance) for r in sheet] == [("data", None), ("serve", CELL),
                                                        ("serve", CELL)]
    goals = [StageGoal(stage="serve", objectives=[Objective(metric="p95_ms", max=50)]),
             StageGoal(stage="data", objectives=[Objective(metric="rate", min=1)])]
    verdict = judge(goals, sheet, cores=M.cores, memory_bytes=M.memory_bytes)
    assert stage_governance([r for r in sheet if r.stage == "data"]) is None
    md = render_markdown(sheet, verdict, M, {"mode": "quick"})  # html: the same helper, plots
    assert f"## Governance\n\n- serve: {CELL}\n" in md
    doc = report_json(sheet, verdict, M, {"mode": "quick"}, None)
    assert [r["governance"] for r in doc["sheet"]] == [None, CELL, CELL]
