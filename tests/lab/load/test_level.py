"""The spine both stacks share: a level's plan and merge (level.py), the parts' tally and the
result's level (result.py), with exact numbers."""

from __future__ import annotations

import math

import numpy as np
import pytest

from scalelab.lab.core.errors import BadUsageError
from scalelab.lab.load.cluster import WORKERS
from scalelab.lab.load.histogram import LatencyHistogram
from scalelab.lab.load.http.generator import HttpConfig, HttpPart
from scalelab.lab.load.http.run import LoadPlan
from scalelab.lab.load.level import split_list
from scalelab.lab.load.result import Part, Tally, finite
from scalelab.lab.load.send import Target

TARGET = Target.parse("http://127.0.0.1:9/")


def _part(n: int, **kw: float) -> HttpPart:
    """A process's part with `n` successes of 5 ms each."""
    h = LatencyHistogram()
    h.record_us(np.full(n, 5_000, dtype=np.int64))
    return HttpPart(sent=n, ok=n, hist_blob=h.encode(), **kw)  # type: ignore[arg-type]


def test_the_tally_adds_up_every_part() -> None:
    a = Part(sent=10, ok=8, errors_by_kind={"timeout": 1, "status": 1},
             errors_by_status={"503": 1}, warmup_requests=2, connections_opened=3,
             window_start=1.0, last_send=5.0, last_done=5.5, traced=1, trace_ids=["a"])
    b = Part(sent=6, ok=4, errors_by_kind={"reset": 2}, window_start=0.5, last_send=4.0,
             last_done=6.0, stopped_early=True, traced=1, trace_ids=["b"])
    t = Tally.of([a, b])
    assert (t.sent, t.failures, t.connections, t.warmup_requests) == (16, 4, 3, 2)
    assert list(t.errors_by_kind.items()) == [("reset", 2), ("status", 1), ("timeout", 1)]
    assert t.errors_by_status == {"503": 1}
    assert (t.start, t.last_send, t.last_done, t.stopped_early) == (0.5, 5.0, 6.0, True)
    assert (t.traced_requests, t.trace_ids) == (2, ["a", "b"])
    assert t.send_span == 4.5
    assert t.wall(10.0) == 10.0 and t.wall(1.0) == 5.5  # answers came after the sends
    assert t.failure_rate(12) == 0.25


def test_finite_makes_records_strict_json() -> None:
    assert finite({"a": math.nan, "b": [math.inf, 1.0], "c": (2.0,), "d": "x"}) == \
        {"a": None, "b": [None, 1.0], "c": [2.0], "d": "x"}


def test_an_open_level_merges_with_its_rate_and_a_share_with_its_own() -> None:
    plan = LoadPlan(engine=HttpConfig(target=TARGET, requests=[b"x"], mode="open"),
                    rate=100.0, arrival="poisson", duration_s=1.0, cold_start=False)
    part = _part(100, window_start=0.0, last_send=0.99, last_done=1.0, last_due=0.99)
    r = plan.merge([part])
    assert (r.mode, r.offered_rps, r.concurrency, r.arrival) == ("open", 100.0, None, "poisson")
    assert (r.requests, r.successes, r.failure_rate, r.wall_s) == (100, 100, 0.0, 1.0)
    assert r.level() == ("rate", 100.0)
    half = plan.merge([part], offered_rps=50.0, more=WORKERS)
    assert (half.offered_rps, half.level()) == (50.0, ("rate", 50.0))


def test_a_closed_level_merges_with_its_clients() -> None:
    plan = LoadPlan(engine=HttpConfig(target=TARGET, requests=[b"x"], mode="closed",
                                        concurrency=5), requests=11, processes=2,
                    cold_start=False)
    assert [plan.share(i) for i in range(2)] == [(3, 6, None), (2, 5, None)]
    r = plan.merge([_part(6, last_send=1.0, last_done=2.0),
                    _part(5, last_send=1.0, last_done=2.0)])
    assert (r.mode, r.offered_rps, r.concurrency, r.arrival) == ("closed", None, 5, None)
    assert (r.processes, r.requests, r.level()) == (2, 11, ("concurrency", 5.0))
    # 5,000 µs sits in a 4 µs bucket (3 significant digits): quantiles read its top, 5,003.
    assert (r.latency.count, r.latency.p50_ms) == (11, 5.003)


def test_a_schedule_splits_round_robin_and_a_bad_split_is_refused() -> None:
    assert split_list([0.0, 0.1, 0.2, 0.3, 0.4], 2, 1) == [0.1, 0.3]
    with pytest.raises(BadUsageError, match="bad split 2 of 2"):
        split_list([0.0], 2, 2)
