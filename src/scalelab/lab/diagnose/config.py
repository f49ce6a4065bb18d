"""The objectives file (`scalelab.yaml`): per stage, what grows, the target and the objectives.

Defaults ship in `defaults.yaml` beside this module (`scalelab diagnose --print-config` prints
them); a user file is merged over them stage by stage. Modes scale the work: quick (about a
minute on 2 cores), default (about three) and full (as long as it needs). The `stages:` section
has one entry per registered stage (diagnose.stages.STAGES), typed by the stage's own settings.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, create_model

from scalelab.lab.core.errors import BadInputError, ScalelabError
from scalelab.lab.diagnose.budget import parse_budget
from scalelab.lab.diagnose.schema import ClientSettings, HttpUrl, Prices, Strict
from scalelab.lab.diagnose.stages import SECTIONS
from scalelab.lab.diagnose.stages.custom import CustomStages

Mode = Literal["quick", "default", "full"]


def _budget(v: str) -> str:
    try:
        parse_budget(v, what="budget")
    except ScalelabError as e:
        raise ValueError(str(e)) from None
    return v


def _stages_model() -> type[BaseModel]:
    """The `stages:` section: one field per registered stage, its settings model as the type."""
    fields: dict[str, Any] = {
        st.name: (st.settings, Field(default_factory=st.settings)) for st in SECTIONS
    }
    return create_model("Stages", __config__=ConfigDict(extra="forbid"), **fields)


Stages = _stages_model()


class DiagnoseConfig(Strict):
    """The whole objectives file."""

    prices: Prices = Field(default_factory=Prices)
    """The one price table every stage's cost uses."""
    client: ClientSettings = Field(default_factory=ClientSettings)
    """Where the load generators run (a Dask cluster, or this machine)."""
    prometheus: HttpUrl | None = None
    """A Prometheus server (e.g. http://prom:9090) that scrapes the machines behind the user's
    endpoints: each level asks it for their node_exporter, cAdvisor and DCGM series."""
    budget: Annotated[str, AfterValidator(_budget)] | None = None
    """Stage time to split across the stages (diagnose.budget), e.g. 4m30s; null: none (each
    level runs one chunk, or with --full until decided up to its cap). --budget overrides."""
    repeats: int = Field(default=2, ge=1, le=20)
    """Runs per level; the sheet shows medians and ranges."""
    stages: Stages = Field(default_factory=Stages)  # type: ignore[valid-type]
    """One section per stage of diagnose.stages.STAGES."""
    custom: CustomStages = Field(default_factory=lambda: CustomStages([]))
    """The user's own stages."""

    def section(self, name: str) -> Any:
        """A stage's settings by name (the type is the stage's settings model)."""
        return getattr(self.stages, name)


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


def defaults_text() -> str:
    return resources.files("scalelab.lab.diagnose").joinpath("defaults.yaml").read_text("utf-8")


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
        raise BadInputError(f"{where}: {config_error(e)}") from e
    except BadInputError as e:
        raise BadInputError(f"{where}: {e}") from e


def config_error(e: ValidationError) -> str:
    """One line: the key path of the first mistake, what is wrong, and how to fix it."""
    err = e.errors()[0]
    loc = [str(x) for x in err["loc"]]
    # A model validator's error is located at its model; the union/wrapper parts of the
    # path (e.g. "function-after[...]") say nothing to the person editing the file.
    path = ".".join(x for x in loc if "[" not in x and "(" not in x) or "(top level)"
    msg = str(err["msg"]).removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        if loc[:1] == ["stages"] and len(loc) == 2:
            known = ", ".join(st.name for st in SECTIONS)
            return f"{path}: no such stage; the stages are {known} (custom stages go under custom:)"
        return (f"{path}: unknown key; check its spelling against "
                "scalelab diagnose --print-config")
    if err["type"] == "missing":
        return f"{path}: required; see scalelab diagnose --print-config and docs/diagnose.md"
    return f"{path}: {msg}"
