"""The measurement record every part writes and every reader accepts (JSON Lines, append-only).

One record per (experiment, stage, variable, level, repeat). The fields are the diagnostic
sheet's: input volume, processing rate, limiting resource, latency percentiles, memory, failure
rate, quality, cost and recovery mechanism; the signals the limit is inferred from are typed
(`series`, `resources`, `server`: see core/signals.py); what a stage adds of its own goes into
`extras`.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from scalelab.lab.core.errors import BadInputError
from scalelab.lab.core.jsonfile import read_jsonl_objects
from scalelab.lab.core.machine import Machine, current_machine
from scalelab.lab.core.signals import Energy, Resources, ServerSignals, lift_legacy
from scalelab.lab.core.strict import StrictFrozenModel

SCHEMA_VERSION = 1


class MachineInfo(StrictFrozenModel):
    cores: int = Field(ge=1)
    memory_bytes: int = Field(ge=0)
    device: str
    hostname: str = ""

    @classmethod
    def of(cls, m: Machine) -> MachineInfo:
        return cls(cores=m.cores, memory_bytes=m.memory_bytes, device=m.device, hostname=m.hostname)


class Latency(StrictFrozenModel):
    """Latency percentiles in milliseconds; histograms, not means, produce them."""

    p50_ms: float | None = Field(default=None, ge=0)
    p90_ms: float | None = Field(default=None, ge=0)
    p95_ms: float | None = Field(default=None, ge=0)
    p99_ms: float | None = Field(default=None, ge=0)
    p999_ms: float | None = Field(default=None, ge=0)
    max_ms: float | None = Field(default=None, ge=0)


class Cost(StrictFrozenModel):
    usd: float = Field(ge=0)
    """Total cost of the measured work at the configured prices."""
    per_unit_usd: float | None = Field(default=None, ge=0)
    """Cost of one `unit` of work (e.g. per 1,000 predictions, per million rows)."""
    unit: str | None = None


class Record(StrictFrozenModel):
    """One measurement: a stage at one level of the scaled variable, one repeat."""

    schema_version: Literal[1] = 1
    experiment: str = Field(min_length=1)
    stage: str = Field(min_length=1, pattern=r"^[a-z][a-z0-9_.-]*$")
    variable: str = Field(min_length=1)
    level: float
    repeat: int = Field(default=0, ge=0)
    timestamp: datetime
    machine: MachineInfo
    input_volume: float | None = Field(default=None, ge=0)
    input_unit: str | None = None
    rate: float | None = Field(default=None, ge=0)
    """Processing rate in `rate_unit` (rows/s, samples/s, requests/s, ...)."""
    rate_unit: str | None = None
    wall_s: float | None = Field(default=None, ge=0)
    latency: Latency | None = None
    peak_memory_bytes: int | None = Field(default=None, ge=0)
    failures: int = Field(default=0, ge=0)
    failure_rate: float | None = Field(default=None, ge=0, le=1)
    quality: dict[str, float] = Field(default_factory=dict)
    cost: Cost | None = None
    recovery: str | None = None
    """How this stage recovers from a failure (checkpoint, retry, replica, quarantine, ...)."""
    limiting_resource: str | None = None
    ok: bool = True
    error: str | None = None
    series: str = ""
    """Separates curves of one stage and variable measured under different settings (batching
    off / on, a model variant); "" for the stage's one curve."""
    resources: Resources = Field(default_factory=Resources)
    """What the measured work's resources did (busy cores, I/O wait, communication, spill)."""
    server: ServerSignals | None = None
    """What the server behind an endpoint showed of itself; None = not read."""
    energy: Energy | None = None
    """The energy the record's work took; None = not measured nor estimated."""
    histograms: dict[str, str] = Field(default_factory=dict)
    """Encoded HdrHistograms (base64) by metric: `load`'s "latency", `load llm`'s ttft, itl,
    tpot and e2e. Chunks and processes merge by adding them; every quantile is read from one."""
    slices: dict[str, list[str]] = Field(default_factory=dict)
    """The same latencies in consecutive slices of the run, one encoded HdrHistogram each, by
    metric (`lab/load/slices.py`): how much a quantile moves within one run; {} = not kept."""
    extras: dict[str, Any] = Field(default_factory=dict)
    base_level: float | None = None
    """The level that is 1× of its stage's curve (its lowest configured level), where the
    writer knows it; None: the lowest level measured is (a target measured first, its curve
    cut for time, is still read as 10×, not as 1×)."""
    purpose: Literal["decision", "curve"] = "decision"
    """What the record is for: "decision", a level measured to decide its objectives (a stage's
    target, or a level of the bisection for its first miss); "curve", a point measured briefly
    to draw the curve between them, whose undecided checks are not a verdict's gap."""

    @model_validator(mode="before")
    @classmethod
    def _lift(cls, data: Any) -> Any:
        # Records written before the typed signals kept them in extras: same numbers, moved.
        return lift_legacy(data)

    @field_validator("timestamp")
    @classmethod
    def _aware(cls, v: datetime) -> datetime:
        return v if v.tzinfo is not None else v.replace(tzinfo=UTC)


def new_experiment_id(prefix: str) -> str:
    """A sortable, unique id: PREFIX-YYYYmmddTHHMMSS-xxxxxx."""
    return f"{prefix}-{datetime.now(UTC):%Y%m%dT%H%M%S}-{secrets.token_hex(3)}"


def make_record(
    *,
    experiment: str,
    stage: str,
    variable: str,
    level: float,
    repeat: int = 0,
    machine: Machine | None = None,
    **fields: Any,
) -> Record:
    """Build a record stamped with now and this machine; raises BadInputError on bad fields."""
    m = machine or current_machine()
    try:
        return Record(
            experiment=experiment,
            stage=stage,
            variable=variable,
            level=level,
            repeat=repeat,
            timestamp=datetime.now(UTC),
            machine=MachineInfo.of(m),
            **fields,
        )
    except ValidationError as e:
        raise BadInputError(f"invalid record for stage {stage!r}: {_first_error(e)}") from e


def append_records(path: str | os.PathLike[str], records: Iterable[Record]) -> int:
    """Append records as JSON Lines and fsync; never rewrites what is there. Returns the count."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    lines = [r.model_dump_json() + "\n" for r in records]
    with p.open("a", encoding="utf-8") as f:
        f.writelines(lines)
        f.flush()
        os.fsync(f.fileno())
    return len(lines)


def _first_error(e: ValidationError) -> str:
    err = e.errors()[0]
    where = ".".join(str(x) for x in err["loc"]) or "record"
    return f"field {where!r}: {err['msg']}"


def iter_records(path: str | os.PathLike[str]) -> Iterator[Record]:
    """Read and validate a records file; the first bad line raises BadInputError naming it."""
    p = Path(path)
    if not p.is_file():
        raise BadInputError(
            f"records file {p} does not exist; pass a .jsonl file written by scalelab"
        )
    for lineno, obj in read_jsonl_objects(p, fix="each line must be one JSON record"):
        try:
            yield Record.model_validate(obj)
        except ValidationError as e:
            raise BadInputError(
                f"{p}:{lineno}: {_first_error(e)}; fix or remove that line"
            ) from e


def read_records(path: str | os.PathLike[str]) -> list[Record]:
    return list(iter_records(path))
