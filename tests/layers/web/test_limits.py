"""The governance policies, with exact numbers (binary fractions, so float math is exact)."""

from __future__ import annotations

from scalelab.layers.web.governance.limits import (
    amount,
    apportion,
    exhausted,
    full_bucket,
    retry_after,
    take,
    utc_iso,
    window_end,
    window_start,
)


def test_bucket_spends_its_burst_then_refuses_with_the_wait() -> None:
    rate, burst = 2.0, 3.0  # 2 tokens a second, 3 at once
    s = full_bucket(burst, 10.0)
    waits = []
    for _ in range(4):
        s, w = take(s, 10.0, rate, burst)
        waits.append(w)
    assert waits == [0.0, 0.0, 0.0, 0.5]  # the 4th waits for one token: 1 / 2 s
    assert s == (0.0, 10.0)
    s, w = take(s, 10.25, rate, burst)  # half a token has come back
    assert (s, w) == ((0.5, 10.25), 0.25)
    s, w = take(s, 10.5, rate, burst)
    assert (s, w) == ((0.0, 10.5), 0.0)


def test_bucket_refills_to_burst_only_and_ignores_a_clock_stepping_back() -> None:
    s, w = take((0.0, 0.0), 100.0, 2.0, 3.0)  # 200 tokens' worth of time, capped at 3
    assert (s, w) == ((2.0, 100.0), 0.0)
    s, w = take((0.25, 5.0), 4.0, 2.0, 3.0)  # now < then: no refill
    assert s == (0.25, 4.0) and w == 0.375


def test_retry_after_rounds_up_to_whole_seconds_at_least_one() -> None:
    assert [retry_after(x) for x in (0.0, 0.02, 1.0, 1.0000000001, 1.5, 59.2)] == \
        [1, 1, 1, 1, 2, 60]


def test_windows_are_fixed_and_aligned_to_utc() -> None:
    t = 1_796_169_600.0 + 3 * 3600 + 125.5  # 2026-12-02 03:02:05.5 UTC
    assert utc_iso(window_start(t, "day")) == "2026-12-02T00:00:00Z"
    assert utc_iso(window_end(t, "day")) == "2026-12-03T00:00:00Z"
    assert utc_iso(window_start(t, "hour")) == "2026-12-02T03:00:00Z"
    assert window_start(t, "minute") == t - 5.5
    assert window_end(t, "minute") == t + 54.5


def test_requests_budget_admits_exactly_its_limit_others_until_reached() -> None:
    assert not exhausted(2, 3, "requests") and exhausted(3, 3, "requests")
    assert not exhausted(2.5, 3, "tokens") and exhausted(3.0, 3, "tokens")
    assert exhausted(4.0, 3, "core_seconds")


def test_apportion_shares_cpu_by_finished_requests() -> None:
    assert apportion(3.0, {"a": 1, "b": 2}) == {"a": 1.0, "b": 2.0}
    assert apportion(0.0, {"a": 1}) == {"a": 0.0}
    assert apportion(1.0, {}) == {}


def test_amount_reads_as_people_write_it() -> None:
    assert amount(1_000_000, "requests") == "1,000,000 requests"
    assert amount(2.5, "core_seconds") == "2.5 core-seconds"
    assert amount(1500.0, "tokens") == "1,500 tokens"
