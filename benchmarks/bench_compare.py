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
  target: at most 1 of 20 (done-means of issue #48);
- regression: A against B, target: latency p50 worse in every pair.

A run the load tester judged invalid (its generator fell behind: it measured its own lateness)
decides nothing, so the counts come with how many runs were valid. Beside each count, the same
runs under the rule before batch means (order statistics alone,
Holm over the three quantiles), so the change is measured on the same data. --keep DIR saves
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


def decide(work: Path, pairs: int) -> None:
    from scalelab.lab.compare.comparison import compare
    from scalelab.lab.compare.sides import read_side

    null_new = null_old = reg_new = reg_old = reg_valid = 0
    valid = {n: read_side(work / f"{n}.jsonl")[0].ok
             for i in range(pairs) for n in (f"a{i}", f"a2_{i}", f"b{i}")}
    for i in range(pairs):
        a, a2, b = (work / f"{n}.jsonl" for n in (f"a{i}", f"a2_{i}", f"b{i}"))
        same = compare(read_side(a), read_side(a2))
        slow = compare(read_side(a), read_side(b))
        old_same, old_slow = order_statistic_only(a, a2), order_statistic_only(a, b)
        hit = [f"{r.metric} {r.decision} {r.ratio:.3f}" for r in same.rows
               if r.decision in ("better", "worse")]
        null_new += bool(hit)
        null_old += any(d in ("better", "worse") for d in old_same.values())
        p50 = next(r for r in slow.rows if r.metric == "latency p50")
        reg_new += p50.decision == "worse"
        reg_valid += p50.decision == "worse" and valid[f"a{i}"] and valid[f"b{i}"]
        reg_old += old_slow["latency p50"] == "worse"
        same_p50 = next(r for r in same.rows if r.metric == "latency p50")
        print(f"pair {i:2d}: same p50 {same_p50.ratio:.3f} {same_p50.decision:10s} "
              f"{'; '.join(hit) or '-':30s} | 12 ms p50 {p50.ratio:.3f} {p50.decision:10s} "
              f"[{p50.lower:.3f}, {p50.upper}] | before: same {sorted(set(old_same.values()))}"
              f" slow p50 {old_slow['latency p50']}")
    both = [sum(valid[f"a{i}"] and valid[x] for i in range(pairs)
                for x in [(f"a2_{i}" if k == 0 else f"b{i}")]) for k in (0, 1)]
    print(f"\nruns the load tester judged valid: {sum(valid.values())} of {len(valid)}; "
          f"pairs valid on both sides: same server {both[0]}, regression {both[1]}")
    print(f"same server, a difference reported: {null_new} of {pairs} pairs "
          f"(before batch means: {null_old} of {pairs}); target <= {pairs // 20}")
    print(f"12 ms against 10 ms, latency p50 worse: {reg_new} of {pairs} pairs "
          f"(before: {reg_old} of {pairs}); target {pairs} of {pairs}; of the {both[1]} pairs "
          f"valid on both sides: {reg_valid} worse")


def decide_repeats(work: Path, pairs: int, k: int = 3) -> None:
    """The same runs as sides of k repeats (runs as the unit: between-run drift counts)."""
    from scalelab.lab.compare.comparison import compare
    from scalelab.lab.compare.sides import read_side

    def side(prefix: str, idx: range) -> list:
        return [r for i in idx for r in read_side(work / f"{prefix}{i}.jsonl")]

    groups = [range(j, j + k) for j in range(0, pairs - k + 1, k)]
    same = slow = 0
    for g in groups:
        a = side("a", g)
        same += any(r.decision in ("better", "worse") for r in compare(a, side("a2_", g)).rows)
        c = compare(a, side("b", g))
        slow += next(r for r in c.rows if r.metric == "latency p50").decision == "worse"
    print(f"as {k} repeats a side: same server, a difference reported: {same} of "
          f"{len(groups)}; 12 ms against 10 ms, latency p50 worse: {slow} of {len(groups)}")


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
