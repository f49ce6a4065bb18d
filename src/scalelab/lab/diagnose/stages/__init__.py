"""The stages of `scalelab diagnose`, in the order they run.

How to add a stage (e.g. "llm"):

1. Write `diagnose/stages/llm.py` with
   - `class LlmSettings(StageSettings)`: the fields of its `stages.llm` section, each with a
     docstring (what grows, how long, where);
   - `class LlmStage(Stage[LlmSettings])` with `name = "llm"`, `settings = LlmSettings` and
     `count`, `run` and `goals`: `run` builds each step from a typed command of
     `diagnose.commands` (add the command's option class there if it is new: the test checks
     its flags against the CLI) and runs it with `ctx.run(Step(...))`; a server it needs comes
     from `web.spawn.start_server`; `goals` returns a `StageGoal` with the stage's baseline
     series and its advisor (a pure function AdviceInput -> Advice);
   - `STAGE = LlmStage()`.
2. Add `llm.STAGE` to `STAGES` below, where it should run.
3. Add its `llm:` section to `diagnose/defaults.yaml` (levels, objectives, and the quick/full
   mode adjustments).

Nothing else changes: the config's `stages` section, the step count, the sheet, the verdict
and the report come from this list. Each step still runs in its own `scalelab` process and
writes records; the report is rebuilt from records alone.
"""

from __future__ import annotations

from typing import Any

from scalelab.lab.diagnose.stages import custom, data, llm, model, online, retrieval, serve, train
from scalelab.lab.diagnose.stages.base import Stage

STAGES: list[Stage[Any]] = [
    data.STAGE,
    train.STAGE,
    serve.STAGE,
    llm.STAGE,
    model.STAGE,
    retrieval.STAGE,
    online.STAGE,
    custom.STAGE,
]
"""Every stage, in the order a diagnosis runs them (the user's custom stages last)."""

SECTIONS: list[Stage[Any]] = [s for s in STAGES if s.section]
"""The stages with a section under `stages:` in scalelab.yaml."""
