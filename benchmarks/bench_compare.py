"""`scalelab compare` on real runs: one server against itself, and a 20% slower server.

Pairs of separate runs of one server (no difference should be reported) and of a server 20%
slower (worse should be reported), on 127.0.0.1.

Run: .venv/bin/python benchmarks/bench_compare.py [--pairs 20] [--seconds 2] [--rate 100]
         [--realtime] [--keep DIR] [--reuse DIR]

Two `tests/lab/load/servers.py fixed` servers, one answering after 10 ms and one after 12 ms
(the added 2 ms: a 20% regression of the service time). For each of --pairs rounds, three
separate `scalelab load` runs (in this process), one after another: A (10 ms), A' (10 ms
again) and B (12 ms), each --seconds at --rate req/s, constant arrivals, 0.2 s warm-up.
Then `compare`:

- same server: A against A', a pair "reports a difference" when any metric is better or worse;
  target: at most 1 of 20;
- regression: A against B, target: latency p50 worse in every pair.

A run the load tester judged invalid (its generator fell behind: it measured its own lateness)
decides nothing, so the counts come with how many runs were valid. Three rules decide the same
runs: order statistics alone (Holm over the three quantiles), batch means within runs (compare
without --noise), and batch means with the spread between runs (compare --noise) calibrated
leave-one-out on the other pairs' runs of the 10 ms server. First, why runs differ: per
quantile, the standard error a run's slices give, their lag-1 autocorrelation, and the spread
between the runs A, A'. --keep DIR saves
the records; --reuse DIR re-decides saved records without running anything. The machine is
shared: the load average is printed at the start and the end.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from scalelab.lab.compare.calibration import spreads
from scalelab.lab.compare.comparison import Comparison, Row, compare
from scalelab.lab.compare.sides import QUANTILES, read_side
from scalelab.lab.core.records import Record

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SERVERS = ROOT / "tests" / "lab" / "load" / "servers.py"


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def start(ms: float) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen([sys.executable, str(SERVERS), "fixed", "--service-ms", f"{ms:g}"],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("PORT "):
        proc.kill()
        raise SystemExit(f"test server did not start: {line!r}")
    return proc, f"http://127.0.0.1:{int(line.split()[1])}"


def load(url: str, out: Path, seconds: float, rate: float, rt: bool) -> None:
    """One `scalelab load` run, in this process (a process start costs ~10 s at load 10)."""
    import contextlib
    import io

    from scalelab.cli import run

    with contextlib.redirect_stdout(io.StringIO()):
        rc = run(["load", url, "--rate", f"{rate:g}", "--arrival", "constant", "--duration",
                  f"{seconds:g}s", "--warmup", "0.2s", "--records", str(out), "--json",
                  *(["--realtime"] if rt else [])])
    if rc not in (0, 1):  # 1: a run the generator judged late still measured
        raise SystemExit(f"scalelab load failed ({rc})")


def collect(work: Path, pairs: int, seconds: float, rate: float, rt: bool) -> None:
    procs = []
    try:
        pa, url_a = start(10)
        procs.append(pa)
        pb, url_b = start(12)
        procs.append(pb)
        for i in range(pairs):
            load(url_a, work / f"a{i}.jsonl", seconds, rate, rt)
            load(url_a, work / f"a2_{i}.jsonl", seconds, rate, rt)
            load(url_b, work / f"b{i}.jsonl", seconds, rate, rt)
            print(f"round {i + 1}/{pairs} done, load {loadavg()}", file=sys.stderr)
    finally:
        for p in procs:
            p.kill()
            p.wait(timeout=10)


def order_statistic_only(a: Path, b: Path) -> dict[str, str]:
    """The rule before batch means: each quantile by order statistics alone, Holm over them."""
    from scalelab.lab.compare.intervals import holm, p_different, p_equivalent, quantile_ratio
    from scalelab.lab.compare.sides import QUANTILES, _merged, read_side

    la, lb = _merged(read_side(a), "latency"), _merged(read_side(b), "latency")
    assert la is not None and lb is not None
    ps, ratios = [], []
    for q in QUANTILES:
        def iv(x: float, q: float = q) -> tuple[float, float]:
            return quantile_ratio(la, lb, q, x)

        ps.append((p_different(iv, 0.05), p_equivalent(iv, 0.05)))
        ratios.append(lb.quantile(q) / la.quantile(q))
    diff = holm([p[0] for p in ps], 0.05)
    equiv = holm([p[1] for p in ps], 0.05)
    out = {}
    for q, d, e, r in zip(QUANTILES, diff, equiv, ratios, strict=True):
        out[f"latency p{q * 100:g}"] = ("equivalent" if e else
                                        ("worse" if r > 1 else "better") if d else "undecided")
    return out


def _decided(c: Comparison) -> list[str]:
    return [f"{r.metric} {r.decision} {r.ratio:.3f}" for r in c.rows
            if r.decision in ("better", "worse")]


def _p50(c: Comparison) -> Row:
    return next(r for r in c.rows if r.metric == "latency p50")


def anatomy(recs: dict[str, list[Record]], pairs: int) -> None:
    """Why separate runs of one server differ: per quantile, the standard error of a run's
    log quantile its own slices give (batch means over the 10 slices), their lag-1
    autocorrelation, and the spread the pairs A, A' actually show."""
    import numpy as np

    from scalelab.lab.load.histogram import LatencyHistogram

    for q in QUANTILES:
        within, lag1, diffs = [], [], []
        for i in range(pairs):
            whole = []
            for n in (f"a{i}", f"a2_{i}"):
                r = recs[n][0]
                v = np.log([LatencyHistogram.decode(b).quantile_ms(q)
                            for b in r.slices["latency"]])
                within.append(float(v.std(ddof=1)) / len(v) ** 0.5)
                x = v - v.mean()
                if (x ** 2).sum() > 0:
                    lag1.append(float((x[1:] * x[:-1]).sum() / (x ** 2).sum()))
                h = LatencyHistogram.decode(r.histograms["latency"])
                whole.append(float(np.log(h.quantile_ms(q))))
            diffs.append(whole[1] - whole[0])
        se, sd = float(np.median(within)), float(np.std(diffs, ddof=1)) / 2 ** 0.5
        print(f"p{q * 100:g}: a run's own slices: se {se * 100:.3g}% (median), lag-1 "
              f"autocorrelation {np.mean(lag1):+.2f}; between runs A, A': {sd * 100:.3g}% a "
              f"run ({sd / se:.3g}x); |log A'/A| > 2 se: "
              f"{sum(abs(d) > 2 * se * 2 ** 0.5 for d in diffs)} of {pairs}")


def decide(work: Path, pairs: int) -> None:
    """Three rules on the same runs: order statistic alone, within-run batch means (main's
    rule before the calibration), and batch means widened by the spread between runs measured
    on the other pairs' runs of the 10 ms server (leave-one-out: pair i's own runs never
    calibrate pair i)."""
    names = [n for i in range(pairs) for n in (f"a{i}", f"a2_{i}", f"b{i}")]
    recs = {n: read_side(work / f"{n}.jsonl") for n in names}
    valid = {n: recs[n][0].ok for n in names}
    anatomy(recs, pairs)
    null = dict.fromkeys(("old", "batch", "new"), 0)
    reg = dict.fromkeys(("old", "batch", "new"), 0)
    for i in range(pairs):
        a, a2, b = recs[f"a{i}"], recs[f"a2_{i}"], recs[f"b{i}"]
        noise = spreads([r for j in range(pairs) if j != i
                         for n in (f"a{j}", f"a2_{j}") for r in recs[n]])
        old_same = order_statistic_only(work / f"a{i}.jsonl", work / f"a2_{i}.jsonl")
        old_slow = order_statistic_only(work / f"a{i}.jsonl", work / f"b{i}.jsonl")
        batch_same, batch_slow = compare(a, a2), compare(a, b)
        same, slow = compare(a, a2, noise=noise), compare(a, b, noise=noise)
        null["old"] += any(d in ("better", "worse") for d in old_same.values())
        null["batch"] += bool(_decided(batch_same))
        null["new"] += bool(_decided(same))
        reg["old"] += old_slow["latency p50"] == "worse"
        reg["batch"] += _p50(batch_slow).decision == "worse"
        reg["new"] += _p50(slow).decision == "worse"
        p50 = _p50(slow)
        print(f"pair {i:2d}: same p50 {_p50(same).ratio:.3f} "
              f"{'; '.join(_decided(same)) or '-':24s}| batch only: "
              f"{'; '.join(_decided(batch_same)) or '-':24s}| 12 ms p50 {p50.ratio:.3f} "
              f"[{p50.lower:.3f}, {p50.upper:.3f}] {p50.decision} (batch only: "
              f"{_p50(batch_slow).decision})")
    both = [sum(valid[f"a{i}"] and valid[x] for i in range(pairs)
                for x in [(f"a2_{i}" if k == 0 else f"b{i}")]) for k in (0, 1)]
    print(f"\nruns the load tester judged valid: {sum(valid.values())} of {len(valid)}; "
          f"pairs valid on both sides: same server {both[0]}, regression {both[1]}")
    for k, what in (("old", "order statistic alone"), ("batch", "batch means (within runs)"),
                    ("new", "batch means + spread between runs (--noise, leave-one-out)")):
        print(f"{what}: same server, a difference reported: {null[k]} of {pairs} pairs "
              f"(target <= {pairs // 20}); 12 ms against 10 ms, p50 worse: {reg[k]} of {pairs}")


def decide_repeats(work: Path, pairs: int, k: int = 3) -> None:
    """The same runs as sides of k repeats (runs as the unit: between-run drift counts), with
    Welch's t alone and with the other groups' runs as calibration (pooled t)."""
    def side(prefix: str, idx: range) -> list[Record]:
        return [r for i in idx for r in read_side(work / f"{prefix}{i}.jsonl")]

    groups = [range(j, j + k) for j in range(0, pairs - k + 1, k)]
    same = slow = same_cal = slow_cal = 0
    for g in groups:
        a = side("a", g)
        rest = [i for i in range(pairs) if i not in g]
        noise = spreads([r for i in rest for p in ("a", "a2_")
                         for r in read_side(work / f"{p}{i}.jsonl")])
        same += bool(_decided(compare(a, side("a2_", g))))
        slow += _p50(compare(a, side("b", g))).decision == "worse"
        same_cal += bool(_decided(compare(a, side("a2_", g), noise=noise)))
        slow_cal += _p50(compare(a, side("b", g), noise=noise)).decision == "worse"
    print(f"as {k} repeats a side, Welch: same server differs {same} of {len(groups)}, "
          f"12 ms p50 worse {slow} of {len(groups)}; pooled with the other runs' spread: "
          f"differs {same_cal} of {len(groups)}, worse {slow_cal} of {len(groups)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pairs", type=int, default=20)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--rate", type=float, default=100.0)
    ap.add_argument("--realtime", action="store_true",
                    help="Run the generator in SCHED_FIFO (load --realtime; root or "
                         "CAP_SYS_NICE): on-time sends on a busy machine.")
    ap.add_argument("--keep", type=Path, help="Save the records in DIR.")
    ap.add_argument("--reuse", type=Path, help="Decide the records saved in DIR; run nothing.")
    a = ap.parse_args()
    print(f"load average at start: {loadavg()} (shared 2-core machine)")
    t0 = time.monotonic()
    if a.reuse is not None:
        decide(a.reuse, a.pairs)
        decide_repeats(a.reuse, a.pairs)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            work = a.keep or Path(tmp)
            work.mkdir(parents=True, exist_ok=True)
            collect(work, a.pairs, a.seconds, a.rate, a.realtime)
            decide(work, a.pairs)
            decide_repeats(work, a.pairs)
    print(f"load average at end: {loadavg()}; {time.monotonic() - t0:.0f} s")


if __name__ == "__main__":
    main()
