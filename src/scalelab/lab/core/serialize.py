"""JSON-safe conversion of results (dataclasses, pydantic models, numpy, paths, datetimes)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

JSON_SCHEMA_VERSION = 1
"""The version of every command's --json document (and report.json, --output FILE.json):
bumped when a field changes meaning or goes away, not when one is added."""


def with_schema(data: Any) -> Any:
    """A JSON object with "schema_version" first; as is when it has one, or is a file in a
    format of its own ("format": "scalelab.schema/1", "scalelab.stats/1": versioned by it, and
    read back with no other key allowed); anything else as is."""
    if not isinstance(data, dict) or "schema_version" in data:
        return data
    own = data.get("format")
    if isinstance(own, str) and own.startswith("scalelab.") and "/" in own:
        return data
    return {"schema_version": JSON_SCHEMA_VERSION, **data}


def jsonable(x: Any) -> Any:
    """Convert results to JSON-safe values: NaN and ±inf become null (JSON has no such numbers)."""
    if x is None or isinstance(x, bool | str | int):
        return x
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return {f.name: jsonable(getattr(x, f.name)) for f in dataclasses.fields(x)}
    if hasattr(x, "model_dump"):  # pydantic
        return jsonable(x.model_dump(mode="json"))
    if isinstance(x, Mapping):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, enum.Enum):
        return jsonable(x.value)
    if isinstance(x, dt.datetime | dt.date):
        return x.isoformat()
    if isinstance(x, Path):
        return str(x)
    if hasattr(x, "tolist"):  # numpy arrays and scalars
        return jsonable(x.tolist())
    if isinstance(x, Sequence | set | frozenset):
        return [jsonable(v) for v in x]
    return str(x)
