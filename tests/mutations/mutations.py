"""The mutations `run.py` applies: one broken line each, and the tests that must catch it.

One per row of the README's Guarantees table at least, on the modules the promise rests on, and
the three breaks of issue #47 (p90 read as p95, latency timed from the send, the decode step's
padding mask dropped). `line` is the source line as it is (matched stripped of surrounding
space, and it must occur exactly once in its file); `mutated` replaces it at its indentation.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mutation:
    name: str
    """Short name (the README row or the break it stands for)."""
    file: str
    """Path from the repository root."""
    line: str
    """The line as it is."""
    mutated: str
    """The line broken."""
    tests: tuple[str, ...]
    """Test files or ids (from the repository root) that must fail."""


L = "tests/lab/load/"
MUTATIONS: list[Mutation] = [
    # ---- issue #47's three breaks ----
    Mutation("p90 read as p95", "src/scalelab/lab/load/histogram.py",
             "return Percentiles(count=self.count, p50_ms=ms[0], p90_ms=ms[1], p95_ms=ms[2],",
             "return Percentiles(count=self.count, p50_ms=ms[0], p90_ms=ms[1], p95_ms=ms[1],",
             (L + "test_histogram.py",)),
    Mutation("HTTP open loop timed from the send", "src/scalelab/lab/load/http/generator.py",
             "conn.send(self._next_request(measured), (due, measured))",
             "conn.send(self._next_request(measured), (now(), measured))",
             (L + "test_latency_truth.py::test_http_open_loop_latency_includes_the_wait_for_a"
              "_connection",)),
    Mutation("SSE open loop timed from the send", "src/scalelab/lab/load/llm/stream.py",
             "conn, waited = await self._pool.acquire()",
             "conn, waited = await self._pool.acquire(); start = now()",
             (L + "test_latency_truth.py::test_sse_ttft_and_e2e_include_the_wait_for_a_stream",)),
]
MUTATIONS += [
    Mutation("padding mask dropped in decode (unequal lengths)",
             "src/scalelab/system/generate/runner.py",
             "if self.q_max > 1 or any(c != self.ctx_max for c in ctx):",
             "if self.q_max > 1:",
             ("tests/system/generate/test_llama.py",)),
]
R = "tests/reliability/"
# ---- one per Guarantees row ----
MUTATIONS += [
    Mutation("verdict: decided checks (Clopper-Pearson upper side)",
             "src/scalelab/lab/core/decide.py",
             "hi = 1.0 if k >= n else _beta_quantile(1 - a / 2, k + 1, n - k)",
             "hi = 1.0 if k >= n else _beta_quantile(1 - a, k + 1, n - k)",
             ("tests/lab/core/test_decide.py",)),
    Mutation("dead endpoint: an all-error stage not failed",
             "src/scalelab/lab/diagnose/failures.py",
             "if rates and len(rates) == len(rows) and all(x >= 1.0 for x in rates):",
             "if rates and len(rates) == len(rows) and all(x > 1.0 for x in rates):",
             ("tests/lab/diagnose/test_failures.py",)),
    Mutation("quantized: Q4_0 offset", "src/scalelab/system/generate/quant.py",
             "else -8.0 * d)", "else -7.0 * d)",
             ("tests/system/generate/test_quant.py",)),
    Mutation("overload: queue admits 4x its bound", "src/scalelab/system/serve/worker.py",
             "self.queue: asyncio.Queue[Job] = asyncio.Queue(maxsize=db.max_queue_size)",
             "self.queue: asyncio.Queue[Job] = asyncio.Queue(maxsize=4 * db.max_queue_size)",
             (R + "test_serve_overload.py::test_three_times_capacity_every_request_answered",)),
    Mutation("checkpoints: newest taken unverified", "src/scalelab/system/train/checkpoint.py",
             "why = self.verify(s, run)", "why = None",
             (R + "test_train_crash.py",)),
    Mutation("parallel: 1F1B bubble measured short",
             "src/scalelab/system/train/parallel/pipeline.py",
             "return sum(1 - b / makespan for b in busy) / len(busy) if makespan > 0 else 0.0",
             "return sum(1 - b / makespan for b in busy) / (len(busy) + 1) if makespan > 0 "
             "else 0.0",
             ("tests/system/train/test_parallel_equivalence.py",)),
    Mutation("reconciliation: duplicates by key not counted",
             "src/scalelab/system/data/pipeline.py",
             "deduped = oc.exact_duplicates + oc.key_duplicates",
             "deduped = oc.exact_duplicates",
             (R + "test_data_fuzz.py::test_exact_and_key_duplicates_reconcile_exactly",
              R + "test_data_fuzz.py")),
    Mutation("admin: any bearer token let in", "src/scalelab/system/serve/admin.py",
             "if scheme.lower() != \"bearer\" or not hmac.compare_digest(given.strip().encode(),",
             "if scheme.lower() != \"bearer\" or hmac.compare_digest(given.strip().encode(),",
             (R + "test_serve_abuse.py",)),
    Mutation("413: body limit off by far", "src/scalelab/layers/web/guard.py",
             "return rid, (n if n > max_body else None), False",
             "return rid, (n if n > 2 * max_body else None), False",
             (R + "test_serve_requests.py",)),
    Mutation("bad requests: a malformed body answered 200", "src/scalelab/system/serve/infer.py",
             "await send_error(send, e.status, e.message, extra_headers=tags + [",
             "await send_error(send, 200 if e.status in (400, 422) else e.status, e.message, "
             "extra_headers=tags + [",
             (R + "test_serve_requests.py::test_schemathesis_no_5xx",)),
    Mutation("governor: the rate limit never refuses",
             "src/scalelab/layers/web/governance/limits.py",
             "if tokens >= 1.0:", "if tokens >= 0.0:",
             ("tests/layers/web/test_governance_e2e.py",)),
    Mutation("trace: an all-zero trace id accepted", "src/scalelab/layers/web/traceparent.py",
             "if trace_id == _ZERO_TRACE or span_id == _ZERO_SPAN:",
             "if span_id == _ZERO_SPAN:",
             ("tests/layers/web/test_trace.py",)),
    Mutation("alerts: page burn rate", "src/scalelab/layers/observe/rules.py",
             "PAGE = ((\"1h\", \"5m\", 14.4), (\"6h\", \"30m\", 6.0))",
             "PAGE = ((\"1h\", \"5m\", 20.0), (\"6h\", \"30m\", 6.0))",
             ("tests/layers/observe/test_alert_rules.py",)),
    Mutation("retrieval: recall counts near misses", "src/scalelab/system/retrieval/quality.py",
             "hits = (found_true[:, :k] >= exact_kth[:, None] - EPS).sum(axis=1)",
             "hits = (found_true[:, :k] >= exact_kth[:, None] - 0.1).sum(axis=1)",
             ("tests/system/retrieval/test_bench.py",)),
    Mutation("cluster: a worker's share of the schedule", "src/scalelab/lab/load/level.py",
             "return times[index::parts]", "return times[index::parts][1:]",
             (L + "test_cluster.py",)),
    Mutation("pools whole: a freed block kept", "src/scalelab/system/generate/blocks.py",
             "self.free[block_id] = None",
             "self.free.update({block_id: None} if block_id % 7 else {})",
             (R + "test_generate_faults.py",)),
    Mutation("bad input: a usage error exits 1", "src/scalelab/cli/__init__.py",
             "return _fail(2, f\"{e.format_message()} (see '{cmd} --help')\")",
             "return _fail(1, f\"{e.format_message()} (see '{cmd} --help')\")",
             (R + "test_cli_abuse.py",)),
    Mutation("ingestion log: resumes one past its offset", "src/scalelab/system/online/log.py",
             "return int(row[0]) if row else 0", "return int(row[0]) + 1 if row else 0",
             (R + "test_online_faults.py",)),
    Mutation("open-loop clock: returns 2 ms early", "src/scalelab/lab/load/clock.py",
             "if t >= when:", "if t >= when - 0.002:",
             (L + "test_clock.py",)),
    Mutation("OIP: BF16 rounds ties up, not to even", "src/scalelab/system/serve/tensors.py",
             "rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16",
             "rounded = ((u + 0x8000) >> 16) << 16",
             ("tests/system/serve/test_datatypes.py",)),
    Mutation("OpenAI: usage total leaves the prompt out",
             "src/scalelab/system/generate/protocol.py",
             "\"total_tokens\": prompt + completion,", "\"total_tokens\": completion,",
             ("tests/system/generate/test_conformance.py",)),
    Mutation("/metrics: the first bad line never named", "src/scalelab/layers/web/exposition.py",
             "if not line.strip() or line.startswith(\"#\"):", "if True:",
             ("tests/layers/web/test_exposition.py",)),
    Mutation("replicas: /metrics merges no worker", "src/scalelab/system/serve/metrics.py",
             "multiprocess.MultiProcessCollector(merged)", "pass",
             ("tests/lab/diagnose/test_serve_replicas.py",)),
    Mutation("crash datasets: the fallback deletes the old version first",
             "src/scalelab/system/data/pipeline.py",
             "os.replace(out, old)", "shutil.rmtree(out)",
             (R + "test_data_crash.py::test_kill_at_every_publish_step",)),
    Mutation("no leak: 4 KiB kept per request", "src/scalelab/system/serve/infer.py",
             "counts[key] = counts.get(key, 0) + 1",
             "counts[key] = counts.get(key, 0) + 1; "
             "self.__dict__.setdefault('_leak', []).append(bytearray(4096))",
             (R + "test_serve_soak.py",)),
]
