"""Prometheus metrics of the engine: vLLM's names for what vLLM measures, `scalelab_` for the rest.

A dashboard or alert written for vLLM reads a `vllm:` series here with the meaning vLLM gives it
(vllm/v1/metrics/loggers.py); what vLLM does not publish is under `scalelab_` (the project's
one prefix; a colon is for recording rules) so that no vLLM name means something else here.

vLLM's: histograms vllm:time_to_first_token_seconds, vllm:inter_token_latency_seconds,
vllm:request_time_per_output_token_seconds, vllm:e2e_request_latency_seconds,
vllm:request_queue_time_seconds, vllm:request_prefill_time_seconds (first schedule to first
token), vllm:request_decode_time_seconds (first to last token),
vllm:request_inference_time_seconds (first schedule to last token), vllm:request_prompt_tokens,
vllm:request_generation_tokens, vllm:request_params_max_tokens,
vllm:iteration_tokens_total (tokens per step); gauges vllm:num_requests_running,
vllm:num_requests_waiting, vllm:kv_cache_usage_perc; counters vllm:num_preemptions_total,
vllm:prefix_cache_queries_total / _hits_total (in tokens, as vLLM counts them),
vllm:spec_decode_num_drafts_total, vllm:spec_decode_num_draft_tokens_total /
_num_accepted_tokens_total, vllm:prompt_tokens_total (counted when a request's prefill ends),
vllm:generation_tokens_total (counted as generated), vllm:request_success_total{finished_reason}
(stop, length, abort).

scalelab's: scalelab_step_duration_seconds{phase=prefill|decode|mixed},
scalelab_kv_cache_blocks{state=used|free}, scalelab_prefix_cache_hit_rate (blocks, since start),
scalelab_spec_decode_acceptance_rate (since start).

Time histograms use finer buckets than vLLM's (a CPU engine's requests take milliseconds);
token-count histograms use vLLM's 1-2-5 buckets up to max_model_len.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

if TYPE_CHECKING:
    from scalelab.system.generate.blocks import BlockManager
    from scalelab.system.generate.sequence import Sequence


class EngineState(Protocol):
    """What the gauges read of an engine (generate.engine.LlmEngine is one): a protocol, so the
    engine, which owns its metrics, is not imported back by them."""

    @property
    def blocks(self) -> BlockManager: ...

    @property
    def num_running(self) -> int: ...

    @property
    def num_waiting(self) -> int: ...

_LATENCY = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
_TOKENS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 384, 512, 1024, 2048)


def buckets_1_2_5(max_value: int) -> tuple[float, ...]:
    """1, 2, 5, 10, 20, 50, ... up to max_value (vLLM's token-count buckets)."""
    out: list[float] = []
    scale = 1
    while True:
        for m in (1, 2, 5):
            if m * scale > max_value:
                return tuple(out)
            out.append(m * scale)
        scale *= 10


class EngineMetrics:
    """One registry per engine (tests build many engines in one process)."""

    def __init__(self, model_name: str, registry: CollectorRegistry | None = None, *,
                 max_model_len: int = 2048) -> None:
        self.registry = registry or CollectorRegistry()
        r, lab = self.registry, ["model_name"]
        self.model_name = model_name

        def hist(
            name: str, doc: str, buckets: tuple[float, ...] = _LATENCY, extra: tuple[str, ...] = ()
        ) -> Histogram:
            return Histogram(name, doc, [*lab, *extra], buckets=buckets, registry=r)

        def gauge(name: str, doc: str, extra: tuple[str, ...] = ()) -> Gauge:
            return Gauge(name, doc, [*lab, *extra], registry=r)

        def counter(name: str, doc: str, extra: tuple[str, ...] = ()) -> Counter:
            return Counter(name, doc, [*lab, *extra], registry=r)

        self.ttft = hist("vllm:time_to_first_token_seconds", "Time to first token.")
        self.itl = hist("vllm:inter_token_latency_seconds", "Gap between output tokens.")
        self.tpot = hist(
            "vllm:request_time_per_output_token_seconds",
            "Per request: (e2e - ttft) / (output tokens - 1).",
        )
        self.e2e = hist("vllm:e2e_request_latency_seconds", "Arrival to last token.")
        self.queue = hist("vllm:request_queue_time_seconds", "Arrival to first schedule.")
        counts = buckets_1_2_5(max_model_len)
        self.prefill_time = hist("vllm:request_prefill_time_seconds",
                                 "First schedule to first token (prefill phase).")
        self.decode_time = hist("vllm:request_decode_time_seconds",
                                "First token to last token (decode phase).")
        self.inference_time = hist("vllm:request_inference_time_seconds",
                                   "First schedule to last token (running phase).")
        self.req_prompt = hist("vllm:request_prompt_tokens", "Prompt tokens per request.",
                               buckets=counts)
        self.req_generation = hist("vllm:request_generation_tokens",
                                   "Generated tokens per request.", buckets=counts)
        self.req_max_tokens = hist("vllm:request_params_max_tokens",
                                   "The max_tokens request parameter.", buckets=counts)
        self.step_time = hist(
            "scalelab_step_duration_seconds", "One engine step (forward + sampling).",
            extra=("phase",)
        )
        self.tokens_per_step = hist(
            "vllm:iteration_tokens_total", "Tokens in one step.", buckets=_TOKENS
        )
        self.running = gauge("vllm:num_requests_running", "Sequences in the running batch.")
        self.waiting = gauge("vllm:num_requests_waiting", "Sequences waiting to be admitted.")
        self.kv_usage = gauge("vllm:kv_cache_usage_perc", "Fraction of KV blocks in use (0-1).")
        self.kv_blocks = gauge("scalelab_kv_cache_blocks", "KV blocks by state.", extra=("state",))
        self.prefix_rate = gauge("scalelab_prefix_cache_hit_rate",
                                 "Prefix-cache block hits / lookups since start.")
        self.prefix_queries = counter("vllm:prefix_cache_queries",
                                      "Prompt tokens looked up in the prefix cache.")
        self.prefix_hits = counter("vllm:prefix_cache_hits",
                                   "Prompt tokens found in the prefix cache.")
        self.preemptions = counter("vllm:num_preemptions", "Sequences preempted (recompute).")
        self.drafts = counter("vllm:spec_decode_num_drafts",
                              "Draft proposals (one per sequence and step).")
        self.drafted = counter("vllm:spec_decode_num_draft_tokens", "Draft tokens proposed.")
        self.accepted = counter("vllm:spec_decode_num_accepted_tokens", "Draft tokens accepted.")
        self.accept_rate = gauge("scalelab_spec_decode_acceptance_rate",
                                 "Accepted / drafted tokens since start.")
        self.prompt_tokens = counter("vllm:prompt_tokens",
                                     "Prompt tokens of requests whose prefill ended.")
        self.generation_tokens = counter("vllm:generation_tokens",
                                         "Output tokens, counted as generated.")
        self.success = counter("vllm:request_success",
                               "Finished requests by reason.", extra=("finished_reason",))
        self._seen_queries = 0
        self._seen_hits = 0
        self._drafted = 0
        self._accepted = 0

    def first_token(self, seq: Sequence, now: float) -> None:
        self.ttft.labels(self.model_name).observe(now - seq.arrival)
        self.prompt_tokens.labels(self.model_name).inc(seq.num_prompt)
        if seq.scheduled_at is not None:
            self.queue.labels(self.model_name).observe(seq.scheduled_at - seq.arrival)

    def inter_token(self, seq: Sequence, now: float) -> None:
        if seq.last_token_at is not None:
            self.itl.labels(self.model_name).observe(now - seq.last_token_at)

    def finished(self, seq: Sequence, now: float) -> None:
        """A request left the engine: finished (stop, length) or dropped (abort, timeout)."""
        m = self.model_name
        self.e2e.labels(m).observe(now - seq.arrival)
        first, last = seq.first_token_at, seq.last_token_at
        if first is not None and seq.num_output > 1:
            self.tpot.labels(m).observe(((last or now) - first) / (seq.num_output - 1))
        if seq.scheduled_at is not None:
            if first is not None:
                self.prefill_time.labels(m).observe(first - seq.scheduled_at)
            self.inference_time.labels(m).observe((last or now) - seq.scheduled_at)
        if first is not None:
            self.decode_time.labels(m).observe((last or now) - first)
        self.req_prompt.labels(m).observe(seq.num_prompt)
        self.req_generation.labels(m).observe(seq.num_output)
        self.req_max_tokens.labels(m).observe(seq.params.max_tokens)
        reason = seq.finish_reason if seq.finish_reason in ("stop", "length") else "abort"
        self.success.labels(m, reason).inc()

    def spec(self, drafted: int, accepted: int) -> None:
        self.drafts.labels(self.model_name).inc()
        self._drafted += drafted
        self._accepted += accepted
        self.drafted.labels(self.model_name).inc(drafted)
        self.accepted.labels(self.model_name).inc(accepted)
        self.accept_rate.labels(self.model_name).set(self._accepted / self._drafted)

    def step(
        self, engine: EngineState, tokens: int, prefill: int, decode: int, seconds: float,
        preempted: int, generated: int = 0,
    ) -> None:
        m = self.model_name
        if generated:
            self.generation_tokens.labels(m).inc(generated)
        phase = "mixed" if prefill and decode else ("prefill" if prefill else "decode")
        self.step_time.labels(m, phase).observe(seconds)
        self.tokens_per_step.labels(m).observe(tokens)
        if preempted:
            self.preemptions.labels(m).inc(preempted)
        self.gauges(engine)

    def gauges(self, engine: EngineState) -> None:
        """Refresh the point-in-time gauges (also called after aborts)."""
        m, b = self.model_name, engine.blocks
        self.running.labels(m).set(engine.num_running)
        self.waiting.labels(m).set(engine.num_waiting)
        self.kv_usage.labels(m).set(b.num_used / b.num_blocks)
        self.kv_blocks.labels(m, "used").set(b.num_used)
        self.kv_blocks.labels(m, "free").set(b.num_free)
        st = b.stats
        self.prefix_queries.labels(m).inc(st.query_tokens - self._seen_queries)
        self.prefix_hits.labels(m).inc(st.hit_tokens - self._seen_hits)
        self._seen_queries, self._seen_hits = st.query_tokens, st.hit_tokens
        self.prefix_rate.labels(m).set(st.hit_rate)
