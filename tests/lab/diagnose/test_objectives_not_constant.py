"""No objective that cannot fail: none of the default objectives is judged on a series where
it holds by construction (recall against exact search on exact search, an F1 delta against
fp32 on fp32, memory against the raw vectors on the raw vectors)."""

import re

from recordkit import M
from scalelab.lab.core.records import Record, make_record
from scalelab.lab.core.sheet import build_sheet
from scalelab.lab.core.verdict import judge_stage
from scalelab.lab.diagnose.config import load_config
from scalelab.lab.diagnose.goals import stage_goals
from scalelab.lab.report.verdict_text import candidate_lines

# A metric measured against a reference series: a delta, a ratio "_vs_" something, or recall
# (against exact search). On its reference it is constant (0 or 1) whatever happens.
RELATIVE = re.compile(r"delta|_vs_|recall")


def test_no_default_objective_compares_the_baseline_with_itself() -> None:
    goals = stage_goals(load_config(None, "default"))
    assert {g.stage for g in goals} >= {"data", "train", "serve", "llm", "model", "retrieval",
                                        "online"}
    for g in goals:
        for o in g.objectives:
            if RELATIVE.search(o.metric):
                # It must be judged on the candidates, and the stage must have a baseline
                # those candidates are compared with.
                assert o.metric in g.candidate_metrics, (g.stage, o.metric)
                assert g.baseline_series, g.stage
            else:
                assert o.metric not in g.candidate_metrics, (g.stage, o.metric)
    # The relative objectives of the defaults, named (a new one must be classified too).
    assert sorted(m for g in goals for m in g.candidate_metrics) == [
        "extras:memory_vs_raw", "quality:macro_f1_delta_points", "quality:recall_at_10",
        "quality:worst_class_f1_delta_points"]


def test_relative_objectives_are_judged_on_every_candidate_and_can_fail() -> None:
    goal = next(g for g in stage_goals(load_config(None, "default")) if g.stage == "retrieval")

    def r(series: str, level: float, recall: float, mem: float) -> Record:
        return make_record(experiment="t", stage="retrieval", variable="docs", level=level,
                           rate=100.0, machine=M, quality={"recall_at_10": recall},
                           extras={"series": series, "memory_vs_raw": mem})

    recs = [r("exact", lvl, 1.0, 1.0) for lvl in (500, 1000)]
    recs += [r("faiss:HNSW32", 500, 0.97, 1.2), r("faiss:HNSW32", 1000, 0.93, 1.2)]
    recs += [r("ivfpq", lvl, 0.99, 0.2) for lvl in (500, 1000)]
    v = judge_stage(goal, build_sheet(recs), cores=2, memory_bytes=M.memory_bytes)
    # The baseline is never checked against itself.
    assert {c.objective.metric for c in v.checks}.isdisjoint(goal.candidate_metrics)
    assert {c.series for c in v.candidate_checks} == {"faiss:HNSW32", "ivfpq"}
    assert candidate_lines(v) == [
        "faiss:HNSW32: misses recall@10 ≥ 0.95 vs exact at 2× (0.93, point (1 repeat))",
        "ivfpq: meets recall@10 ≥ 0.95 vs exact, index ≤ 1.5× the raw vectors up to 2×, "
        "as measured points",
    ]
    assert v.tightest is None or "recall" not in v.tightest.check.objective.label
