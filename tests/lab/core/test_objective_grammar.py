"""The one objective grammar: `{metric: p95_ms, max: 50}` <-> "p95<50ms" <-> "ttft_p95<50ms"."""

import pytest

from scalelab.lab.core.errors import BadUsageError
from scalelab.lab.core.objectives import Objective, Term, read_term, slo_text
from scalelab.lab.load.llm.token_slo import parse_token_slo
from scalelab.lab.load.slo import parse_slo


def test_read_term_reads_every_form() -> None:
    assert read_term("p95<50ms") == Term(quantile=0.95, threshold_s=0.05)
    assert read_term("TTFT_p99.9<=0.5s") == Term(of="ttft", quantile=0.999, threshold_s=0.5)
    assert read_term("tpotp999<60") == Term(of="tpot", quantile=0.999, threshold_s=0.06)
    assert read_term("avail>=99.9%") == Term(availability=0.999)
    assert read_term("errors<0.1%") == Term(availability=0.999)
    assert read_term("rate>3") is None
    with pytest.raises(BadUsageError, match="percentile"):
        read_term("p0<5ms")


def test_to_slo_and_from_slo_are_inverses() -> None:
    for o, text, of in ((Objective(metric="p95_ms", max=50), "p95<50ms", None),
                        (Objective(metric="p99_ms", max=2.5), "ttft_p99<2.5ms", "ttft"),
                        (Objective(metric="availability", min=0.999), "avail>=99.9%", None)):
        assert o.to_slo(of) == text
        assert Objective.from_slo(text, of) == o
    with pytest.raises(BadUsageError, match="no --slo term"):
        Objective(metric="rate", min=3).to_slo()
    with pytest.raises(BadUsageError, match="cannot read"):
        Objective.from_slo("ttft_p95<5ms")  # a token timing where a request's latency is meant
    with pytest.raises(BadUsageError, match="p50, p95 or p99"):
        Objective.from_slo("p90<5ms")


def test_the_load_testers_read_what_slo_text_writes() -> None:
    objs = [Objective(metric="p99_ms", max=200), Objective(metric="availability", min=0.999)]
    text = slo_text(objs)
    assert text == "p99<200ms,avail>=99.9%"
    slo = parse_slo(text)
    assert (slo.latency[0].quantile, slo.latency[0].threshold_s, slo.availability) == (
        0.99, 0.2, 0.999)
    tok = parse_token_slo(slo_text(objs, of="ttft") or "")
    assert (tok.objectives[0].metric, tok.objectives[0].threshold_s, tok.availability) == (
        "ttft", 0.2, 0.999)
    assert slo_text(objs, availability=False) == "p99<200ms"
    with pytest.raises(BadUsageError, match="cannot read"):
        parse_slo("ttft_p95<5ms")
    with pytest.raises(BadUsageError, match="cannot read"):
        parse_token_slo("p95<5ms")
