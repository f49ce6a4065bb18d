"""The validity rule, the merge of lag readings and of a level's chunks, as pure functions with
exact limits."""

import numpy as np
import pytest

from scalelab.lab.core.records import Cost, Record, make_record
from scalelab.lab.load.clock import LagRecorder, LagStats
from scalelab.lab.load.histogram import LatencyHistogram
from scalelab.lab.load.http.generator import HttpPart
from scalelab.lab.load.http.result import (
    SATURATED_CORE_SHARE,
    STARVED_WAIT_SHARE,
    GeneratorCpu,
    generator_cpu,
    merge,
    validity,
)
from scalelab.lab.load.http.result import merge_records as merge_chunks
from scalelab.lab.load.slices import slice_blobs


def _lag(p99_ms: float) -> LagStats:
    return LagStats(count=1000, p50_ms=0.05, p99_ms=p99_ms, max_ms=p99_ms * 2, late=0)


def _reasons(*, rate: float, p99_ms: float, sent: float | None = None, sched: float | None = None,
             slo_s: float | None = None, pool: int = 0) -> list[str]:
    return validity(mode="open", offered_rps=rate, sent_rps=sent or rate,
                    scheduled_rps=sched or rate, lag=_lag(p99_ms), pool_waits=pool,
                    slo_threshold_s=slo_s)


def test_rate_short_of_the_schedule() -> None:
    assert _reasons(rate=100, p99_ms=0.1, sent=98.1, sched=100) == []  # 1.9% short
    r = _reasons(rate=100, p99_ms=0.1, sent=97.5, sched=100)  # 2.5% short
    assert len(r) == 1 and r[0].startswith(
        "generator fell behind: sent 97.5 req/s of the 100.0 scheduled (2.5% short, limit 2%)")
    assert r[0].endswith("add --processes (now 1), lower --rate, use --realtime, or run the "
                         "generator on a quieter machine")
    rt = validity(mode="open", offered_rps=100, sent_rps=97.5, scheduled_rps=100, lag=_lag(0.1),
                  pool_waits=0, slo_threshold_s=None, processes=2, realtime=True)
    assert rt[0].endswith("add --processes (now 2), lower --rate, or run the generator on a "
                          "quieter machine")
    r = _reasons(rate=100, p99_ms=0.1, sent=50, sched=100, pool=7)
    assert r[0].endswith("7 requests waited for a free connection: raise --max-connections")


def test_lag_against_the_gap_with_a_2ms_floor() -> None:
    # 100 req/s: one gap is 10 ms, so 9 ms of lag p99 passes and 11 ms does not.
    assert _reasons(rate=100, p99_ms=9.0) == []
    assert "10.00 ms limit" in _reasons(rate=100, p99_ms=11.0)[0]
    # 1,000 req/s: the gap is 1 ms, the floor 2 ms rules.
    assert _reasons(rate=1000, p99_ms=1.9) == []
    r = _reasons(rate=1000, p99_ms=2.1)
    assert r[0].startswith("generator lag p99 2.10 ms is more than the 2.00 ms limit")


def test_lag_against_the_objective() -> None:
    # 10 req/s, p99 < 200 ms: the gap allows 100 ms, the objective 10% = 20 ms.
    assert _reasons(rate=10, p99_ms=19.0, slo_s=0.2) == []
    r = _reasons(rate=10, p99_ms=21.0, slo_s=0.2)
    assert r == [r[0]] and "more than 10% of the 200 ms objective" in r[0]
    assert _reasons(rate=10, p99_ms=21.0) == []  # no objective, gap rule only


def test_closed_loop_and_empty_levels_are_not_judged_here() -> None:
    assert validity(mode="closed", offered_rps=None, sent_rps=5.0, scheduled_rps=0.0,
                    lag=_lag(50.0), pool_waits=0, slo_threshold_s=None) == []
    empty = LagStats(count=0, p50_ms=None, p99_ms=None, max_ms=None, late=0)
    assert validity(mode="open", offered_rps=100, sent_rps=0.0, scheduled_rps=0.0, lag=empty,
                    pool_waits=0, slo_threshold_s=None) == []


def _cpu(busy: float, wait: float | None, machine: float | None = 1.98) -> GeneratorCpu:
    return GeneratorCpu(busy_cores=busy, wait_share=wait, machine_busy_cores=machine,
                        machine_cores=2)


def test_a_cpu_starved_generator_is_named_even_when_requests_queued_for_connections() -> None:
    # The starved loop read its responses late, so 120 requests found every connection busy;
    # the cause is the CPU (it waited for a core 85% of the run), not the connection cap.
    r = validity(mode="open", offered_rps=2000, sent_rps=900, scheduled_rps=2000,
                 lag=_lag(40.0), pool_waits=120, slo_threshold_s=None,
                 cpu=_cpu(0.14, 0.85))
    fix = ("the generator was CPU-starved (its loop ran 0.14 busy cores, waited for a core 85% "
           "of the run, the machine's cores were 1.98 of 2 busy): add --processes (now 1), use "
           "--realtime, or run the generator on a quieter machine")
    assert len(r) == 2 and all(x.endswith(fix) for x in r), r
    assert not any("--max-connections" in x for x in r)
    # A process running its core flat out is starved too (it waited for nothing).
    flat = validity(mode="open", offered_rps=20000, sent_rps=9000, scheduled_rps=20000,
                    lag=_lag(0.1), pool_waits=0, slo_threshold_s=None, processes=2,
                    realtime=True, cpu=_cpu(1.81, 0.02, machine=None))
    assert flat == ["generator fell behind: sent 9000.0 req/s of the 20000.0 scheduled (55.0% "
                    "short, limit 2%); the generator was CPU-starved (its loop ran 1.81 busy "
                    "cores, waited for a core 2% of the run): add --processes (now 2), or run "
                    "the generator on a quieter machine"]


def test_starvation_limits_are_exact_and_a_fed_generator_keeps_the_connection_advice() -> None:
    assert GeneratorCpu(busy_cores=0.5, wait_share=STARVED_WAIT_SHARE, machine_busy_cores=None,
                        machine_cores=None).starved(1)
    assert not _cpu(0.5, 0.2499).starved(1)
    assert _cpu(SATURATED_CORE_SHARE * 2, None).starved(2)
    assert not _cpu(SATURATED_CORE_SHARE * 2 - 0.01, None).starved(2)
    # Waiting 3% of the run for a core is a fed generator: the queue was for connections.
    r = validity(mode="open", offered_rps=100, sent_rps=50, scheduled_rps=100, lag=_lag(0.1),
                 pool_waits=7, slo_threshold_s=None, cpu=_cpu(0.2, 0.03))
    assert r[0].endswith("7 requests waited for a free connection: raise --max-connections")


def test_generator_cpu_merges_the_processes_readings() -> None:
    a = HttpPart(cpu_s=0.5, cpu_wait_s=1.5, cpu_span_s=2.0, machine_busy_cores=1.9)
    b = HttpPart(cpu_s=0.25, cpu_wait_s=0.5, cpu_span_s=1.0, machine_busy_cores=1.5)
    g = generator_cpu([a, b], cores=2)
    assert g == GeneratorCpu(busy_cores=0.375, wait_share=2.0 / 3.0, machine_busy_cores=1.9,
                             machine_cores=2)
    # No schedstat: the wait is unknown, busy cores still count.
    c = HttpPart(cpu_s=0.0, cpu_wait_s=None, cpu_span_s=2.0)
    assert generator_cpu([c], cores=4) == GeneratorCpu(busy_cores=0.0, wait_share=None,
                                                       machine_busy_cores=None, machine_cores=4)
    assert generator_cpu([HttpPart()]) is None


def test_lag_quantiles_never_read_above_the_exact_worst() -> None:
    # 23,187 µs sits in HdrHistogram's 16 µs-wide bucket [23,184, 23,199]; the histogram reads
    # every quantile there as 23,199 µs, above the exact worst 23.187355 ms the generator kept.
    lag = LagRecorder()
    for late_s in (0.0002, 0.0002, 0.023187355):
        lag.add(late_s)
    assert lag.stats().p99_ms == 23.199
    lat = LatencyHistogram()
    lat.record(0.020)
    part = HttpPart(sent=3, ok=3, within=3, hist_blob=lat.encode(), lag_late=1,
                      lag_max_s=0.023187355, lag_blob=lag.histogram().encode(), last_send=0.04,
                      last_done=0.06)
    r = merge([part], mode="open", offered_rps=50.0, concurrency=None, arrival="constant",
              window_s=0.06, slo_threshold_s=None)
    assert r.lag_max_ms == 23.187355
    assert r.lag_p99_ms == 23.187355 and r.lag_p50_ms == 0.2


def _chunk(values_ms: list[float], *, wall_s: float, cpu_s: float) -> Record:
    h = LatencyHistogram()
    us = np.asarray([int(v * 1000) for v in values_ms])
    h.record_us(us)
    return make_record(experiment="e", stage="serve", variable="rate", level=40.0,
                       wall_s=wall_s, rate=len(values_ms) / wall_s, failures=1,
                       failure_rate=1 / len(values_ms), latency=h.percentiles().latency(),
                       histograms={"latency": h.encode()},
                       slices={"latency": slice_blobs(us)},
                       cost=Cost(usd=0.01 * wall_s, per_unit_usd=None, unit="1k responses"),
                       extras={"samples": len(values_ms),
                               "successes": len(values_ms) - 1, "server_cpu_s": cpu_s,
                               "server_responses": len(values_ms),
                               "cpu_busy_cores": cpu_s / (wall_s + 1.0),
                               "errors_by_status": {"500": 1}})


def test_merging_chunks_is_exact() -> None:
    """Histograms added (every quantile as if one window had recorded all), counts summed,
    rates over the summed time."""
    a, b = [float(v) for v in range(1, 101)], [float(v) for v in range(101, 301)]
    whole = LatencyHistogram()
    whole.record_us(np.asarray([int(v * 1000) for v in a + b]))
    first, second = _chunk(a, wall_s=1.0, cpu_s=0.5), _chunk(b, wall_s=2.0, cpu_s=1.5)
    got = merge_chunks([first, second])
    assert got.latency == whole.percentiles().latency()
    assert LatencyHistogram.decode(got.histograms["latency"]).count == 300
    assert got.extras["samples"] == 300 and got.extras["successes"] == 298
    assert got.failures == 2 and got.failure_rate == 2 / 300
    assert got.wall_s == 3.0 and got.rate == 298 / 3.0
    assert got.extras["errors_by_status"] == {"500": 2}
    assert got.extras["server_cpu_s"] == 2.0
    assert got.resources.cpu_busy_cores == pytest.approx(2.0 / 5.0)  # 2 s of CPU over 2 + 3 s
    # The slices one chunk after the other; the cost summed, per 1k of the 300 responses.
    assert got.slices == {"latency": first.slices["latency"] + second.slices["latency"]}
    assert got.cost is not None and got.cost.unit == "1k responses"
    assert (got.cost.usd, got.cost.per_unit_usd) == pytest.approx((0.03, 0.1))
    with pytest.raises(ValueError, match="no latency histogram"):
        merge_chunks([_chunk(a, wall_s=1.0, cpu_s=0.5),
                      make_record(experiment="e", stage="serve", variable="rate", level=40.0)])
