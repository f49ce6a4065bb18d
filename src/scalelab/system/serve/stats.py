"""Per-version inference statistics, as Triton's statistics extension reports them
(GET /v2/models/{name}/stats, /v2/models/stats).

Plain integers on the event loop's thread (the batcher and the handlers update them; nothing
else writes), so an update costs a few additions and no lock. They are this process's own:
with --workers N each worker answers with its own counts (Prometheus' /metrics is the merged
view). Durations are nanoseconds; like Triton's, the per-request durations `queue`,
`compute_input`, `compute_infer` and `compute_output` give each request of a batch the batch's
whole time, while `batch_stats` counts each execution once per batch size.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class Duration:
    """How many, and their total nanoseconds."""

    count: int = 0
    ns: int = 0

    def add(self, ns: int, count: int = 1) -> None:
        self.count += count
        self.ns += ns

    def doc(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


@dataclass(slots=True)
class BatchStat:
    """Executions of one batch size: the input, forward and output phases."""

    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)


@dataclass(slots=True)
class VersionStats:
    """Triton's InferStatistics for one (model, version), plus its counts."""

    inference_count: int = 0
    """Rows inferred (a request of batch 4 counts 4)."""
    execution_count: int = 0
    """Forward passes (batches)."""
    last_inference_ms: int = 0
    """Wall-clock milliseconds since the epoch of the last execution (0 = none yet)."""
    success: Duration = field(default_factory=Duration)
    """Requests answered, with their time in the server (arrival to response)."""
    fail: Duration = field(default_factory=Duration)
    """Requests that got an error after reaching this version."""
    queue: Duration = field(default_factory=Duration)
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)
    cache_hit: Duration = field(default_factory=Duration)
    cache_miss: Duration = field(default_factory=Duration)
    batches: dict[int, BatchStat] = field(default_factory=dict)

    def executed(self, *, rows: int, requests: int, queue_ns: int, input_ns: int,
                 infer_ns: int, output_ns: int, at_ms: int) -> None:
        """One batch of `requests` requests and `rows` rows ran."""
        self.inference_count += rows
        self.execution_count += 1
        self.last_inference_ms = at_ms
        self.queue.add(queue_ns, requests)
        self.compute_input.add(input_ns * requests, requests)
        self.compute_infer.add(infer_ns * requests, requests)
        self.compute_output.add(output_ns * requests, requests)
        b = self.batches.get(rows)
        if b is None:
            b = self.batches[rows] = BatchStat()
        b.compute_input.add(input_ns)
        b.compute_infer.add(infer_ns)
        b.compute_output.add(output_ns)

    def doc(self, name: str, version: str) -> dict[str, Any]:
        """The ModelStatistics object of Triton's statistics extension."""
        return {
            "name": name, "version": version, "last_inference": self.last_inference_ms,
            "inference_count": self.inference_count, "execution_count": self.execution_count,
            "inference_stats": {
                "success": self.success.doc(), "fail": self.fail.doc(),
                "queue": self.queue.doc(), "compute_input": self.compute_input.doc(),
                "compute_infer": self.compute_infer.doc(),
                "compute_output": self.compute_output.doc(),
                "cache_hit": self.cache_hit.doc(), "cache_miss": self.cache_miss.doc()},
            "batch_stats": [
                {"batch_size": size, "compute_input": b.compute_input.doc(),
                 "compute_infer": b.compute_infer.doc(),
                 "compute_output": b.compute_output.doc()}
                for size, b in sorted(self.batches.items())]}
