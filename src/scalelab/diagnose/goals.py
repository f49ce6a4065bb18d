"""From the objectives file to the verdict's stage goals, stage by stage."""

from __future__ import annotations

from scalelab.core.verdict import StageGoal
from scalelab.diagnose.config import DiagnoseConfig
from scalelab.diagnose.stages import STAGES


def stage_goals(cfg: DiagnoseConfig) -> list[StageGoal]:
    goals: list[StageGoal] = []
    for st in STAGES:
        s = st.of(cfg)
        if st.enabled(s):
            goals += st.goals(s)
    return goals
