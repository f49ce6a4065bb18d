"""The diagnostic sheet: one row per (stage, series, level), aggregated over repeats.

A row holds the sheet's fields — input volume, processing rate, limiting resource, latency
p50/p95/p99, peak memory, failure rate, output quality, cost per unit, recovery — as medians over
repeats with the range of the rate. A *series* separates curves measured on the same stage and
variable under different settings (e.g. serving with batching off and on): the record's
`series`. The limiting cell reads the records' typed signals (`resources`, `server`) by name.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from scalelab.lab.core.records import Record
from scalelab.lab.core.server_limits import server_cell
from scalelab.lab.core.signals import Resources, ServerSignals
from scalelab.lab.core.units import format_number

STAGE_ORDER = {"data": 0, "train": 1, "serve": 2, "model": 3}
"""The four stages in the order work flows through them; other stages follow by name."""

CPU_BUSY = 0.85
"""Busy cores at or above this share of the machine's cores: the CPU is the limit."""
MEMORY_HIGH = 0.8
"""Peak memory at or above this share of RAM: memory is the limit."""
COMM_HIGH = 0.3
"""Communication (all-reduce) share of step time at or above which it limits."""
IOWAIT_HIGH = 0.2
"""Share of CPU time in I/O wait at or above which I/O limits."""


def _num(extras: dict[str, Any], key: str) -> float | None:
    v = extras.get(key)
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


STAGE_LIMIT_KEY = "limit_evidence"
"""Record extra, optional: a limit the stage itself measured, named with its numbers (e.g. the
engine's 'batch-slots: up to 4 sequences running, up to 4 waiting for a slot (engine
/metrics)'). Core knows no part's signals: the stage that sampled them writes this line, and
the sheet's limiting cell leads with it."""


def measured_limit(
    extras: dict[str, Any],
    peak_memory_bytes: int | None,
    *,
    cores: int,
    memory_bytes: int,
    resources: Resources | None = None,
) -> str:
    """The sheet's limiting-resource cell, from measured signals only (never a stage's label):
    the limit the stage measured (`STAGE_LIMIT_KEY`), then the saturated machine resource with
    its number; what was measured when nothing saturates; or 'not measured'."""
    own = extras.get(STAGE_LIMIT_KEY)
    machine = _machine_limit(
        resources or Resources(), peak_memory_bytes, cores=cores, memory_bytes=memory_bytes
    )
    if isinstance(own, str) and own:
        saturated = not machine.startswith(("none saturated", "not measured"))
        return f"{own}; {machine}" if saturated else own
    return machine


def _machine_limit(
    res: Resources, peak_memory_bytes: int | None, *, cores: int, memory_bytes: int
) -> str:
    busy, comm, spill, iow = res.cpu_busy_cores, res.comm_share, res.spilled_bytes, res.iowait_share
    mem = peak_memory_bytes / memory_bytes if peak_memory_bytes and memory_bytes else None
    if mem is not None and mem >= MEMORY_HIGH:
        return f"memory: peak {mem:.0%} of RAM"
    if comm is not None and comm >= COMM_HIGH:
        return f"communication: {comm:.0%} of step time"
    if busy is not None and busy >= CPU_BUSY * cores:
        return f"cpu: {busy:.2f}/{cores} cores busy"
    if spill:
        return f"disk spill: {spill / 2**20:.0f} MiB"
    if iow is not None and iow >= IOWAIT_HIGH:
        return f"i/o wait: {iow:.0%} of CPU time"
    seen = [
        *([f"cpu {busy:.2f}/{cores} cores"] if busy is not None else []),
        *([f"memory {mem:.0%} of RAM"] if mem is not None else []),
        *([f"i/o wait {iow:.0%}"] if iow is not None else []),
    ]
    return "none saturated (" + ", ".join(seen) + ")" if seen else "not measured"


def median_resources(recs: list[Record]) -> Resources:
    """Each resource signal's median over the records that measured it."""
    out: dict[str, float | int] = {}
    for name in Resources.model_fields:
        v = _median(getattr(r.resources, name) for r in recs)
        if v is not None:
            out[name] = int(v) if name.endswith("bytes") else v
    return Resources(**out)  # type: ignore[arg-type]


@dataclass(frozen=True, kw_only=True)
class SheetRow:
    stage: str
    series: str
    variable: str
    level: float
    multiple: float
    """level / the smallest level of this stage and series: the multiple of load (or resource)."""
    repeats: int
    failures: int
    input_volume: float | None
    input_unit: str | None
    rate: float | None
    rate_min: float | None
    rate_max: float | None
    rate_unit: str | None
    wall_s: float | None
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None
    peak_memory_bytes: int | None
    failure_rate: float | None
    quality: dict[str, float]
    cost_per_unit_usd: float | None
    cost_unit: str | None
    recovery: str | None
    limiting_resource: str | None
    """From measured signals only (`measured_limit`), never a stage's own label."""
    extras: dict[str, Any] = field(default_factory=dict)
    """Medians of the numeric extras across repeats (what stages add of their own)."""
    resources: Resources = field(default_factory=Resources)
    """Medians of the records' resource signals across repeats."""
    server: ServerSignals | None = None
    """The server's own signals at this level (the repeat that read most of them)."""
    governance: str | None = None
    """What the stage's server enforced (rate limits, budgets, kill switches engaged), from the
    records' `governance` extra; None = the stage does not serve."""
    energy_j: float | None = None
    """Joules of the level's work (median over repeats), from the records' `energy`."""
    energy_per_unit_j: float | None = None
    """Joules per `cost_unit` (median over repeats), from the records' `energy`."""
    energy_basis: str | None = None
    """How that energy was obtained: "measured (RAPL)" or "estimated (model: N W/core)"."""
    decided_by: str | None = None
    """How the level was decided when not by its own load: e.g. the capacity search's steps
    at or above its rate (the records' `decided_by` extra, with the assumption it rests on)."""
    purpose: str = "decision"
    """"curve" when every record of the level was measured for the picture only (a curve point,
    `Record.purpose`); "decision" when any was measured to decide the level's checks."""
    latency_samples: int | None = None
    """Latencies each quantile rests on: the fewest successful requests of any repeat (the
    quantiles are medians over repeats); None when a record did not say its sample count."""
    failure_trials: int | None = None
    """Trials the failure rate rests on, summed over repeats: the records' sample counts, or the
    repeats themselves when no record measured a failure rate; None when not recorded."""
    failure_events: int | None = None
    """Failed trials among `failure_trials`."""
    quantiles_ms: dict[float, float] = field(default_factory=dict)
    """Every recorded latency quantile (0.5, 0.9, 0.95, 0.99, 0.999, 1.0 = max; medians over
    repeats): what the order-statistic rule brackets its bounds with."""


def _median(values: Iterable[float | None]) -> float | None:
    v = [float(x) for x in values if x is not None]
    return statistics.median(v) if v else None


def _mode(values: Iterable[str | None]) -> str | None:
    v = [x for x in values if x]
    return max(set(v), key=v.count) if v else None


SAMPLES_KEY = "samples"
"""Record extra: how many trials (requests, queries, events) the record's failure rate and
latency quantiles rest on; `failure_rate × samples` of them failed. Optional: a record without
it reads as "sample size not recorded", which leaves statistical objectives undecided."""

LATENCY_SAMPLES_KEY = "latency_samples"
"""Record extra, optional: the latencies the quantiles rest on when they are not the
successful trials (default: samples − failures)."""
SAMPLES_UNIT_KEY = "samples_unit"
"""Record extra, optional: what the samples count ("requests", "queries", "rows", "events")."""

_QUANTILE_FIELDS = {0.5: "p50_ms", 0.9: "p90_ms", 0.95: "p95_ms", 0.99: "p99_ms",
                    0.999: "p999_ms", 1.0: "max_ms"}


def sample_count(r: Record) -> int | None:
    v = r.extras.get(SAMPLES_KEY)
    return int(v) if isinstance(v, int | float) and not isinstance(v, bool) and v >= 0 else None


def _counts(recs: list[Record], use: list[Record]) -> tuple[int | None, int | None, int | None]:
    """(latency samples, failure trials, failure events) of one level's records. A record
    whose latencies count something else than its trials (e.g. model updates beside events)
    says so in extras["latency_samples"]."""
    ns = [sample_count(r) for r in recs]
    if all(n is not None for n in ns):
        trials = [int(n) for n in ns if n is not None]
        failed = [round((r.failure_rate or 0.0) * n) for r, n in zip(recs, trials, strict=True)]
        lat = [
            int(own) if isinstance(own := r.extras.get(LATENCY_SAMPLES_KEY), int) else n - f
            for r, n, f in zip(recs, trials, failed, strict=True)
            if r in use
        ]
        return (min(lat) if lat else None), sum(trials), sum(failed)
    if not any(r.failure_rate is not None for r in recs):
        # The sheet's failure rate is then the share of failed repeats: n = the repeats.
        return None, len(recs), sum(1 for r in recs if not r.ok)
    return None, None, None


def series_of(r: Record) -> str:
    return r.series


def _numeric_extras(recs: list[Record]) -> dict[str, Any]:
    keys = {
        k
        for r in recs
        for k, v in r.extras.items()
        if isinstance(v, int | float) and not isinstance(v, bool)
    }
    out: dict[str, Any] = {k: _median(r.extras.get(k) for r in recs) for k in sorted(keys)}
    for k in sorted({k for r in recs for k, v in r.extras.items() if isinstance(v, str | bool)}):
        out[k] = recs[0].extras.get(k)
    # The stage's own limit line: the one most repeats said (not whichever repeat came first).
    said = _mode(str(v) for r in recs if isinstance(v := r.extras.get(STAGE_LIMIT_KEY), str))
    if said is not None:
        out[STAGE_LIMIT_KEY] = said
    return out


def decided_by_text(said: object) -> str | None:
    """A record's `decided_by` extra as one clause: the search whose steps decided the level
    (their rates against the target's) and the assumption it rests on; None when absent."""
    if not isinstance(said, dict):
        return None
    steps = [float(s) for s in said.get("steps", []) if isinstance(s, int | float)]
    rates = ", ".join(format_number(s) for s in steps) or "?"
    target = said.get("target_rate")
    at = f" (target {format_number(float(target))}/s)" if isinstance(target, int | float) else ""
    why = f"; assumes {said['assumption']}" if said.get("assumption") else ""
    return f"decided by {said.get('search', 'a capacity search')}'s steps at {rates}/s{at}{why}"


def build_sheet(records: Iterable[Record]) -> list[SheetRow]:
    """Aggregate records into sheet rows, ordered by stage, series and level."""
    groups: dict[tuple[str, str, str, float], list[Record]] = defaultdict(list)
    for r in records:
        groups[(r.stage, series_of(r), r.variable, r.level)].append(r)
    base: dict[tuple[str, str, str], float] = {}
    for stage, series, variable, level in groups:
        key = (stage, series, variable)
        said = [r.base_level for r in groups[(stage, series, variable, level)]
                if r.base_level is not None and r.base_level > 0]
        base[key] = min(base.get(key, level), level, *said)
    rows: list[SheetRow] = []

    def order(
        item: tuple[tuple[str, str, str, float], list[Record]],
    ) -> tuple[int, str, str, float]:
        stage, series, _, level = item[0]
        return (STAGE_ORDER.get(stage, len(STAGE_ORDER)), stage, series, level)

    for (stage, series, variable, level), recs in sorted(groups.items(), key=order):
        ok = [r for r in recs if r.ok]
        use = ok or recs
        # A record that is not ok but still measured a rate (e.g. a load level flagged for
        # generator lag) keeps its numbers; a level with no ok record shows what was measured.
        rates = [r.rate for r in use if r.rate is not None]
        lat = [r.latency for r in use if r.latency is not None]
        qkeys = sorted({k for r in ok for k in r.quality})
        mem = [r.peak_memory_bytes for r in use if r.peak_memory_bytes is not None]
        fr = [r.failure_rate for r in recs if r.failure_rate is not None]
        extras = _numeric_extras(use)
        res = median_resources(use)
        lat_n, trials, events = _counts(recs, use)
        b = base[(stage, series, variable)]
        server = _server(use)
        rows.append(
            SheetRow(
                stage=stage,
                series=series,
                variable=variable,
                level=level,
                multiple=level / b if b else 1.0,
                repeats=len(recs),
                failures=sum(1 for r in recs if not r.ok),
                input_volume=_median(r.input_volume for r in use),
                input_unit=_mode(r.input_unit for r in use),
                rate=_median(rates),
                rate_min=min(rates) if rates else None,
                rate_max=max(rates) if rates else None,
                rate_unit=_mode(r.rate_unit for r in use),
                wall_s=_median(r.wall_s for r in use),
                p50_ms=_median(x.p50_ms for x in lat),
                p95_ms=_median(x.p95_ms for x in lat),
                p99_ms=_median(x.p99_ms for x in lat),
                peak_memory_bytes=int(max(mem)) if mem else None,
                failure_rate=statistics.fmean(fr)
                if fr
                else (sum(1 for r in recs if not r.ok) / len(recs)),
                quality={
                    k: v for k in qkeys if (v := _median(r.quality.get(k) for r in ok)) is not None
                },
                cost_per_unit_usd=_median(r.cost.per_unit_usd for r in use if r.cost is not None),
                cost_unit=_mode(r.cost.unit for r in use if r.cost is not None),
                recovery=_mode(r.recovery for r in use),
                limiting_resource=server_cell(
                    server,
                    measured_limit(
                        extras,
                        int(max(mem)) if mem else None,
                        cores=use[0].machine.cores,
                        memory_bytes=use[0].machine.memory_bytes,
                        resources=res,
                    ),
                    trials=next((sample_count(r) for r in use if r.server is server), None),
                    stage_said=bool(extras.get(STAGE_LIMIT_KEY)),
                ),
                extras=extras,
                resources=res,
                server=server,
                governance=_mode(str(r.extras["governance"]) for r in use
                                 if r.extras.get("governance")),
                energy_j=_median(r.energy.joules if r.energy else None for r in use),
                energy_per_unit_j=_median(r.energy.per_unit_j if r.energy else None
                                          for r in use),
                energy_basis=_mode(r.energy.basis if r.energy else None for r in use),
                decided_by=_mode(decided_by_text(r.extras.get("decided_by")) for r in use),
                purpose="curve" if all(r.purpose == "curve" for r in recs) else "decision",
                latency_samples=lat_n,
                failure_trials=trials,
                failure_events=events,
                quantiles_ms={
                    q: v
                    for q, name in _QUANTILE_FIELDS.items()
                    if (v := _median(getattr(x, name) for x in lat)) is not None
                },
            )
        )
    return rows


def _server(recs: list[Record]) -> ServerSignals | None:
    seen = [r.server for r in recs if r.server is not None and r.server.measured()]
    return max(seen, key=lambda s: len(s.sources)) if seen else None


def stage_rows(sheet: list[SheetRow], stage: str, series: str | None = None) -> list[SheetRow]:
    return [r for r in sheet if r.stage == stage and (series is None or r.series == series)]
