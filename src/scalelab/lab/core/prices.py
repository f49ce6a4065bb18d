"""The one price table: every cost scalelab prints is computed from it.

`scalelab diagnose` reads it from the objectives file's `prices:` section; every other command
that prints a cost takes the same table with `--prices FILE` (that same `scalelab.yaml`, or a
YAML of just the prices) or `$SCALELAB_PRICES`, and falls back to the defaults below — the same
defaults `scalelab diagnose --print-config` shows. A per-run flag such as `--core-hour-usd`
overrides one entry of the table for that run, and the output says so.
"""

from __future__ import annotations

import os
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from scalelab.lab.core.errors import BadInputError

ENV = "SCALELAB_PRICES"


class Prices(BaseModel):
    """The one price table every stage's cost is computed from."""

    model_config = ConfigDict(extra="forbid")

    core_hour_usd: float = Field(default=0.048, ge=0)
    """On-demand price of one vCPU-hour (a c7i-class core)."""
    gpu_hour_usd: float = Field(default=3.0, ge=0)
    """On-demand price of one data-centre GPU-hour."""
    gb_month_usd: float = Field(default=0.023, ge=0)
    """Object storage per GB-month."""
    watts_per_core: float = Field(default=3.5, gt=0)
    """Watts of one busy core, for energy where RAPL is not readable: core-seconds × this
    (Cloud Carbon Footprint's AWS figure for a vCPU at full load; see core/energy.py)."""

    def hourly_usd(self, cores: float, gpus: float = 0.0) -> float:
        """What a machine (or replica) of `cores` vCPUs and `gpus` GPUs costs per hour."""
        return cores * self.core_hour_usd + gpus * self.gpu_hour_usd


def read_prices(path: Path) -> Prices:
    """The table in `path`: its `prices:` mapping (a scalelab.yaml), or the file's top-level
    mapping (a file of just prices). Entries it leaves out keep their defaults."""
    try:
        obj = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BadInputError(f"price table {path} does not exist; pass a scalelab.yaml "
                            "(its prices: section) or a YAML of core_hour_usd, ...") from None
    except (UnicodeDecodeError, IsADirectoryError) as e:
        raise BadInputError(f"price table {path} is not a UTF-8 text file ({e})") from e
    except yaml.YAMLError as e:
        raise BadInputError(f"price table {path}: not valid YAML; check indentation "
                            "and colons") from e
    if obj is None:
        obj = {}
    if not isinstance(obj, dict):
        raise BadInputError(f"price table {path}: the top level must be a mapping")
    table = obj.get("prices", obj if "stages" not in obj else {})
    if not isinstance(table, dict):
        raise BadInputError(f"price table {path}: prices must be a mapping of "
                            "core_hour_usd, gpu_hour_usd, gb_month_usd, watts_per_core")
    try:
        return Prices.model_validate(table)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(x) for x in err["loc"])
        raise BadInputError(f"price table {path}: {loc}: {err['msg']} (known: "
                            f"{', '.join(Prices.model_fields)})") from e


def price_table(path: Path | None = None) -> tuple[Prices, str]:
    """The configured table and where it came from: `path`, else $SCALELAB_PRICES, else the
    built-in defaults."""
    if path is not None:
        return read_prices(path), str(path)
    env = os.environ.get(ENV)
    if env:
        return read_prices(Path(env)), f"${ENV}={env}"
    return Prices(), "built-in defaults"


DEFAULT = Prices()
"""The built-in table (library defaults of every config that prices something use it)."""
