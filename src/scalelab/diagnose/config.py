"""The objectives file (`scalelab.yaml`): per stage, what grows, the target and the objectives.

Defaults ship in `defaults.yaml` beside this module (`scalelab diagnose --print-config` prints
them); a user file is merged over them stage by stage. Modes scale the work: quick (about a
minute on 2 cores), default (about three) and full (as long as it needs).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from scalelab.core.errors import BadInputError
from scalelab.core.objectives import Objective

Mode = Literal["quick", "default", "full"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ObjectiveSpec(_Strict):
    metric: str
    min: float | None = None
    max: float | None = None
    label: str = ""

    def build(self) -> Objective:
        return Objective(metric=self.metric, min=self.min, max=self.max, label=self.label)


class Prices(_Strict):
    core_hour_usd: float = Field(default=0.048, ge=0)
    """On-demand price of one vCPU-hour (a c7i-class core)."""
    gpu_hour_usd: float = Field(default=3.0, ge=0)
    gb_month_usd: float = Field(default=0.023, ge=0)
    """Object storage per GB-month."""


class StageBase(_Strict):
    enabled: bool = True
    target_multiple: float = Field(default=10.0, gt=0)
    """The multiple of today's load the stage must reach (e.g. 10× today's volume)."""
    objectives: list[ObjectiveSpec] = Field(default_factory=list)

    @field_validator("objectives")
    @classmethod
    def _valid(cls, v: list[ObjectiveSpec]) -> list[ObjectiveSpec]:
        for o in v:
            o.build()  # raises BadInputError naming the metric
        return v


class DataStage(StageBase):
    levels: list[float] = Field(default_factory=lambda: [1.0, 2.0, 5.0, 10.0])
    """Multiples of the base volume."""
    sample_rows: int = Field(default=30000, ge=1000)
    """Rows of flights per copy at 1× (the whole year is 336,776)."""


class TrainStage(StageBase):
    workers: list[int] = Field(default_factory=lambda: [1, 2, 4])
    steps: int = Field(default=30, ge=1)
    batch: int = Field(default=512, ge=1)
    limit_rows: int = Field(default=40000, ge=1000)


class ServeStage(StageBase):
    base_rate: float = Field(default=40.0, gt=0)
    """Arrival rate (requests/s) at 1×."""
    levels: list[float] = Field(default_factory=lambda: [1.0, 2.0, 5.0, 10.0])
    duration: str = "3s"
    """Measured time per level (after a 1 s warm-up)."""
    batching: list[Literal["off", "on"]] = Field(
        default_factory=lambda: ["off", "on"]  # type: ignore[arg-type]
    )
    baseline: Literal["off", "on"] = "off"
    """Which batching setting is 'today's system'; the other is the candidate intervention."""
    url: str | None = None
    """The user's own HTTP endpoint instead of the reference model server."""
    serial_ms: float = Field(default=0.0, ge=0, le=10_000)
    """An artificial serial section added to every forward call of the served model (the
    "delay_mlp" architecture): throttles serving on purpose, to rehearse the verdict."""


class ModelStage(StageBase):
    variants: list[str] = Field(default_factory=lambda: ["int8", "prune-structured-50", "distill"])


class CustomStage(_Strict):
    """A stage of the user's own system: a command to sweep (your pipeline, trainer or job over
    growing inputs or workers) or an HTTP endpoint to load."""

    name: str = Field(pattern=r"^[a-z][a-z0-9_-]*$")
    kind: Literal["sweep", "load"]
    command: list[str] | None = None
    """kind=sweep: the command, with {VAR} where the level goes."""
    var: str = "workers"
    levels: list[float] = Field(default_factory=lambda: [1.0, 2.0, 5.0, 10.0])
    metric: str | None = None
    url: str | None = None
    """kind=load: the URL to load (open loop, rates = levels × base_rate)."""
    body: str | None = None
    """kind=load: a JSON file POSTed as each request's body (default: GET)."""
    base_rate: float = 10.0
    duration: str = "3s"
    target_multiple: float = 10.0
    objectives: list[ObjectiveSpec] = Field(default_factory=list)


class Stages(_Strict):
    data: DataStage = Field(default_factory=DataStage)
    train: TrainStage = Field(default_factory=TrainStage)
    serve: ServeStage = Field(default_factory=ServeStage)
    model: ModelStage = Field(default_factory=ModelStage)


class DiagnoseConfig(_Strict):
    prices: Prices = Field(default_factory=Prices)
    repeats: int = Field(default=2, ge=1, le=20)
    stages: Stages = Field(default_factory=Stages)
    custom: list[CustomStage] = Field(default_factory=list)


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


def defaults_text() -> str:
    return resources.files("scalelab.diagnose").joinpath("defaults.yaml").read_text("utf-8")


def _parse_yaml(text: str, where: str) -> dict[str, Any]:
    try:
        obj = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise BadInputError(f"{where}: not valid YAML{at}; check indentation and colons") from e
    if obj is None:
        return {}
    if not isinstance(obj, dict):
        raise BadInputError(f"{where}: the top level must be a mapping (prices, repeats, stages)")
    return obj


def load_config(path: Path | None, mode: Mode = "default") -> DiagnoseConfig:
    """Defaults, then the mode's adjustments, then the user's file on top."""
    data = _parse_yaml(defaults_text(), "defaults.yaml")
    modes = data.pop("modes", {})
    data = _merge(data, modes.get(mode, {}))
    where = "defaults.yaml"
    if path is not None:
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise BadInputError(f"config file {path} does not exist") from None
        except (UnicodeDecodeError, IsADirectoryError) as e:
            raise BadInputError(f"config file {path} is not a UTF-8 text file ({e})") from e
        data = _merge(data, _parse_yaml(text, str(path)))
        where = str(path)
    try:
        return DiagnoseConfig.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(x) for x in err["loc"])
        raise BadInputError(
            f"{where}: {loc}: {err['msg']}; see the README's Objectives "
            "section (scalelab diagnose --print-config shows the defaults)"
        ) from e
    except BadInputError as e:
        raise BadInputError(f"{where}: {e}") from e
