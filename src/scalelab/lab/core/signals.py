"""The typed signals of a record: what the measured system's resources did during one level
(`Resources`), what the server behind an endpoint showed of itself (`ServerSignals`), the
energy the work took (`Energy`) and the latency histograms a level's quantiles are read from
(`Record.histograms`, encoded HdrHistograms by metric).

The sheet and the limit inference read these by name; a typo is a type error, not a silent
"not measured". Records written before these fields existed kept the same numbers in `extras`
under older names (`LEGACY_EXTRAS`): `lift_legacy` moves them into the fields on read, so old
files and user objectives on `extras:<key>` keep meaning what they meant.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from scalelab.lab.core.strict import StrictFrozenModel


class Resources(StrictFrozenModel):
    """Resource signals of the measured work over one level; None = not measured."""

    cpu_busy_cores: float | None = Field(default=None, ge=0)
    """CPU seconds per wall second of the measured process tree (the stage's own, or the
    server's it loads): 2.0 = two cores busy the whole level."""
    iowait_share: float | None = Field(default=None, ge=0, le=1)
    """Share of the machine's CPU time spent waiting on I/O during the level."""
    comm_share: float | None = Field(default=None, ge=0, le=1)
    """Share of a training step spent in communication (gradient all-reduce)."""
    spilled_bytes: int | None = Field(default=None, ge=0)
    """Bytes a data engine spilled to disk because its memory ran short."""
    server_peak_rss_bytes: int | None = Field(default=None, ge=0)
    """Peak resident memory of the loaded server's process tree (not the generator's)."""


SignalSource = Literal["process", "metrics", "engine", "prometheus", "client"]
"""Where a server signal came from: the server's process tree read with psutil (by pid or by the
port it listens on), its /metrics page (the standard process_* metrics), an engine's own
metrics (vLLM, SGLang, TGI, llama.cpp, Triton, Ray Serve), a Prometheus server's HTTP API, or
the client's own records (an inference, said as one)."""


class ServerSignals(StrictFrozenModel):
    """What the server behind an endpoint showed during one level, each number with its
    source in `sources` (signal name → e.g. 'process pid 4242 (port 8000)',
    'http://127.0.0.1:8000/metrics', 'vllm http://…/metrics', 'prometheus http://…')."""

    engine: str | None = None
    """The engine whose metric names were recognised ('vllm', 'sglang', 'tgi', 'llamacpp',
    'triton', 'ray-serve'); None when only process metrics were seen."""
    sources: dict[str, str] = Field(default_factory=dict)
    kinds: dict[str, SignalSource] = Field(default_factory=dict)
    """Signal name → the kind of its source."""
    cores: int | None = Field(default=None, ge=1)
    """Cores of the server's machine, when known (a local process: this machine's)."""
    busy_cores: float | None = Field(default=None, ge=0)
    """CPU seconds per wall second of the server over the level."""
    threads: int | None = Field(default=None, ge=0)
    """Threads of the server's process tree (most seen)."""
    cpu_wait_cores: float | None = Field(default=None, ge=0)
    """Seconds per second the server's threads were runnable but waiting for a CPU (Linux
    schedstat): busy + this is the CPU the server wanted, on a machine shared with others."""
    busiest_thread_cores: float | None = Field(default=None, ge=0)
    """Busy cores of the server's busiest thread: near 1.0 with the process near 1.0 means one
    thread does the work."""
    busiest_thread_wait_cores: float | None = Field(default=None, ge=0)
    """That thread's run-queue wait per second: with its busy cores, near 1.0 means it wanted a
    whole core (one thread saturated, even where other work took part of the core)."""
    rss_bytes: int | None = Field(default=None, ge=0)
    """Peak resident memory of the server."""
    running: float | None = Field(default=None, ge=0)
    """Most requests the engine ran at once (peak of its gauge)."""
    waiting: float | None = Field(default=None, ge=0)
    """Most requests waiting in the engine's queue (peak)."""
    slots: int | None = Field(default=None, ge=0)
    """Generation slots (or max concurrent sequences) the engine says it has."""
    kv_cache_use: float | None = Field(default=None, ge=0)
    """Peak share of the KV cache in use (0–1)."""
    preemptions: float | None = Field(default=None, ge=0)
    """Sequences preempted over the level (KV blocks ran out)."""
    queue_ms: float | None = Field(default=None, ge=0)
    """Mean time a request waited in the server's queue (e.g. Triton's queue duration)."""
    compute_ms: float | None = Field(default=None, ge=0)
    """Mean time a request spent computing (e.g. Triton's compute durations)."""
    gpu_util: float | None = Field(default=None, ge=0)
    """Peak GPU utilisation, summed over the server's GPUs (1.0 = one GPU fully busy)."""
    cpu_util: float | None = Field(default=None, ge=0)
    """Peak share of the server machine's CPU in use (0–1), as the server reports it."""
    gpu_memory_bytes: int | None = Field(default=None, ge=0)
    """Peak GPU memory used."""
    refused: int | None = Field(default=None, ge=0)
    """Requests the server refused at admission (HTTP 503 or 429) over the level."""
    refused_by_status: dict[str, int] = Field(default_factory=dict)
    """Those refusals by status code."""
    requests: int | None = Field(default=None, ge=0)
    """Requests the level sent (what the refusals are a share of)."""
    cut_streams: int | None = Field(default=None, ge=0)
    """Streams the client saw end before their end ("dropped") or with no token ("empty"): a
    server that serves one request at a time and interrupts it for the next shows these."""
    refused_rps: float | None = Field(default=None, ge=0)
    """Refusals per second over the level's measured time."""
    retry_after: bool | None = None
    """Whether those refusals carried Retry-After (None: no refusals seen)."""
    retry_after_count: int | None = Field(default=None, ge=0)
    """Answers that carried Retry-After (all of the refusals, or some)."""
    retry_after_s: float | None = Field(default=None, ge=0)
    """The longest Retry-After the server asked for (seconds)."""

    def measured(self) -> bool:
        return bool(self.sources)


class Energy(StrictFrozenModel):
    """A record's energy: in total and per unit of its cost (`lab.core.energy` fills it)."""

    joules: float = Field(ge=0)
    """Joules the record's work took (measured over its step, or the model's estimate)."""
    per_unit_j: float | None = Field(default=None, ge=0)
    """Joules per `unit`; None where the record's cost has no units to share them over."""
    unit: str | None = None
    """The unit of the record's cost (e.g. "1k requests")."""
    basis: str = ""
    """"measured (RAPL)" or "estimated (model: N W/core)"."""


LATENCY_HISTOGRAM = "latency"
"""`Record.histograms` key of `scalelab load`'s one histogram (ms of every answered request);
`load llm` writes one per metric (ttft, itl, tpot, e2e)."""


LEGACY_EXTRAS: dict[str, str] = {
    "cpu_busy_cores": "cpu_busy_cores",
    "iowait_share": "iowait_share",
    "comm_share": "comm_share",
    "spilled_disk_bytes": "spilled_bytes",
    "server_peak_rss_bytes": "server_peak_rss_bytes",
}
"""Extras key of records written before `Resources` → its field."""

ENERGY_EXTRAS: dict[str, str] = {
    "energy_j": "joules",
    "energy_per_unit_j": "per_unit_j",
    "energy_unit": "unit",
    "energy_basis": "basis",
}
"""Extras key of records written before `Energy` → its field."""

HISTOGRAM_EXTRAS = ("hdr_histogram", "hdr_histograms")
"""Extras keys of records written before `Record.histograms`: `load`'s one histogram (now
`histograms["latency"]`) and `load llm`'s dict by metric."""


def _number(v: Any) -> float | int | None:
    return v if isinstance(v, int | float) and not isinstance(v, bool) else None


def _lift_energy(out: dict[str, Any], extras: dict[str, Any]) -> None:
    old = {new: extras.pop(key) for key, new in ENERGY_EXTRAS.items() if key in extras}
    if out.get("energy") is not None or _number(old.get("joules")) is None:
        return
    per_unit = _number(old.get("per_unit_j"))
    out["energy"] = {"joules": float(old["joules"]),
                     "per_unit_j": None if per_unit is None else float(per_unit),
                     "unit": None if old.get("unit") is None else str(old["unit"]),
                     "basis": str(old.get("basis") or "")}


def _lift_histograms(out: dict[str, Any], extras: dict[str, Any]) -> None:
    one, many = extras.pop("hdr_histogram", None), extras.pop("hdr_histograms", None)
    hists: dict[str, Any] = dict(out.get("histograms") or {})
    if isinstance(many, dict):
        for k, v in many.items():
            if isinstance(v, str):
                hists.setdefault(str(k), v)
    if isinstance(one, str):
        hists.setdefault(LATENCY_HISTOGRAM, one)
    out["histograms"] = hists


def _lift_resources(out: dict[str, Any], extras: dict[str, Any]) -> None:
    res = out.get("resources")
    fields: dict[str, Any] = (
        res.model_dump() if isinstance(res, Resources) else dict(res or {})
    )
    for old, new in LEGACY_EXTRAS.items():
        if old in extras:
            v = _number(extras.pop(old))
            if fields.get(new) is None and v is not None:
                fields[new] = int(v) if new.endswith("bytes") else float(v)
    out["resources"] = fields


def lift_legacy(data: Any) -> Any:
    """Raw record data with the old extras keys moved into `series`, `resources`, `energy` and
    `histograms` (a field already set wins; the key leaves extras either way, so nothing is
    read twice)."""
    if not isinstance(data, dict) or not isinstance(data.get("extras"), dict):
        return data
    extras: dict[str, Any] = dict(data["extras"])
    if not any(k in extras for k in (*LEGACY_EXTRAS, *ENERGY_EXTRAS, *HISTOGRAM_EXTRAS,
                                     "series")):
        return data
    out = dict(data)
    if "series" in extras:
        s = extras.pop("series")
        if not out.get("series") and s is not None:
            out["series"] = str(s)
    if any(k in extras for k in LEGACY_EXTRAS):
        _lift_resources(out, extras)
    if any(k in extras for k in ENERGY_EXTRAS):
        _lift_energy(out, extras)
    if any(k in extras for k in HISTOGRAM_EXTRAS):
        _lift_histograms(out, extras)
    out["extras"] = extras
    return out
