"""The simulator against hand-computed HPA decisions (hpa drives it, unchanged)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scalelab.cli import run
from scalelab.lab.autoscale.replica_model import ReplicaModel
from scalelab.lab.autoscale.simulator import SimConfig, default_target, simulate
from scalelab.lab.autoscale.traffic import TrafficCurve
from scalelab.lab.core.records import Latency, append_records, make_record
from scalelab.lab.load.slo import parse_slo

SLO = parse_slo("p95<50ms").latency[0]


def _records(path: Path | None = None) -> list:
    lat = Latency(p50_ms=10, p90_ms=12, p95_ms=15, p99_ms=20, p999_ms=25, max_ms=30)
    recs = [make_record(experiment="cap", stage="load", variable="rate", level=lv, rate=lv,
                        latency=lat, extras={"offered_rps": lv, "mean_ms": 11.0, "slo": "p95<50ms"})
            for lv in (50.0, 100.0)]
    # Overloaded: offered 200, served 100 with a growing queue; tells saturation, not the curve.
    recs.append(make_record(experiment="cap", stage="load", variable="rate", level=200.0,
                            rate=100.0, latency=Latency(p50_ms=900, p90_ms=1500, p95_ms=1600,
                                                        p99_ms=1700, p999_ms=1800, max_ms=1900),
                            extras={"offered_rps": 200.0}))
    if path is not None:
        append_records(path, recs)
    return recs


def test_replica_model_from_records() -> None:
    m = ReplicaModel.from_records(_records())
    assert m.saturation_rps == 100.0
    assert m.rates == (50.0, 100.0)  # the overloaded record is not a curve point
    assert m.quantile_ms(75.0, 0.95) == pytest.approx(15.0)
    assert m.bad_fraction(75.0, 15.0) == pytest.approx(0.05)
    assert m.bad_fraction(75.0, 1000.0) == 0.0
    assert m.bad_fraction(75.0, 0.0) == 1.0
    assert m.slo_capacity(SLO) == pytest.approx(99.9, rel=1e-3)
    assert default_target("rps", m, SLO, 0.5) == pytest.approx(49.95, rel=1e-3)
    assert default_target("cpu", m, SLO, 0.7) == 70.0


def test_simulator_reproduces_hand_computed_hpa_decisions() -> None:
    # rps signal, 50 req/s per pod; 2 pods ready at t=0; startup 0; the HPA sees the current
    # second (window 1 s); defaults: sync 15 s, tolerance 0.1, downscale window 300 s,
    # scale-up limit max(2 × current, 4).
    trace = TrafficCurve("hand", (0.0, 59.0, 60.0, 119.0, 120.0, 900.0),
                  (100.0, 100.0, 400.0, 400.0, 100.0, 100.0))
    cfg = SimConfig(signal="rps", target=50.0, slo=SLO, min_replicas=1, max_replicas=10,
                    startup_s=0.0, initial_replicas=2, metric_window_s=1.0)
    res = simulate(trace, ReplicaModel.from_records(_records()), cfg)
    got = [(d.t_s, d.current, d.desired, d.reason) for d in res.decisions]
    assert got == [
        # 400/2 = 200 per pod: ratio 4, proposal 8, limited to max(2×2, 4) = 4.
        (60.0, 2, 4, "ScaleUpLimit"),
        # 400/4 = 100: ratio 2, proposal 8, limit max(2×4, 4) = 8.
        (75.0, 4, 8, "DesiredWithinRange"),
        # From t=120, 100/8 = 12.5: proposal 2, held at 8 by the 8s recommended at 60..105
        # until t=420, the first sync whose 300 s window starts after them.
        (420.0, 8, 2, "DesiredWithinRange"),
    ]
    # Pods start serving the second after they are ready: at t=60 two pods serve 200 of 400
    # (backlog 200); t=61..75 four pods serve exactly 400/s, so the backlog waits 0.5 s;
    # from t=76 eight pods drain it. Violating seconds: t=60..75 = 16.
    assert res.violation_minutes == pytest.approx(16 / 60)
    assert res.violating_requests == pytest.approx(16 * 400.0)
    # Pod-seconds: 2×60 + 4×15 + 8×345 + 2×481 = 3902.
    assert res.replica_hours == pytest.approx(3902 / 3600)
    assert res.oscillations == 1 and res.scale_events == 3 and res.max_replicas == 8


def test_startup_delay_and_cpu_signal() -> None:
    trace = TrafficCurve("step", (0.0, 29.0, 30.0, 600.0), (50.0, 50.0, 150.0, 150.0))
    base = dict(slo=SLO, max_replicas=10, initial_replicas=1, metric_window_s=1.0)
    fast = simulate(trace, ReplicaModel.from_records(_records()),
                    SimConfig(signal="cpu", target=50, startup_s=0.0, **base))
    slow = simulate(trace, ReplicaModel.from_records(_records()),
                    SimConfig(signal="cpu", target=50, startup_s=60.0, **base))
    # 1 pod at 100% (it saturates at 100 req/s) -> ratio 2 -> 2 pods at t=30 ...
    assert fast.decisions[0].t_s == 30.0 and fast.decisions[0].desired == 2
    assert fast.decisions[-1].desired == 3  # 150 req/s at 50% of 100 per pod
    # ... and a minute of startup leaves the first pod overloaded longer.
    assert slow.violation_minutes > fast.violation_minutes
    assert slow.violating_requests > fast.violating_requests



def test_cli_compare_signals(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    recs = tmp_path / "cap.jsonl"
    _records(recs)
    plot = tmp_path / "replicas.png"
    rc = run(["autoscale", "simulate", "--capacity", str(recs), "--trace", "spike",
              "--compare-signals", "--startup", "20s", "--max", "12", "--plot", str(plot),
              "--json"])
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["slo"] == "p95<50ms"  # read from the records
    assert sorted(r["signal"] for r in doc["ranking"]) == ["cpu", "inflight", "queue", "rps"]
    assert [r["rank"] for r in doc["ranking"]] == [1, 2, 3, 4]
    assert all(r["max_replicas"] <= 12 for r in doc["results"])
    assert plot.stat().st_size > 1000


@pytest.mark.parametrize("extra", [
    ["--trace", "weekly"], ["--trace", "spike", "--signal", "gpu"],
    ["--trace", "spike", "--min", "5", "--max", "2"],
    ["--trace", "spike", "--compare-signals", "--target", "3"],
])
def test_cli_bad_input_exits_2(tmp_path: Path, extra: list[str],
                               capsys: pytest.CaptureFixture[str]) -> None:
    recs = tmp_path / "cap.jsonl"
    _records(recs)
    assert run(["autoscale", "simulate", "--capacity", str(recs), *extra]) == 2
    assert capsys.readouterr().err.startswith("error:")
