"""The pydantic base of every file format and wire body that must be exactly what it says."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class StrictFrozenModel(BaseModel):
    """Unknown keys are errors (a misspelt field is never silently ignored) and a validated
    value cannot change afterwards (it is shared across requests and threads)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
