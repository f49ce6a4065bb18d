"""From the objectives file to the verdict's stage goals."""

from __future__ import annotations

from scalelab.core.verdict import StageGoal
from scalelab.diagnose.config import DiagnoseConfig

SERVE_SERIES = {"off": "batching=off", "on": "batching=on"}
MODEL_BASELINE = "fp32"
TRAIN_SERIES = "strong"


def stage_goals(cfg: DiagnoseConfig) -> list[StageGoal]:
    s = cfg.stages
    goals: list[StageGoal] = []
    if s.data.enabled:
        goals.append(
            StageGoal(
                stage="data",
                objectives=[o.build() for o in s.data.objectives],
                target_multiple=s.data.target_multiple,
            )
        )
    if s.train.enabled:
        goals.append(
            StageGoal(
                stage="train",
                objectives=[o.build() for o in s.train.objectives],
                baseline_series=TRAIN_SERIES,
                target_multiple=s.train.target_multiple,
            )
        )
    if s.serve.enabled:
        goals.append(
            StageGoal(
                stage="serve",
                objectives=[o.build() for o in s.serve.objectives],
                baseline_series=SERVE_SERIES[s.serve.baseline],
                target_multiple=s.serve.target_multiple,
            )
        )
    if s.model.enabled:
        goals.append(
            StageGoal(
                stage="model",
                objectives=[o.build() for o in s.model.objectives],
                baseline_series=MODEL_BASELINE,
                target_multiple=s.model.target_multiple,
            )
        )
    for c in cfg.custom:
        goals.append(
            StageGoal(
                stage=c.name,
                objectives=[o.build() for o in c.objectives],
                target_multiple=c.target_multiple,
            )
        )
    return goals
