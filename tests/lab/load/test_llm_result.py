"""The merge of a `load llm` level's chunks: histograms added, counts summed, gauges at their
peak, energy summed (pure, exact numbers)."""

from __future__ import annotations

import numpy as np
import pytest

from scalelab.lab.core.records import Cost, Record, make_record
from scalelab.lab.core.signals import Energy
from scalelab.lab.load.histogram import LatencyHistogram
from scalelab.lab.load.llm.result import HISTOGRAMS
from scalelab.lab.load.llm.result import merge_records as merge_llm_chunks


def _rec(values_ms: list[float], *, wall_s: float, failures: int, kv: float,
         scrapes: int) -> Record:
    h = LatencyHistogram()
    h.record_us(np.asarray([int(v * 1000) for v in values_ms]))
    n = len(values_ms)
    return make_record(
        experiment="e", stage="llm", variable="concurrency", level=2.0, wall_s=wall_s,
        rate=4 * (n - failures) / wall_s, failures=failures, failure_rate=failures / n,
        latency=h.percentiles().latency(),
        histograms={k: h.encode() for k in HISTOGRAMS}, energy=Energy(
            joules=2.0 * wall_s, unit="1k output tokens", basis="estimated"),
        extras={"samples": n,
                "successes": n - failures, "output_tokens": 4 * (n - failures),
                "output_tps": 4 * (n - failures) / wall_s, "engine_scrapes": scrapes,
                "engine_kv_usage_max": kv, "engine_kv_usage_mean": kv / 2,
                "engine_waiting_max": 0.0, "errors_by_kind": {"reset": failures}},
        cost=Cost(usd=0.01 * wall_s, per_unit_usd=0.001, unit="1k output tokens"))


def test_merging_llm_chunks_is_exact() -> None:
    """Each histogram added (quantiles as if one window had recorded every request), counts
    summed, rates over the summed time, gauges at their peak, the engine's limit re-read."""
    a, b = [float(v) for v in range(1, 101)], [float(v) for v in range(101, 301)]
    whole = LatencyHistogram()
    whole.record_us(np.asarray([int(v * 1000) for v in a + b]))
    got = merge_llm_chunks([_rec(a, wall_s=1.0, failures=1, kv=0.5, scrapes=10),
                            _rec(b, wall_s=3.0, failures=2, kv=0.96, scrapes=30)])
    assert got.latency == whole.percentiles().latency()
    assert {k: LatencyHistogram.decode(got.histograms[k]).count for k in HISTOGRAMS} == {
        k: 300 for k in HISTOGRAMS}  # the merged histograms are kept, not the last chunk's
    for k in ("itl", "tpot", "e2e"):
        assert got.extras[f"{k}_p95_ms"] == whole.percentiles().p95_ms
    assert got.extras["samples"] == 300 and got.extras["successes"] == 297
    assert got.failures == 3 and got.failure_rate == 3 / 300
    assert got.extras["availability"] == 1 - 3 / 300
    assert got.wall_s == 4.0 and got.rate == 4 * 297 / 4.0
    assert got.extras["errors_by_kind"] == {"reset": 3}
    assert got.extras["engine_scrapes"] == 40 and got.extras["engine_kv_usage_max"] == 0.96
    assert got.extras["engine_kv_usage_mean"] == pytest.approx((0.25 * 10 + 0.48 * 30) / 40)
    assert got.extras["limiting_signal"] == "kv-cache" and got.limiting_resource == "kv-cache"
    # each chunk's energy (tagged per step) summed; per unit over the merged cost's units
    assert got.cost is not None and got.cost.usd == pytest.approx(0.04)
    assert got.energy == Energy(joules=8.0, per_unit_j=None, unit="1k output tokens",
                                basis="estimated")
    with pytest.raises(ValueError, match="no histograms"):
        merge_llm_chunks([_rec(a, wall_s=1.0, failures=0, kv=0.1, scrapes=1),
                          make_record(experiment="e", stage="llm", variable="concurrency",
                                      level=2.0)])
