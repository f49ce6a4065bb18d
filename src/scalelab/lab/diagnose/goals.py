"""From the objectives file to the verdict's stage goals, stage by stage."""

from __future__ import annotations

from scalelab.lab.core.verdict import StageGoal
from scalelab.lab.diagnose.config import DiagnoseConfig
from scalelab.lab.diagnose.stages import STAGES


def stage_goals(cfg: DiagnoseConfig) -> list[StageGoal]:
    goals: list[StageGoal] = []
    for st in STAGES:
        s = st.of(cfg)
        if st.enabled(s):
            goals += st.goals(s)
    return goals
