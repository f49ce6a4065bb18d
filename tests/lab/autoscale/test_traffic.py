"""Traffic curves for the simulator: the built-ins, a `time,rate` CSV and a request trace binned
into its rate curve."""

from __future__ import annotations

from pathlib import Path

import pytest

from scalelab.lab.autoscale.traffic import builtin, read_traffic


def test_builtin_and_csv_traces(tmp_path: Path) -> None:
    d = builtin("diurnal", base=10, peak=100)
    assert d.duration_s == 86400 and min(d.rates) == pytest.approx(10) and max(d.rates) == 100
    s = builtin("spike", base=5, peak=50)
    assert float(s.rate_at(1300.0)) == 50.0 and float(s.rate_at(100.0)) == 5.0
    assert float(builtin("ramp", base=0, peak=60).rate_at(1500.0)) == pytest.approx(30.0)
    f = tmp_path / "t.csv"
    f.write_text("time,rate\n0,10\n1m,20\n")
    tr = read_traffic(f)
    assert tr.times_s == (0.0, 60.0) and float(tr.rate_at(30.0)) == 15.0


def test_autoscale_reads_a_request_trace_as_its_rate_curve(tmp_path: Path) -> None:
    f = tmp_path / "req.csv"
    # 10 requests/s for 200 s, then 30/s for 100 s: 100-ish bins of 3 s.
    times = [i / 10 for i in range(2000)] + [200 + i / 30 for i in range(3000)]
    f.write_text("timestamp\n" + "\n".join(f"{x:.6f}" for x in times) + "\n")
    curve = read_traffic(f)
    assert curve.name == "req"
    assert curve.times_s[0] == pytest.approx(1.5, abs=1e-3)  # first bin's centre (3 s bins)
    assert curve.rates[0] == pytest.approx(10.0) and curve.rates[-1] == pytest.approx(30.0)
    assert curve.rate_at(100.0) == pytest.approx(10.0, rel=0.01)
