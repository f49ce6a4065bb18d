import pytest

from scalelab.lab.core.errors import BadUsageError, ScalelabError
from scalelab.lab.load.histogram import LatencyHistogram
from scalelab.lab.load.llm.token_slo import parse_token_slo
from scalelab.lab.load.slo import LatencyObjective, budget, parse_slo


def test_parse_slo_terms() -> None:
    s = parse_slo("p95<50ms, p99.9<=1s, avail>=99.9%")
    assert [(o.quantile, o.threshold_s) for o in s.latency] == [(0.95, 0.05), (0.999, 1.0)]
    assert s.availability == 0.999
    assert parse_slo("p999<200").latency[0].quantile == 0.999
    assert parse_slo("p95<20ms", error_budget="0.1%").error_budget == pytest.approx(0.001)
    assert parse_slo("errors<1%").availability == 0.99
    assert parse_slo("p95<50ms").label == "p95<50ms"


@pytest.mark.parametrize("text", ["p95>50ms", "p0<5ms", "p95<fast", "avail>=120%", "", "x"])
def test_bad_slo_is_refused(text: str) -> None:
    with pytest.raises(ScalelabError):
        parse_slo(text)


def test_budget_and_burn_rate_exact() -> None:
    h = LatencyHistogram()
    for i in range(1000):
        h.record(0.010 if i < 900 else 0.100)  # 100 of 1000 over 50 ms
    slo = parse_slo("p95<50ms,avail>=99%")
    lat, avail = budget(slo, hist=h, successes=1000, failures=5, wall_s=86400.0,
                        period_s=30 * 86400.0)
    assert (lat.events, lat.bad) == (1000, 100)
    assert lat.bad_fraction == pytest.approx(0.1)
    assert lat.burn_rate == pytest.approx(2.0)  # 10% slow against 5% allowed
    assert lat.consumed == pytest.approx(2.0 / 30)
    assert lat.exhausted_in_s == pytest.approx(15 * 86400.0)
    assert not lat.met
    assert (avail.events, avail.bad) == (1005, 5)
    assert avail.burn_rate == pytest.approx((5 / 1005) / 0.01)
    assert avail.met


def test_request_and_token_objectives_share_one_spine() -> None:
    """`--slo` for plain HTTP and for token streams: one term loop, one refusal wording, the
    token objective a latency objective with a metric."""
    with pytest.raises(BadUsageError, match=r"^--slo: cannot read 'q95<5'; write e\.g\. \"p95<"):
        parse_slo("q95<5")
    with pytest.raises(BadUsageError, match=r"^--slo: cannot read 'q95<5'; write e\.g\. \"ttft_"):
        parse_token_slo("q95<5")
    with pytest.raises(BadUsageError, match=r"^an SLO needs a latency objective"):
        parse_slo(" , ")
    with pytest.raises(BadUsageError, match=r"^a token SLO needs an objective"):
        parse_token_slo(" , ")
    o = parse_token_slo("ttft_p95<500ms").objectives[0]
    assert isinstance(o, LatencyObjective)
    assert o.label == "ttft_" + LatencyObjective(quantile=0.95, threshold_s=0.5).label
    assert o.label == "ttft_p95<500ms"
