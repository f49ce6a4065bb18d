"""The spread between runs (`--noise`): its pooled estimate, the two-sample t interval it gives,
and their error rates on runs drawn from a known random-level model."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from scalelab.lab.compare.calibration import Pooled, Spread, spreads
from scalelab.lab.compare.comparison import compare
from scalelab.lab.compare.sides import run_values
from scalelab.lab.core.records import Record, make_record
from scalelab.lab.load.histogram import LatencyHistogram
from scalelab.lab.load.slices import slice_blobs


def _record(latencies_s: np.ndarray, *, level: float = 1.0, rate: float | None = None,
            ok: bool = True) -> Record:
    """A `load` record of these latencies (completion order), slices included."""
    us = (latencies_s * 1e6).astype(np.int64)
    h = LatencyHistogram()
    h.record_us(us)
    return make_record(experiment="x", stage="load", variable="rate", level=level,
                       latency=h.percentiles().latency(), ok=ok, rate=rate,
                       histograms={"latency": h.encode()}, extras={"samples": h.count},
                       slices={"latency": slice_blobs(us)})


def test_spreads_pool_each_levels_log_squares_and_skip_invalid_runs() -> None:
    """Level 1: rates 100 and 200 (ss (ln 2)²/2, 1 df); level 2: 50, 50, 50 (ss 0, 2 df) and
    an invalid run of 500 left out; level 3: one run, no spread: 3 df over 5 runs."""
    one = np.full(20, 0.010)
    recs = [_record(one, level=1, rate=100), _record(one * 2, level=1, rate=200),
            *(_record(one, level=2, rate=50) for _ in range(3)),
            _record(one, level=2, rate=500, ok=False), _record(one, level=3, rate=7)]
    got = spreads(recs)
    rate = got["rate (per s)"]
    assert (rate.df, rate.runs) == (3, 5) and math.isclose(rate.ss, math.log(2) ** 2 / 2)
    # 10 and 20 ms at level 1, to the histogram's 3 significant digits.
    assert math.isclose(got["latency p50"].ss, math.log(2) ** 2 / 2, rel_tol=1e-3)
    assert math.isclose(got["rate (per s)"].sd, math.log(2) / math.sqrt(6))


def test_pooled_interval_is_the_two_sample_t_on_the_mean_logs() -> None:
    cal = Spread(ss=0.04 * 0.04 * 19, df=19, runs=20)  # sd 4% a run over 19 df
    p = Pooled(a=(10.0,), b=(12.0,), cal=cal)
    half = stats.t.ppf(0.975, 19) * 0.04 * math.sqrt(2)
    lo, hi = p.ratio(0.05)
    assert math.isclose(lo, 1.2 * math.exp(-half)) and math.isclose(hi, 1.2 * math.exp(half))
    # The sides' own repeats join the pool: 2 + 2 runs add 2 df and their squares.
    p2 = Pooled(a=(10.0, 10.0 * math.e ** 0.1), b=(12.0, 12.0), cal=cal)
    assert p2.df == 21 and math.isclose(p2.sd ** 2, (0.04 ** 2 * 19 + 0.1 ** 2 / 2) / 21)


def test_pooled_interval_covers_at_its_nominal_level() -> None:
    """Runs of one setup whose log level is N(0, 0.05²): the 95% interval of one run against
    another, with the spread of 10 other runs, excludes 1 in 5% of 4,000 draws (exact for
    normal logs: the pooled t is t-distributed), and B 20% slower excludes 1 as often as the
    noncentral t says (its power: 63.3%)."""
    rng = np.random.default_rng(11)
    miss = shown = 0
    draws = 4000
    for _ in range(draws):
        x = np.exp(rng.normal(0.0, 0.05, 12))
        cal = Spread(ss=float(((np.log(x[2:]) - np.log(x[2:]).mean()) ** 2).sum()), df=9,
                     runs=10)
        lo, hi = Pooled(a=(x[0],), b=(x[1],), cal=cal).ratio(0.05)
        miss += not lo <= 1.0 <= hi
        shown += Pooled(a=(x[0],), b=(1.2 * x[1],), cal=cal).ratio(0.05)[0] > 1.0
    assert 0.04 < miss / draws < 0.06  # binomial sd 0.34%
    t = stats.t.ppf(0.975, 9)
    nc = math.log(1.2) / (0.05 * math.sqrt(2))
    power = stats.nct.sf(t, 9, nc) + stats.nct.cdf(-t, 9, nc)
    assert abs(power - 0.6325) < 0.0001 and abs(shown / draws - power) < 0.025


def _runs(rng: np.random.Generator, levels: np.ndarray) -> list[Record]:
    """One run a level: 400 latencies lognormal (σ 0.1) about 10 ms × the run's level."""
    return [_record(0.010 * f * rng.lognormal(0.0, 0.1, 400)) for f in levels]


def test_runs_drifting_between_runs_need_the_calibration() -> None:
    """Each run's level is drawn anew (log sd 4%, as measured between 2 s runs on this
    machine) and holds through the run, so its slices cannot see it: without --noise, 30
    same-server pairs at a margin of ±1% show a difference in 6 or more (4× the 5% allowed);
    with 20 calibration
    runs of the same setup, at most 3 (5% family-wise, Holm), and a 20% slower B (runs
    drifting 2%) is worse in at least 27 of 30."""
    rng = np.random.default_rng(4)
    cal = spreads(_runs(rng, np.exp(rng.normal(0.0, 0.04, 20))))
    within = calibrated = 0
    for _ in range(30):
        a, b = _runs(rng, np.exp(rng.normal(0.0, 0.04, 2)))
        within += any(r.decision in ("better", "worse") for r in compare(
            [a], [b], margin=0.01).rows)
        calibrated += any(r.decision in ("better", "worse") for r in compare(
            [a], [b], margin=0.01, noise=cal).rows)
    assert within >= 6 and calibrated <= 3
    cal2 = spreads(_runs(rng, np.exp(rng.normal(0.0, 0.02, 20))))
    worse = 0
    for _ in range(30):
        a, b = _runs(rng, np.exp(rng.normal(0.0, 0.02, 2)) * np.array([1.0, 1.2]))
        c = compare([a], [b], noise=cal2)
        worse += next(r for r in c.rows if r.metric == "latency p50").decision == "worse"
        assert c.rows[0].unit == "runs" and c.rows[0].n_a == 1
    assert worse >= 27


def test_cli_noise_counts_the_spread_and_refuses_records_without_repeats(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from scalelab.cli import run
    from scalelab.lab.core.records import append_records

    rng = np.random.default_rng(2)
    a, b, *cal = _runs(rng, np.exp(rng.normal(0.0, 0.02, 6)) * np.array([1, 1.5, 1, 1, 1, 1]))
    paths = {n: tmp_path / f"{n}.jsonl" for n in ("a", "b", "one", "cal")}
    for n, recs in (("a", [a]), ("b", [b]), ("one", [a]), ("cal", cal)):
        append_records(paths[n], recs)
    args = ["compare", str(paths["a"]), str(paths["b"]), "--json", "--noise"]
    assert run([*args, str(paths["one"])]) == 2
    assert "no level with 2 or more valid runs" in capsys.readouterr().err
    assert run([*args, str(paths["cal"])]) == 0
    doc = json.loads(capsys.readouterr().out)
    p50 = next(r for r in doc["rows"] if r["metric"] == "latency p50")
    assert p50["decision"] == "worse" and p50["unit"] == "runs"
    assert p50["basis"].startswith("between runs: pooled t, run spread ")
    assert p50["basis"].endswith("(3 df, 4 calibration runs), or within runs, the wider")
    assert doc["notes"][0].startswith("intervals over runs count the spread between runs")


def test_runs_smaller_than_the_calibrations_keep_their_own_wider_interval() -> None:
    """Calibration runs of 4,000 latencies spread little between runs; A and B are runs of 250
    (σ 0.3): their p50's own batch-means interval is wider than the pooled t, and it is kept;
    their p95 (2 batches of 100) has no upper bound of its own, and the row says so."""
    rng = np.random.default_rng(9)
    cal = spreads([_record(0.010 * f * rng.lognormal(0.0, 0.1, 4000))
                   for f in np.exp(rng.normal(0.0, 0.005, 10))])
    a, b = (_record(0.010 * rng.lognormal(0.0, 0.3, 250)) for _ in range(2))
    within = {r.metric: r for r in compare([a], [b]).rows}
    both = {r.metric: r for r in compare([a], [b], noise=cal).rows}
    w, p = within["latency p50"], both["latency p50"]
    assert p.basis.endswith("or within runs, the wider") and p.unit == "runs"
    assert (p.lower, p.upper) == (w.lower, w.upper)
    p95 = both["latency p95"]
    assert p95.upper is None and p95.decision == "undecided"
    assert p95.need == ("1 and 1 runs: one run's own p95 is unbounded (too few latencies or "
                        "batches): longer runs")


def test_two_runs_a_side_count_their_own_spread_between_runs() -> None:
    """A's two runs sit 20% apart, B's at 1.25 and 1.3: batch means over the concatenated
    slices (40 batches' worth of df) call B worse; the runs' own spread between runs, 2 df,
    says that 2 runs a side cannot tell, and the interval is the hull of both."""
    rng = np.random.default_rng(1)
    a, b = ([_record(0.010 * f * rng.lognormal(0.0, 0.1, 400)) for f in fs]
            for fs in ((1.0, 1.2), (1.25, 1.3)))
    row = next(r for r in compare(a, b).rows if r.metric == "latency p50")
    assert row.decision == "undecided" and (row.n_a, row.unit) == (2, "runs")
    assert row.basis.startswith("between runs: pooled t over the sides' runs, run spread ")
    assert row.basis.endswith("(2 df), or within runs, the wider")
    runs = [[run_values(r)["latency p50"] for r in side] for side in (a, b)]
    lo, hi = Pooled(a=tuple(runs[0]), b=tuple(runs[1]), cal=Spread(0.0, 0, 0)).ratio(0.05)
    assert (row.lower, row.upper) == (lo, hi)  # the pooled t is the wider here
    merged = [r.model_copy(update={"slices": {}}) for r in a + b]
    assert compare(merged[:2], merged[2:]).rows[0].basis.startswith(
        "between runs: pooled t over the sides' runs")  # no slices: over runs alone
