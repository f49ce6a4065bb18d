"""What every stage section of the objectives file shares: objectives, the target, prices.

A stage module (diagnose/stages/) subclasses `StageSettings` for its own section
(`stages.<name>` in `scalelab.yaml`); fields carry a docstring each and are validated when the
file is read, so a typo names the field.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from scalelab.lab.core.errors import ScalelabError
from scalelab.lab.core.objectives import Objective
from scalelab.lab.core.prices import Prices
from scalelab.lab.core.units import parse_duration
from scalelab.lab.load.send import Target

__all__ = ["ClientSettings", "Duration", "EndpointAccess", "HttpUrl", "Levels", "ObjectiveSpec",
           "Prices", "StageSettings", "Strict"]


def _levels(v: list[float]) -> list[float]:
    if not v:
        raise ValueError("needs at least one level, e.g. [1, 2, 5, 10]")
    bad = [x for x in v if not x > 0]
    if bad:
        raise ValueError(f"levels must be > 0 (got {bad}); e.g. [1, 2, 5, 10]")
    if len(set(v)) != len(v):
        raise ValueError(f"levels {v} repeat a level; list each once, e.g. [1, 2, 5, 10]")
    return v


def _duration(v: str) -> str:
    try:
        seconds = parse_duration(v)
    except ScalelabError as e:
        raise ValueError(str(e)) from None
    if seconds <= 0:
        raise ValueError(f"{v!r} must be longer than 0 s, e.g. 3s")
    return v


def _http_url(v: str) -> str:
    try:
        Target.parse(v)
    except ScalelabError as e:
        raise ValueError(str(e)) from None
    return v


Levels = Annotated[list[float], AfterValidator(_levels)]
"""Levels of what grows: at least one, each > 0, none repeated."""
Duration = Annotated[str, AfterValidator(_duration)]
"""A duration such as 3s, 500ms or 2m, longer than 0."""
HttpUrl = Annotated[str, AfterValidator(_http_url)]
"""An http(s) URL with a host (and a valid port)."""


class Strict(BaseModel):
    """A section of the objectives file: unknown keys are errors, not silently ignored."""

    model_config = ConfigDict(extra="forbid")


class ClientSettings(Strict):
    """Where the load stages' generators run (`client:`); the system under test runs where
    each stage says (its `url`, or the server the stage starts)."""

    cluster: str | None = Field(default=None, pattern=r"^(tcp|tls)://[^\s/:]+:[0-9]+$")
    """A Dask scheduler, tcp://HOST:PORT: load, load capacity, load llm and sweep steps run
    their generators (or commands) on its workers (`--cluster`). None: on this machine."""


_HEADER = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
_ENV = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class EndpointAccess(Strict):
    """How the load generator talks to a user's endpoint (`stages.serve.url`,
    `stages.llm.url`, a custom `kind: load` stage): headers and the key."""

    headers: dict[str, str] = Field(default_factory=dict)
    """Headers sent with every request, e.g. {X-Tenant: a}. Values are passed on the load
    command's line: put a secret in `api_key_env`, not here."""
    api_key_env: str | None = None
    """The environment variable holding the endpoint's key, sent as 'Authorization: Bearer
    <key>' (e.g. OPENAI_API_KEY); the commands, logs and reports name the variable only."""

    @model_validator(mode="after")
    def _access(self) -> EndpointAccess:
        for name, value in self.headers.items():
            if not _HEADER.match(name) or "\n" in value or "\r" in value:
                raise ValueError(f"headers: {name!r} is not a header NAME: one-line VALUE")
        if self.api_key_env is not None and not _ENV.match(self.api_key_env):
            raise ValueError(f"api_key_env {self.api_key_env!r} is not an environment "
                             "variable's name, e.g. OPENAI_API_KEY")
        return self

    def header_flags(self) -> list[str] | None:
        """The headers as `--header NAME:VALUE` values (None: none)."""
        return [f"{k}: {v}" for k, v in self.headers.items()] or None

    def access(self) -> dict[str, Any]:
        """The load commands' keywords for these headers and this key (`header`,
        `api_key_env`)."""
        return {"header": self.header_flags(), "api_key_env": self.api_key_env}


class ObjectiveSpec(Strict):
    """One objective as written in YAML: `{metric: p95_ms, max: 50, label: "p95 ≤ 50 ms"}`."""

    metric: str
    """A sheet metric: rate, wall_s, p50_ms, p95_ms, p99_ms, failure_rate, availability,
    peak_memory_bytes, cost_per_unit_usd, efficiency, quality:<key> or extras:<key>."""
    min: float | None = None
    """Lower bound (exactly one of min or max)."""
    max: float | None = None
    """Upper bound (exactly one of min or max)."""
    label: str = ""
    """How people say it; generated from the metric and bound when empty."""

    @model_validator(mode="after")
    def _valid(self) -> ObjectiveSpec:
        self.build()  # raises BadInputError naming the metric, before anything runs
        return self

    def build(self) -> Objective:
        return Objective(metric=self.metric, min=self.min, max=self.max, label=self.label)


class StageSettings(Strict):
    """The fields every stage section has; a stage adds what it scales."""

    enabled: bool = True
    """Run this stage (false: skip it and leave it out of the verdict)."""
    target_multiple: float = Field(default=10.0, gt=0)
    """The multiple of today's load the stage must reach (e.g. 10× today's volume)."""
    objectives: list[ObjectiveSpec] = Field(default_factory=list)
    """What the stage must keep at every level up to the target."""

    def built_objectives(self) -> list[Objective]:
        return [o.build() for o in self.objectives]
