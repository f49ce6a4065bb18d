"""From the objectives file to the verdict's stage goals."""

from __future__ import annotations

from scalelab.core.verdict import StageGoal
from scalelab.diagnose.config import DiagnoseConfig, StageBase

SERVE_SERIES = {"off": "batching=off", "on": "batching=on"}
MODEL_BASELINE = "fp32"
TRAIN_SERIES = "strong"


def stage_goals(cfg: DiagnoseConfig) -> list[StageGoal]:
    s = cfg.stages
    reference: list[tuple[str, StageBase, str]] = [
        ("data", s.data, ""),
        ("train", s.train, TRAIN_SERIES),
        ("serve", s.serve, SERVE_SERIES[s.serve.baseline]),
        ("model", s.model, MODEL_BASELINE),
    ]
    goals = [
        StageGoal(stage=name, objectives=[o.build() for o in st.objectives],
                  baseline_series=series, target_multiple=st.target_multiple)
        for name, st, series in reference if st.enabled
    ]
    goals += [
        StageGoal(stage=c.name, objectives=[o.build() for o in c.objectives],
                  target_multiple=c.target_multiple)
        for c in cfg.custom
    ]
    return goals
