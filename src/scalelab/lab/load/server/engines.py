"""What a server's /metrics says about one level, by the names each server documents.

Every prometheus_client (Python), Go and JVM service exports the standard process metrics:
`process_cpu_seconds_total` (its increase over the level's seconds is the busy cores) and
`process_resident_memory_bytes`. Model servers add their own: each table below takes its names
from that server's documentation (the `doc` of each `Engine`), so a user's vLLM, SGLang, TGI,
llama.cpp, Triton or Ray Serve endpoint reads the same way. Pure: scrapes in, numbers out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

PROCESS_CPU = "process_cpu_seconds_total"
PROCESS_RSS = "process_resident_memory_bytes"
PROCESS_DOC = "https://prometheus.io/docs/instrumenting/writing_clientlibs/#process-metrics"


@dataclass(frozen=True, kw_only=True)
class Engine:
    """One server's metric names, per `ServerSignals` field."""

    name: str
    doc: str
    """Where the names come from."""
    prefix: str
    """The start of the names that identify the server on a /metrics page."""
    peaks: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Field → gauges (the first present is read); the level's largest value."""
    deltas: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Field → counters; their increase over the level."""
    per_request_ms: Mapping[str, tuple[tuple[str, ...], str, float]] = field(default_factory=dict)
    """Field → (time counters summed, the request counter, to-milliseconds factor): the mean
    time per request over the level."""


ENGINES: tuple[Engine, ...] = (
    Engine(name="vllm", doc="https://docs.vllm.ai/en/latest/design/metrics.html",
           prefix="vllm:",
           peaks={"running": ("vllm:num_requests_running",),
                  "waiting": ("vllm:num_requests_waiting",),
                  # v1 name first; v0 called it gpu_cache_usage_perc
                  "kv_cache_use": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")},
           deltas={"preemptions": ("vllm:num_preemptions_total",)}),
    Engine(name="sglang", doc="https://docs.sglang.io/references/production_metrics.html",
           prefix="sglang:",
           peaks={"running": ("sglang:num_running_reqs",),
                  "waiting": ("sglang:num_queue_reqs",),
                  "kv_cache_use": ("sglang:token_usage",)}),
    Engine(name="tgi",
           doc="https://huggingface.co/docs/text-generation-inference/reference/metrics",
           prefix="tgi_",
           peaks={"running": ("tgi_batch_current_size",), "waiting": ("tgi_queue_size",)},
           per_request_ms={
               "queue_ms": (("tgi_request_queue_duration_sum",),
                            "tgi_request_queue_duration_count", 1000.0),
               "compute_ms": (("tgi_request_inference_duration_sum",),
                              "tgi_request_inference_duration_count", 1000.0)}),
    Engine(name="llamacpp",
           doc="https://github.com/ggml-org/llama.cpp/blob/master/tools/server/README.md"
               " (GET /metrics with --metrics, GET /slots)",
           prefix="llamacpp:",
           peaks={"running": ("llamacpp:requests_processing",),
                  "waiting": ("llamacpp:requests_deferred",),
                  "kv_cache_use": ("llamacpp:kv_cache_usage_ratio",)}),
    Engine(name="triton",
           doc="https://docs.nvidia.com/deeplearning/triton-inference-server/user-guide/docs/"
               "user_guide/metrics.html",
           prefix="nv_inference_",
           peaks={"waiting": ("nv_inference_pending_request_count",),
                  "gpu_util": ("nv_gpu_utilization",),
                  "gpu_memory_bytes": ("nv_gpu_memory_used_bytes",),
                  "cpu_util": ("nv_cpu_utilization",)},
           per_request_ms={
               "queue_ms": (("nv_inference_queue_duration_us_total",),
                            "nv_inference_request_success_total", 1e-3),
               "compute_ms": (("nv_inference_compute_input_duration_us_total",
                               "nv_inference_compute_infer_duration_us_total",
                               "nv_inference_compute_output_duration_us_total"),
                              "nv_inference_request_success_total", 1e-3)}),
    Engine(name="ray-serve", doc="https://docs.ray.io/en/latest/serve/monitoring.html",
           prefix="ray_serve_",
           peaks={"waiting": ("ray_serve_deployment_queued_queries",),
                  "running": ("ray_serve_replica_processing_queries",)}),
)
"""The servers whose names are known. Triton's counters are read with the `_total` suffix the
exposition parser gives every counter."""


Scrape = tuple[float, dict[str, float]]
"""(monotonic seconds, each sample's value summed over its labels)."""


def engine_of(names: set[str]) -> Engine | None:
    """The server whose names appear on the page (the first one in `ENGINES`)."""
    return next((e for e in ENGINES if any(n.startswith(e.prefix) for n in names)), None)


def _first(names: tuple[str, ...], sample: dict[str, float]) -> str | None:
    return next((n for n in names if n in sample), None)


def _increase(scrapes: list[Scrape], name: str) -> float | None:
    vals = [(t, s[name]) for t, s in scrapes if name in s]
    if len(vals) < 2:
        return None
    return max(0.0, vals[-1][1] - vals[0][1])


def process_reading(scrapes: list[Scrape]) -> dict[str, Any]:
    """busy_cores (CPU seconds' increase over the seconds between the first and last scrape
    that had it) and rss_bytes (peak) from the standard process metrics."""
    out: dict[str, Any] = {}
    cpu = [(t, s[PROCESS_CPU]) for t, s in scrapes if PROCESS_CPU in s]
    if len(cpu) >= 2 and cpu[-1][0] > cpu[0][0]:
        out["busy_cores"] = max(0.0, cpu[-1][1] - cpu[0][1]) / (cpu[-1][0] - cpu[0][0])
    rss = [s[PROCESS_RSS] for _, s in scrapes if PROCESS_RSS in s]
    if rss:
        out["rss_bytes"] = int(max(rss))
    return out


def engine_reading(scrapes: list[Scrape]) -> tuple[Engine | None, dict[str, Any]]:
    """The engine recognised on the page and its fields over the level."""
    names = {n for _, s in scrapes for n in s}
    eng = engine_of(names)
    if eng is None:
        return None, {}
    out: dict[str, Any] = {}
    for fld, candidates in eng.peaks.items():
        vals = [s[n] for _, s in scrapes if (n := _first(candidates, s)) is not None]
        if vals:
            out[fld] = int(max(vals)) if fld.endswith("bytes") else max(vals)
    for fld, candidates in eng.deltas.items():
        name = next((n for n in candidates if n in names), None)
        if name is not None and (d := _increase(scrapes, name)) is not None:
            out[fld] = d
    for fld, (times, count, scale) in eng.per_request_ms.items():
        requests = _increase(scrapes, count)
        spent = [_increase(scrapes, t) for t in times]
        if requests and all(x is not None for x in spent):
            out[fld] = sum(x or 0.0 for x in spent) * scale / requests
    return eng, out


def slots_of(doc: object) -> tuple[int, int] | None:
    """(slots, slots processing) from llama-server's GET /slots (a JSON list of slots, each
    with `is_processing`); None for anything else."""
    if not isinstance(doc, list) or not doc or not all(isinstance(s, dict) for s in doc):
        return None
    return len(doc), sum(1 for s in doc if s.get("is_processing"))
