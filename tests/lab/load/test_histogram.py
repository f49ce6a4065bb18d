import pytest

from scalelab.lab.load.histogram import LatencyHistogram


def test_percentiles_of_known_values() -> None:
    h = LatencyHistogram()
    for ms in range(1, 1001):  # 1..1000 ms
        h.record(ms / 1e3)
    p = h.percentiles()
    assert p.count == 1000
    # 3 significant digits: each value within 0.1%.
    assert p.p50_ms == pytest.approx(500, rel=1e-3)
    assert p.p90_ms == pytest.approx(900, rel=1e-3)
    # p95 and p99 are the percentiles every objective reads: exact to the histogram's buckets
    # (1..1000 ms in 1 ms steps: the k-th smallest value is k ms, read at 3 digits)
    assert p.p95_ms == pytest.approx(950, rel=1e-3)
    assert p.p99_ms == pytest.approx(990, rel=1e-3)
    assert h.quantile_ms(0.95) == p.p95_ms and h.quantile_ms(0.99) == p.p99_ms
    lat = p.latency()
    assert (lat.p50_ms, lat.p90_ms, lat.p95_ms, lat.p99_ms, lat.p999_ms, lat.max_ms) == (
        p.p50_ms, p.p90_ms, p.p95_ms, p.p99_ms, p.p999_ms, p.max_ms)
    assert len({p.p50_ms, p.p90_ms, p.p95_ms, p.p99_ms, p.p999_ms, p.max_ms}) == 6
    assert p.p999_ms == pytest.approx(999, rel=1e-3)
    assert p.max_ms == pytest.approx(1000, rel=1e-3)
    assert h.count_at_or_below(0.25) == 250


def test_merge_by_blob_equals_recording_everything_in_one() -> None:
    a, b, both = LatencyHistogram(), LatencyHistogram(), LatencyHistogram()
    for i in range(500):
        a.record(0.001 * (i % 50 + 1))
        b.record(0.1 + 0.001 * (i % 7))
        both.record(0.001 * (i % 50 + 1))
        both.record(0.1 + 0.001 * (i % 7))
    merged = LatencyHistogram.decode(a.encode())
    merged.add_blob(b.encode())
    assert merged.percentiles() == both.percentiles()
    assert merged.count == 1000


def test_empty_histogram_has_no_percentiles() -> None:
    p = LatencyHistogram().percentiles()
    assert p.count == 0 and p.p50_ms is None and p.max_ms is None


def test_mean_and_counts_below_match_hdrhistograms_own_iteration() -> None:
    # the array-based mean and count agree exactly with hdrh's (slow) iterators, on recorded
    # and on decoded (truncated counts array) histograms, at bucket edges and outside the range
    import numpy as np

    rng = np.random.default_rng(1)
    for trial in range(6):
        h = LatencyHistogram()
        h.record_us(rng.integers(1, [1_000, 10**6, 3 * 10**9][trial % 3], 1 + 97 * trial))
        if trial % 2:
            h = LatencyHistogram.decode(h.encode())
        assert h.mean_ms() == pytest.approx(h._h.get_mean_value() / 1e3, rel=1e-12)
        for sec in (0.0, 5e-4, 0.0105, 3.0, 1e4, float(rng.uniform(0, 2))):
            limit, want = int(sec * 1e6), 0
            for item in h._h.get_recorded_iterator():
                if item.value_iterated_to > limit and not h._h.values_are_equivalent(
                        item.value_iterated_to, limit):
                    break
                want += item.count_at_value_iterated_to
            assert h.count_at_or_below(sec) == want
    assert LatencyHistogram().mean_ms() is None
