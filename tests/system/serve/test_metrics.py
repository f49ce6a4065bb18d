"""Metrics written in bulk: `observe_many` against prometheus-client's own observe, and the
per-loop-turn gathering of the per-request metrics against a real server's /metrics."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from serve_client import fire, samples
from serve_fixtures import Server, infer_body

from scalelab.system.serve.metrics import LATENCY_BUCKETS, observe_many


def _exposition(registry: CollectorRegistry) -> list[str]:
    return [line for line in generate_latest(registry).decode().splitlines()
            if "_created" not in line]  # creation timestamps differ between the two


def _pair() -> tuple[CollectorRegistry, Histogram, CollectorRegistry, Histogram]:
    r1, r2 = CollectorRegistry(), CollectorRegistry()
    h1 = Histogram("h", "h", ("model",), buckets=LATENCY_BUCKETS, registry=r1).labels("m")
    h2 = Histogram("h", "h", ("model",), buckets=LATENCY_BUCKETS, registry=r2).labels("m")
    return r1, h1, r2, h2


def test_observe_many_equals_one_observe_per_value() -> None:
    # on a bound, between bounds, below the first, past the last, negative, NaN, repeats
    values = [0.0005, 0.0005, 0.0006, 0.001, 0.0, -1.0, 0.003, 10.0, 11.0, 1e9, math.nan,
              0.02, 0.0199999]
    r1, h1, r2, h2 = _pair()
    for v in values:
        h1.observe(v)
    observe_many(h2, values)
    assert _exposition(r1) == _exposition(r2)
    counts = {line.split(" ")[0]: line.split(" ")[1] for line in _exposition(r2)
              if line.startswith("h_bucket")}
    assert counts['h_bucket{le="0.0005",model="m"}'] == "4.0"  # 0.0005 x2, 0.0, -1.0
    assert counts['h_bucket{le="+Inf",model="m"}'] == "12.0"  # every value but the NaN


def test_observe_many_of_nothing_writes_nothing() -> None:
    r1, _, r2, h2 = _pair()
    observe_many(h2, [])
    assert _exposition(r1) == _exposition(r2)


def test_observe_many_falls_back_to_observe_without_the_internals() -> None:
    class Plain:  # what a histogram child without prometheus-client's internals offers
        def __init__(self) -> None:
            self.seen: list[float] = []

        def observe(self, v: float) -> None:
            self.seen.append(v)

    p = Plain()
    observe_many(p, [0.1, 0.2])  # type: ignore[arg-type]
    assert p.seen == [0.1, 0.2]


def test_a_batch_of_requests_is_counted_exactly_once_each(server: Server) -> None:
    url = server.url
    names = ("scalelab_responses_total", "scalelab_request_duration_seconds_count",
             "scalelab_queue_wait_seconds_count", "scalelab_batch_formation_seconds_count")
    before = {n: samples(url, n, model="flights") for n in names}
    rs = fire(f"{url}/v2/models/flights/infer", 16, lambda i: infer_body(1, seed=700 + i))
    assert [r.status_code for r in rs] == [200] * 16
    # the gathered turn is flushed before the exposition: exact, no waiting
    after = {n: samples(url, n, model="flights") for n in names}
    assert {n: after[n] - before[n] for n in names} == dict.fromkeys(names, 16.0)
    assert samples(url, "scalelab_inflight_requests", model="flights") == 0


GC_IN_THE_LOCK = """
import gc, sys
from scalelab.system.serve.metrics import Metrics
m = Metrics()
m.watch_gc()
gc.set_threshold(1)  # a collection at nearly every allocation: inside the lock too
for i in range(300):  # a new label set builds its mmap entry under the global lock
    m.responses.labels("m", "1", str(i)).inc()
gc.set_threshold(700)
from prometheus_client.parser import text_string_to_metric_families
count = [s.value for f in text_string_to_metric_families(m.expose().decode()) for s in f.samples
         if s.name == "scalelab_gc_pause_seconds_count" and s.labels == {"generation": "0"}]
print(count[0])
"""


def test_gc_timing_cannot_deadlock_multiprocess_metrics(tmp_path: Path) -> None:
    # before: the gc callback observed into a histogram, and in multiprocess mode a collection
    # that began inside prometheus-client's global lock waited on it forever
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    p = subprocess.run([sys.executable, "-c", GC_IN_THE_LOCK], capture_output=True, text=True,
                       env=env, timeout=120, check=False)
    assert p.returncode == 0, p.stderr
    assert float(p.stdout.strip()) >= 300  # the collections are still timed, after the fact
