"""The HPA simulator on `load llm` records: the engine's signals, exact targets, the ranking."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scalelab.cli import run
from scalelab.lab.autoscale.replica_model import ReplicaModel
from scalelab.lab.autoscale.simulator import SimConfig, default_target, simulate
from scalelab.lab.autoscale.traffic import TrafficCurve, builtin
from scalelab.lab.core.errors import BadInputError
from scalelab.lab.core.records import Latency, append_records, make_record
from scalelab.lab.load.slo import parse_slo

SLO = parse_slo("p95<500ms").latency[0]


def _llm_records(path: Path | None = None, *, kv: bool = True) -> list:
    """Closed-loop levels of one replica: served req/s, TTFT percentiles, e2e, KV usage."""
    rows = [  # (streams, served req/s, TTFT p50, e2e mean ms, KV usage)
        (1, 2.0, 100.0, 500.0, 0.10), (4, 6.0, 200.0, 650.0, 0.40), (8, 8.0, 400.0, 1000.0, 0.80)]
    recs = []
    for conc, rps, ttft, e2e, kvu in rows:
        lat = Latency(p50_ms=ttft, p90_ms=ttft * 1.1, p95_ms=ttft * 1.2, p99_ms=ttft * 1.3,
                      p999_ms=ttft * 1.4, max_ms=ttft * 1.5)
        extras: dict = {"throughput_rps": rps, "output_tps": rps * 32, "ttft_mean_ms": ttft,
                        "e2e": {"mean_ms": e2e}, "slo": "ttft_p95<500ms"}
        if kv:
            extras["engine_kv_usage_mean"] = kvu
        recs.append(make_record(experiment="llm", stage="llm", variable="concurrency",
                                level=float(conc), rate=rps * 32, rate_unit="output tokens/s",
                                latency=lat, extras=extras))
    if path is not None:
        append_records(path, recs)
    return recs


def test_replica_model_reads_llm_records() -> None:
    m = ReplicaModel.from_records(_llm_records())
    assert m.rates == (2.0, 6.0, 8.0) and m.saturation_rps == 8.0
    assert m.signals() == ("cpu", "queue", "inflight", "rps", "sequences", "tokens", "kv")
    assert m.tokens_per_request == 32.0
    assert m.e2e_ms(4.0) == pytest.approx(575.0)  # halfway between 500 and 650 ms
    assert m.kv_at(7.0) == pytest.approx(0.6)
    assert m.quantile_ms(6.0, 0.95) == pytest.approx(240.0)  # TTFT p95 at 6 req/s
    lam = 0.5 * min(m.slo_capacity(SLO), m.saturation_rps)
    assert default_target("sequences", m, SLO, 0.5) == pytest.approx(lam * m.e2e_ms(lam) / 1e3)
    assert default_target("tokens", m, SLO, 0.5) == pytest.approx(lam * 32.0)
    assert default_target("kv", m, SLO, 0.5) == float(round(100 * m.kv_at(lam)))
    without = ReplicaModel.from_records(_llm_records(kv=False))
    assert "kv" not in without.signals()
    with pytest.raises(BadInputError, match="--metrics-url"):
        simulate(builtin("spike", base=2.0, peak=16.0), without,
                 SimConfig(signal="kv", target=50.0, slo=SLO))


def test_sequences_signal_scales_a_spike() -> None:
    m = ReplicaModel.from_records(_llm_records())
    tr = TrafficCurve("short-spike", (0.0, 120.0, 180.0, 480.0), (2.0, 2.0, 16.0, 16.0))
    tgt = default_target("sequences", m, SLO, 0.7)
    r = simulate(tr, m, SimConfig(signal="sequences", target=tgt, slo=SLO, startup_s=20.0))
    assert r.max_replicas > 1 and r.scale_events >= 1


def test_cli_ranks_the_llm_signals(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    recs = tmp_path / "llm.jsonl"
    _llm_records(recs)
    trace = tmp_path / "spike.csv"  # ten minutes, a 4x spike in the middle
    trace.write_text("time,rate\n0,4\n3m,4\n4m,16\n6m,16\n7m,4\n10m,4\n")
    rc = run(["autoscale", "simulate", "--capacity", str(recs), "--trace", str(trace),
              "--slo", "p95<500ms", "--compare-signals", "--startup", "20s", "--max", "12",
              "--json"])
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    ranking = doc["ranking"]
    assert sorted(r["signal"] for r in ranking) == [
        "cpu", "inflight", "kv", "queue", "rps", "sequences", "tokens"]
    assert [r["rank"] for r in ranking] == list(range(1, 8))
    # each row is that signal's simulation, and the rows go best first: fewest violating
    # requests (to 0.01% of traffic), then the cheaper
    results = {r["signal"]: r for r in doc["results"]}
    for r in ranking:
        sim = results[r["signal"]]
        assert (r["violating_share"], r["cost"]) == (sim["violating_share"], sim["cost"])
    keys = [(round(r["violating_share"], 4), r["cost"]) for r in ranking]
    assert keys == sorted(keys)
    assert len({k[0] for k in keys}) >= 3  # the trace separates the signals
    # tokens/s is rps times the 32 tokens every request of these records produced: the same
    # signal in other units, so the same replicas and the same violations
    rps, tokens = results["rps"], results["tokens"]
    assert (tokens["violating_share"], tokens["replica_hours"]) == \
           (rps["violating_share"], rps["replica_hours"])
    # CPU utilisation is capped at 100% of a replica, so past saturation it cannot say how far
    # demand went beyond it; every other signal sees the spike's size, and CPU ranks last
    assert ranking[-1]["signal"] == "cpu"
    assert ranking[-1]["violating_share"] > max(r["violating_share"] for r in ranking[:-1])
