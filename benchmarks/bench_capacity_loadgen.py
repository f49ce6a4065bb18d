"""`scalelab load capacity` against MLPerf LoadGen's Server scenario on a server of known capacity.

    .venv/bin/python benchmarks/bench_capacity_loadgen.py [--repeats 1] [--confirm 30s]
        [--loadgen-seconds 15] [--start 40]

The server: tests/lab/load/servers.py `queue` with a 10 ms service time, one request at a time
(a serial section on a virtual clock, so timer jitter does not accumulate): capacity exactly
100 req/s, and at p99 <= 200 ms under Poisson arrivals (M/D/1) the edge lies near 88-90 req/s.
Both sides: p99 <= 200 ms, Poisson arrivals, the same request bytes.

- scalelab: `load capacity --slo "p99<200ms" --arrival poisson --start 40` with its defaults
  (steps sized for p99, steady-state tests, the 30 s confirmation of the answer); the figure is
  the confirmed capacity, printed beside the search's own answer.
- LoadGen (mlcommons-loadgen 6.0.17 in benchmarks/.venvs/loadgen, created on first use; never a
  project dependency): PerformanceOnly Server runs of --loadgen-seconds and at least 1,164
  queries each (`bench_load.LOADGEN_WORKER`). A coarse search (doubling from --start, then
  bisection to 5%) finds the bracket, then a ladder with steps of 1% of the rate climbs from the
  highest VALID rate to the first INVALID one: LoadGen's capacity is the highest VALID rung.

Prints both, the ratio (ours / LoadGen) and the load average before and after each search; the
raw numbers land in benchmarks/out/capacity-loadgen.json. Tools alternate who goes first each
repeat; each search starts on a server warmed for 5 s at the start rate.
"""

from __future__ import annotations

import argparse
import base64
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_load import (  # noqa: E402
    LOADGEN_VENV,
    LOADGEN_WORKER,
    ROOT,
    fmt,
    loadavg,
    loadgen_python,
    start_server,
    warm,
)
from scalelab.lab.load.capacity import step_requests  # noqa: E402
from scalelab.lab.load.http import payloads  # noqa: E402
from scalelab.lab.load.send import Target  # noqa: E402

SLO_MS, PCT = 200.0, 0.99
LADDER_STEP = 0.01
"""The fine ladder's step, as a share of the rate (the issue asks for <= 1%)."""
WORKER_NEEDS = "numpy==2.4.6"
"""The LoadGen worker sends with scalelab's own HTTP connection, whose imports need numpy
(the version in constraints.txt)."""


def loadgen_env() -> Path | None:
    """benchmarks/.venvs/loadgen with LoadGen and what the worker imports (created once)."""
    py = loadgen_python()
    if py is not None and subprocess.run([str(py), "-c", "import numpy"],
                                         capture_output=True).returncode != 0:
        subprocess.run([str(LOADGEN_VENV / "bin" / "pip"), "install", "-q", WORKER_NEEDS],
                       check=True, timeout=900)
    return py


def loadgen_run(py: Path, url: str, reqs_file: Path, qps: float, *, seconds: float,
                outdir: Path, seed: int) -> dict[str, Any]:
    """One LoadGen Server run at `qps`; its summary's verdict and figures."""
    outdir.mkdir(parents=True, exist_ok=True)
    arg = {"src": str(ROOT / "src"), "url": url, "requests": str(reqs_file), "qps": qps,
           "latency_ms": SLO_MS, "percentile": PCT, "seconds": seconds, "seed": seed,
           "outdir": str(outdir), "min_queries": step_requests(PCT, 0.95)}
    p = subprocess.run([str(py), "-c", LOADGEN_WORKER, json.dumps(arg)], capture_output=True,
                       text=True, timeout=seconds * 10 + 120)
    if p.returncode != 0:
        raise SystemExit(f"LoadGen run failed: {p.stderr[-2000:]}")
    r: dict[str, Any] = json.loads(p.stdout.strip().splitlines()[-1])
    r["qps"] = qps
    print(f"   loadgen {qps:7.2f} QPS: {'VALID' if r['valid'] else 'INVALID'}, p99 "
          f"{r['p_ms']:.1f} ms, completed {r['completed_qps'] or 0:.1f}/s")
    return r


def loadgen_ladder(py: Path, url: str, reqs_file: Path, *, start: float, seconds: float,
                   work: Path) -> dict[str, Any]:
    """Coarse bracket (doubling, bisection to 5%), then the 1% ladder up from its VALID end."""
    runs: list[dict[str, Any]] = []

    def valid(qps: float) -> bool:
        runs.append(loadgen_run(py, url, reqs_file, qps, seconds=seconds,
                                outdir=work / f"lg{len(runs)}", seed=1000 + len(runs)))
        return bool(runs[-1]["valid"])

    t0 = time.monotonic()
    lo: float | None = None
    hi: float | None = None
    rate = start
    while rate < 10_000:
        if valid(rate):
            lo, rate = rate, rate * 2
        else:
            hi = rate
            break
    while lo is None and hi is not None and hi > start / 16:
        rate = hi / 2
        if valid(rate):
            lo = rate
        else:
            hi = rate
    while lo is not None and hi is not None and (hi - lo) / lo > 0.05:
        mid = (lo + hi) / 2
        if valid(mid):
            lo = mid
        else:
            hi = mid
    best = lo
    if lo is not None:
        step = lo * LADDER_STEP
        rung = lo + step
        while hi is None or rung < hi:
            if not valid(round(rung, 2)):
                hi = round(rung, 2)
                break
            best, rung = round(rung, 2), rung + step
    return {"capacity_rps": best, "first_invalid": hi, "ladder_step": LADDER_STEP,
            "runs": runs, "wall_s": time.monotonic() - t0}


def ours(url: str, *, start: float, confirm: str, realtime: bool) -> dict[str, Any]:
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-c", "from scalelab.cli import main; main()", "load",
                        "capacity", url, "--slo", f"p99<{SLO_MS:g}ms", "--arrival", "poisson",
                        "--start", str(start), "--confirm", confirm, "--json",
                        *(["--realtime"] if realtime else [])],
                       capture_output=True, text=True, timeout=3600)
    if p.returncode not in (0, 1):
        raise SystemExit(f"scalelab load capacity failed: {p.stderr[-2000:]}")
    doc = json.loads(p.stdout)
    for st in doc["steps"]:
        steady = st["steady"] or {}
        held = steady.get("rate_held") and not steady.get("trending")
        print(f"   scalelab {st['rate']:7.2f} req/s{' (confirm)' if st['confirmation'] else ''}"
              f": {st['verdict']:<15} p99 {st['quantile_ms'] or 0:.1f} ms, {st['requests']} "
              f"requests, served {steady.get('served_rps') or 0:.1f}/s, "
              f"{'steady' if held else 'NOT steady'}"
              f", {'valid' if st['valid'] else 'INVALID'}")
        for why in st["extras"]["invalid_reasons"] + st["extras"]["why"]:
            print(f"      {why}")
    return {"capacity_rps": doc["capacity_rps"], "confirmed_rps": doc["confirmed_rps"],
            "interval_rps": doc["interval_rps"], "answer": doc["answer"],
            "steps": doc["steps"], "wall_s": time.monotonic() - t0}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--start", type=float, default=40.0)
    ap.add_argument("--confirm", default="30s", help="our confirmation run's length")
    ap.add_argument("--loadgen-seconds", type=float, default=15.0)
    ap.add_argument("--realtime", action="store_true",
                    help="our generator in SCHED_FIFO (`load capacity --realtime`): on a busy "
                         "machine a normal-priority generator cannot offer ~90 req/s of Poisson "
                         "arrivals unbunched, and the search stops at its ceiling")
    a = ap.parse_args()
    py = loadgen_env()
    if py is None:
        raise SystemExit("LoadGen is not installed and could not be; see the note above")
    out: dict[str, Any] = {"loadavg_before": loadavg(), "repeats": [],
                           "realtime": a.realtime}
    print(f"capacity for p99 <= {SLO_MS:g} ms, Poisson, 10 ms serial server (100 req/s); "
          f"load average {loadavg()}")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        srv, url = start_server("queue", "--service-ms", "10")
        try:
            target = Target.parse(url)
            reqs = payloads.encode(target, payloads.plain_get(target))
            rf = tmp / "reqs.txt"
            rf.write_text("\n".join(base64.b64encode(r).decode() for r in reqs))
            for rep in range(a.repeats):
                res: dict[str, Any] = {}
                for who in (["ours", "loadgen"] if rep % 2 == 0 else ["loadgen", "ours"]):
                    warm(target, reqs, a.start, 5.0)
                    before = loadavg()
                    print(f"  repeat {rep + 1}: {who}, load average {before}")
                    res[who] = (ours(url, start=a.start, confirm=a.confirm, realtime=a.realtime)
                                if who == "ours"
                                else loadgen_ladder(py, url, rf, start=a.start,
                                                    seconds=a.loadgen_seconds,
                                                    work=tmp / f"rep{rep}"))
                    res[who]["loadavg"] = [before, loadavg()]
                out["repeats"].append(res)
        finally:
            srv.kill()
            srv.wait(timeout=10)
    out["loadavg_after"] = loadavg()
    print(f"\n{'repeat':<8}{'scalelab confirmed':>20}{'(searched)':>12}{'LoadGen VALID':>15}"
          f"{'ratio':>8}{'load avg (ours / LG)':>26}")
    ratios = []
    for i, res in enumerate(out["repeats"]):
        o, lg = res["ours"], res["loadgen"]
        ratio = (o["confirmed_rps"] / lg["capacity_rps"]) if o["confirmed_rps"] and \
            lg["capacity_rps"] else None
        ratios.append(ratio)
        print(f"{i + 1:<8}{fmt(o['confirmed_rps'], 2):>20}{fmt(o['capacity_rps'], 2):>12}"
              f"{fmt(lg['capacity_rps'], 2):>15}{fmt(ratio, 3):>8}"
              f"{str(o['loadavg'][0][0]) + ' / ' + str(lg['loadavg'][0][0]):>26}")
    got = [r for r in ratios if r is not None]
    if got:
        print(f"ratio median {statistics.median(got):.3f} over {len(got)} repeat(s); the machine "
              "is shared: these are a busy machine's figures")
    dest = ROOT / "benchmarks" / "out"
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "capacity-loadgen.json").write_text(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    main()
