"""Scale to zero: cold-start accounting (pure) and the simulator and CLI at min replicas 0,
against hand-computed HPA decisions on a synthetic trace."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scalelab.cli import run
from scalelab.lab.autoscale.coldstart import cold_start, weighted_quantile
from scalelab.lab.autoscale.replica_model import ReplicaModel
from scalelab.lab.autoscale.simulator import SimConfig, scale_to_zero, simulate
from scalelab.lab.autoscale.traffic import TrafficCurve
from scalelab.lab.core.errors import BadUsageError
from scalelab.lab.core.records import Latency, append_records, make_record, read_records
from scalelab.lab.load.slo import parse_slo

SLO = parse_slo("p95<50ms").latency[0]


def _records(path: Path | None = None) -> list:
    lat = Latency(p50_ms=10, p90_ms=12, p95_ms=15, p99_ms=20, p999_ms=25, max_ms=30)
    recs = [make_record(experiment="cap", stage="load", variable="rate", level=lv, rate=lv,
                        latency=lat, extras={"offered_rps": lv, "mean_ms": 11.0,
                                             "slo": "p95<50ms"})
            for lv in (50.0, 100.0)]
    if path is not None:
        append_records(path, recs)
    return recs


def test_cold_start_waits_are_weighted_by_requests() -> None:
    # t=0: 2 requests wait until t=2 (2 s); t=3: 4 requests wait until t=6 (3 s); t=7 and t=8:
    # no replica is ready again before the end, so they are unserved, not given a wait.
    cs = cold_start([2, 0, 0, 4, 0, 0, 0, 1, 1, 0], [0, 0, 1, 0, 0, 0, 1, 0, 0, 0])
    assert (cs.requests, cs.episodes, cs.zero_seconds, cs.unserved) == (8, 3, 8, 2)
    # Of 6 waited requests, 2 at 2 s and 4 at 3 s: the 3rd (p50) and 6th (p99) wait 3 s.
    assert (cs.added_p50_ms, cs.added_p99_ms, cs.added_max_ms) == (3000.0, 3000.0, 3000.0)
    assert weighted_quantile([2.0, 3.0], [2, 4], 0.3) == 2.0
    warm = cold_start([5, 5], [1, 1])
    assert (warm.requests, warm.episodes, warm.added_p50_ms) == (0, 0, None)
    with pytest.raises(ValueError, match="one entry per second"):
        cold_start([1], [1, 1])


def test_scale_from_zero_on_an_external_metric() -> None:
    # 0 req/s until t=99, 100 req/s for t=100..399, then 0 to t=1200. rps as one External
    # value, AverageValue 50 per pod; sync every 15 s (t=0, 15, ..., 105, ...); window 1 s;
    # start-up 20 s. At t=105 the HPA sees 100 req/s and no pod: ceil(100 / 50) = 2 pods,
    # ready at t=125. Requests of t=100..124 (25 s × 100) wait 25 s down to 1 s.
    trace = TrafficCurve("zero", (0.0, 99.0, 100.0, 399.0, 400.0, 1200.0),
                  (0.0, 0.0, 100.0, 100.0, 0.0, 0.0))
    model = ReplicaModel.from_records(_records())
    cfg = SimConfig(signal="rps", target=50.0, slo=SLO, min_replicas=0, max_replicas=10,
                    startup_s=20.0, initial_replicas=0, metric_window_s=1.0, external=True,
                    price_per_replica_hour=3.6)
    zero = simulate(trace, model, cfg)
    got = [(d.t_s, d.current, d.desired) for d in zero.decisions]
    # Down to 0 at t=705, the first sync whose 300 s window no longer holds the 2 of t=390.
    assert got == [(105.0, 0, 2), (705.0, 2, 0)]
    cs = zero.cold_start
    assert cs is not None
    assert (cs.requests, cs.episodes, cs.unserved) == (2500.0, 1, 0.0)
    # Waits 1..25 s, 100 requests each: the 1,250th is 13 s, the 2,475th 25 s.
    assert (cs.added_p50_ms, cs.added_p99_ms, cs.added_max_ms) == (13000.0, 25000.0, 25000.0)
    # Replica-seconds: 2 pods for t=105..704 = 1200. At min 1: 1 pod t=0..104, 2 for
    # t=105..704, 1 for t=705..1200 = 105 + 1200 + 496 = 1801.
    import dataclasses

    one = simulate(trace, model, dataclasses.replace(cfg, min_replicas=1))
    assert one.cold_start is not None and one.cold_start.requests == 0
    z = scale_to_zero(zero, one, 3.6)
    assert (z["replica_seconds_min0"], z["replica_seconds_min1"]) == pytest.approx((1200, 1801))
    assert z["replica_seconds_saved"] == pytest.approx(601.0)
    assert z["cost_saved"] == pytest.approx(0.601)  # 601 s at 3.6 per replica-hour
    # No pod ready for t=0..124 (the two start for 20 s) and t=706..1200 (the sync at 705 saw
    # them ready, then removed them).
    assert z["zero_seconds"] == 125 + 495 and z["cold_requests"] == 2500.0


@pytest.mark.parametrize(("kw", "match"), [
    ({"min_replicas": 0}, "needs --external"),
    ({"signal": "cpu", "target": 60.0, "external": True}, "not cpu"),
])
def test_scale_to_zero_needs_an_external_metric(kw: dict, match: str) -> None:
    base = {"signal": "queue", "target": 1.0, "slo": SLO, **kw}
    with pytest.raises(BadUsageError, match=match):
        SimConfig(**base)


def test_cli_min_zero_reports_cold_starts(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    recs = tmp_path / "cap.jsonl"
    _records(recs)
    tr = tmp_path / "t.csv"
    tr.write_text("time,rate\n0,0\n99,0\n100,100\n399,100\n400,0\n1200,0\n")
    argv = ["autoscale", "simulate", "--capacity", str(recs), "--trace", str(tr), "--signal",
            "rps", "--target", "50", "--startup", "20s", "--metric-window", "1s"]
    # a replica of 75 cores at the table's $0.048 per core-hour costs $3.6 an hour
    assert run([*argv, "--min", "0", "--external", "--replica-cores", "75", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    z = doc["scale_to_zero"][0]
    assert doc["price"]["replica_hour_usd"] == pytest.approx(3.6)
    assert z["cost_saved"] == pytest.approx(0.601)  # 601 s at $3.6 a replica-hour
    assert (doc["startup_s"], doc["startup_measured"]) == (20.0, False)
    assert (z["cold_requests"], z["added_p50_ms"], z["added_p99_ms"]) == (2500.0, 13000.0,
                                                                          25000.0)
    assert z["replica_seconds_saved"] == pytest.approx(601.0)
    assert doc["results"][0]["cold_start"]["episodes"] == 1
    assert run([*argv, "--min", "0", "--external"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "2500 requests met no ready replica in 1 cold start(s)" in out
    # the table from a scalelab.yaml's prices: section; the records' machine gives the cores
    cfg = tmp_path / "scalelab.yaml"
    cfg.write_text("prices:\n  core_hour_usd: 1.5\nstages: {}\n")
    assert run([*argv, "--prices", str(cfg), "--json"]) == 0
    cores = read_records(recs)[0].machine.cores
    assert json.loads(capsys.readouterr().out)["price"]["replica_hour_usd"] == \
        pytest.approx(1.5 * cores)
    cfg.write_text("prices:\n  core_hour_usd: cheap\n")
    assert run([*argv, "--prices", str(cfg)]) == 2
    assert "core_hour_usd" in capsys.readouterr().err
    assert run([*argv, "--min", "0"]) == 2
    assert "needs --external" in capsys.readouterr().err
    assert run([*argv[:-4], "--startup", "measure"]) == 2
    assert "--model-repo" in capsys.readouterr().err
