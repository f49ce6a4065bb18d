"""The `governance:` file: who the clients are, their rate limits, caps and budgets.

A YAML or JSON file (`--governance FILE` on `scalelab serve`, `generate serve`, `retrieval
serve`), either the section itself or a document with a top-level `governance:` key. These are
pydantic models because they sit at a boundary (a file a person writes): an unknown or bad
field is reported with the file and its path, e.g.
`gov.yaml: governance.clients.batch-jobs.rate: Input should be greater than 0`.

    governance:
      client_header: X-Client-Id      # optional; API keys are always read
      default:                        # every request no key or header names
        rate: 200
        burst: 400
        budgets:
          - {unit: requests, period: day, limit: 1000000}
      clients:
        batch-jobs:
          keys_sha256: [9f86d0...]    # or keys: [...] (plain, for tests and local runs)
          rate: 50
          burst: 100
          max_concurrency: 4
          budgets:
            - {unit: core_seconds, period: hour, limit: 600}
      models:
        flights:
          budgets:
            - {unit: requests, period: hour, limit: 100000}
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, model_validator

from scalelab.lab.core.errors import BadInputError
from scalelab.lab.core.strict import StrictFrozenModel
from scalelab.layers.web.governance.limits import Period, Unit

DEFAULT_CLIENT = "default"
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"


class Budget(StrictFrozenModel):
    """A cost budget: at most `limit` of `unit` per fixed UTC `period`."""

    unit: Unit
    """requests (counted at admission), tokens (prompt + completion, as the generative server
    reports them) or core_seconds (the process's measured CPU, shared among the requests that
    finished in each tick)."""
    period: Period
    """minute, hour or day; windows start at UTC boundaries (the day at 00:00 UTC)."""
    limit: float = Field(gt=0)


class Limits(StrictFrozenModel):
    """What one client class may do. Every limit is optional; none given = not limited."""

    rate: float | None = Field(default=None, gt=0, le=1e9)
    """Sustained requests per second (a token bucket refilling at this rate)."""
    burst: int | None = Field(default=None, ge=1, le=1_000_000_000)
    """Requests that may arrive at once after a quiet spell (the bucket's size); default: the
    rate rounded up, at least 1."""
    max_concurrency: int | None = Field(default=None, ge=1, le=1_000_000)
    """Requests of this client in flight at once; the next one is refused (429)."""
    budgets: list[Budget] = Field(default_factory=list)

    @model_validator(mode="after")
    def _burst(self) -> Limits:
        if self.burst is not None and self.rate is None:
            raise ValueError("burst needs a rate (requests per second)")
        return self

    @property
    def bucket_size(self) -> float:
        if self.rate is None:
            return 0.0
        return float(self.burst if self.burst is not None else max(1, math.ceil(self.rate)))


class Client(Limits):
    """A named client: the API keys that identify it, and its limits."""

    keys: list[str] = Field(default_factory=list)
    """API keys in plain text (sent as `Authorization: Bearer KEY` or `X-API-Key: KEY`)."""
    keys_sha256: list[str] = Field(default_factory=list)
    """The same, as SHA-256 hex digests, so the file need not hold the secrets."""

    @model_validator(mode="after")
    def _keys(self) -> Client:
        for k in self.keys:
            if len(k) < 8:
                raise ValueError("keys: each key must be at least 8 characters")
        for d in self.keys_sha256:
            if len(d) != 64 or any(c not in "0123456789abcdef" for c in d.lower()):
                raise ValueError(f"keys_sha256: {d[:12]!r}... is not 64 hex digits")
        return self

    def digests(self) -> list[str]:
        return [hashlib.sha256(k.encode()).hexdigest() for k in self.keys] + \
            [d.lower() for d in self.keys_sha256]


class ModelBudgets(StrictFrozenModel):
    """Budgets one model's traffic shares, whichever client sends it."""

    budgets: list[Budget] = Field(min_length=1)


class GovernanceConfig(StrictFrozenModel):
    """The whole `governance:` section."""

    client_header: str | None = Field(default=None, pattern=r"^[A-Za-z0-9-]{1,64}$")
    """A header whose value names the client (e.g. X-Client-Id), for clients without keys.
    Anyone can send a header: use it only behind a gateway that sets it."""
    default: Limits = Field(default_factory=Limits)
    """The class every request falls into when no key or header names a client."""
    clients: dict[str, Client] = Field(default_factory=dict)
    models: dict[str, ModelBudgets] = Field(default_factory=dict)
    client_stop_status: Literal[403, 429] = 403
    """What a stopped client's requests get: 403 (it is told to stop, not to retry; default)
    or 429 (clients that back off on 429 and would alert on 403)."""
    cpu_tick_s: float = Field(default=1.0, gt=0, le=3600)
    """How often the process's CPU time is read and shared among finished requests (only
    when a core_seconds budget exists)."""

    @model_validator(mode="after")
    def _names(self) -> GovernanceConfig:
        import re

        for name in [*self.clients, *self.models]:
            if not re.match(NAME_PATTERN, name):
                raise ValueError(f"name {name!r}: use 1-64 letters, digits, '.', '_' or '-'")
        if DEFAULT_CLIENT in self.clients:
            raise ValueError(f"clients: {DEFAULT_CLIENT!r} is reserved; set its limits under "
                             "'default'")
        seen: dict[str, str] = {}
        for name, c in self.clients.items():
            for d in c.digests():
                if d in seen:
                    raise ValueError(f"clients {seen[d]!r} and {name!r} share an API key")
                seen[d] = name
        return self

    def budgets_configured(self) -> bool:
        return bool(self.default.budgets or self.models
                    or any(c.budgets for c in self.clients.values()))


def parse_governance(raw: Any, where: str) -> GovernanceConfig:
    """Validate a parsed document; errors name `where` (the file) and the field's path."""
    if isinstance(raw, dict) and set(raw) == {"governance"}:
        raw = raw["governance"]
    if raw is None:
        raw = {}
    try:
        return GovernanceConfig.model_validate(raw)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        field = f"governance.{loc}" if loc else "governance"
        raise BadInputError(f"{where}: {field}: {err['msg']}; fix the field "
                            "(see docs/governance.md)") from None


def load_governance(path: Path | str) -> GovernanceConfig:
    """Read and validate a governance file (YAML or JSON)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise BadInputError(f"--governance {p}: cannot read it ({e.strerror}); give an "
                            "existing YAML or JSON file") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise BadInputError(f"{p}: not valid YAML or JSON ({str(e).splitlines()[0]}); fix "
                            "the syntax") from None
    return parse_governance(raw, str(p))
