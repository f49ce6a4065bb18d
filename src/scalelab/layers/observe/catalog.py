"""The one table of metric names the dashboard and the rules are built from.

Each entry is a sample name as Prometheus stores it (a counter's `_total`, a histogram's base
name whose `_bucket`, `_count` and `_sum` series exist), the server that exports it and its
labels. The names are written here rather than imported from the servers because parts do not
import each other; a test scrapes a running tabular server (and the generation and retrieval
servers' registries) and fails when a name here is no longer exposed, so a renamed metric
breaks the build instead of a dashboard panel going blank.

Our own metrics share one prefix, `scalelab_`; `vllm:` names are the generation server's where
it mirrors vLLM's (dashboards written for vLLM read them). A colon in any other name would be a
recording rule's (observe/rules.py writes those, `scalelab:...:ratio`), never a server's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Kind = Literal["counter", "gauge", "histogram"]
Server = Literal["serve", "generate", "retrieval", "governance"]


@dataclass(frozen=True, kw_only=True)
class Metric:
    name: str
    """The sample name (counters with `_total`; histograms without `_bucket`)."""
    kind: Kind
    server: Server
    """Which server exports it: serve (`scalelab serve`), generate (`scalelab generate serve`),
    retrieval (`scalelab retrieval serve`), governance (the limits and budgets of any of them)."""
    labels: tuple[str, ...]
    help: str
    buckets: tuple[float, ...] = ()
    """A histogram's bucket boundaries (what a latency SLO's threshold is read at)."""


def _m(name: str, kind: Kind, server: Server, labels: tuple[str, ...], help: str,
       buckets: tuple[float, ...] = ()) -> Metric:
    return Metric(name=name, kind=kind, server=server, labels=labels, help=help,
                  buckets=buckets)


SERVE_LATENCY = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0,
                 10.0)
GENERATE_LATENCY = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                    5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
RETRIEVAL_LATENCY = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)


MV = ("model", "version")
MN = ("model_name",)

METRICS: dict[str, Metric] = {m.name: m for m in (
    # scalelab serve (serve/metrics.py)
    _m("scalelab_request_duration_seconds", "histogram", "serve", MV,
       "End-to-end inference latency in the server", SERVE_LATENCY),
    _m("scalelab_queue_wait_seconds", "histogram", "serve", MV,
       "Enqueue until the batcher picked the job up"),
    _m("scalelab_batch_formation_seconds", "histogram", "serve", MV,
       "Pick-up until the batch was dispatched"),
    _m("scalelab_compute_seconds", "histogram", "serve", MV, "Forward pass time per batch"),
    _m("scalelab_batch_size", "histogram", "serve", MV, "Rows per forward pass"),
    _m("scalelab_queue_depth", "gauge", "serve", MV, "Jobs waiting (queued or being batched)"),
    _m("scalelab_inflight_requests", "gauge", "serve", ("model",),
       "Inference requests being handled"),
    _m("scalelab_cache_hits_total", "counter", "serve", MV, "Response cache hits"),
    _m("scalelab_cache_misses_total", "counter", "serve", MV, "Response cache misses"),
    _m("scalelab_responses_total", "counter", "serve", (*MV, "status"),
       "Inference responses by HTTP status"),
    # scalelab generate serve (generate/metrics.py: vLLM's names)
    _m("vllm:time_to_first_token_seconds", "histogram", "generate", MN, "Time to first token",
       GENERATE_LATENCY),
    _m("vllm:inter_token_latency_seconds", "histogram", "generate", MN,
       "Gap between output tokens"),
    _m("vllm:request_time_per_output_token_seconds", "histogram", "generate", MN,
       "Per request: (e2e - ttft) / (output tokens - 1)"),
    _m("vllm:e2e_request_latency_seconds", "histogram", "generate", MN, "Arrival to last token"),
    _m("vllm:request_queue_time_seconds", "histogram", "generate", MN,
       "Arrival to first schedule"),
    _m("vllm:iteration_tokens_total", "histogram", "generate", MN, "Tokens in one engine step"),
    _m("vllm:num_requests_running", "gauge", "generate", MN, "Sequences in the running batch"),
    _m("vllm:num_requests_waiting", "gauge", "generate", MN, "Sequences waiting to be admitted"),
    _m("vllm:kv_cache_usage_perc", "gauge", "generate", MN, "Fraction of KV blocks in use (0-1)"),
    _m("vllm:prefix_cache_queries_total", "counter", "generate", MN, "Prompt blocks looked up"),
    _m("vllm:prefix_cache_hits_total", "counter", "generate", MN, "Prompt blocks found cached"),
    _m("vllm:num_preemptions_total", "counter", "generate", MN, "Sequences preempted"),
    _m("vllm:prompt_tokens_total", "counter", "generate", MN,
       "Prompt tokens of finished requests"),
    _m("vllm:generation_tokens_total", "counter", "generate", MN, "Output tokens"),
    _m("vllm:request_success_total", "counter", "generate", (*MN, "finished_reason"),
       "Finished requests by reason"),
    # scalelab retrieval serve (retrieval/service.py)
    _m("scalelab_retrieval_request_seconds", "histogram", "retrieval", ("route",),
       "Request latency by route", RETRIEVAL_LATENCY),
    _m("scalelab_retrieval_requests_total", "counter", "retrieval", ("route", "code"),
       "Requests by route and status"),
    _m("scalelab_retrieval_inflight", "gauge", "retrieval", (), "Requests being worked on"),
    _m("scalelab_retrieval_index_vectors", "gauge", "retrieval", (), "Vectors in the index"),
    _m("scalelab_retrieval_rejected_total", "counter", "retrieval", (),
       "Requests refused by admission"),
    # governance (budgets and refusals of any server)
    _m("scalelab_budget_used", "gauge", "governance", ("client", "model", "unit", "period"),
       "Budget spent in the current period"),
    _m("scalelab_budget_limit", "gauge", "governance", ("client", "model", "unit", "period"),
       "Budget of the current period"),
    _m("scalelab_governance_refusals_total", "counter", "governance",
       ("client", "model", "reason"), "Requests refused by a limit, budget or kill switch"),
    _m("scalelab_governance_stopped", "gauge", "governance", ("kind", "name"),
       "Kill switch engaged (1) or released (0), per model or client"),
    _m("scalelab_governance_inflight", "gauge", "governance", ("client",),
       "Admitted requests in flight per client"),
)}


def series_names(m: Metric) -> tuple[str, ...]:
    """The sample names a scrape holds for `m` (a histogram's three series)."""
    if m.kind == "histogram":
        return (f"{m.name}_bucket", f"{m.name}_count", f"{m.name}_sum")
    return (m.name,)


def metric_of(series: str) -> Metric | None:
    """The catalog entry a sample name belongs to (`x_bucket` -> histogram `x`), or None."""
    if series in METRICS:
        return METRICS[series]
    for suffix in ("_bucket", "_count", "_sum"):
        base = series.removesuffix(suffix)
        if base != series and base in METRICS and METRICS[base].kind == "histogram":
            return METRICS[base]
    return None
