"""`scalelab load --cluster`: two Dask workers vs one, and the merged percentiles vs one process.

Run: .venv/bin/python benchmarks/bench_load_cluster.py [--seconds 3] [--repeats 3]
         [--start-rate 2000] [--step 1.2] [--overload 2.5] [--rate 1000] [--out FILE]

On this machine, with tests/lab/load/servers.py as the target (one asyncio process on 127.0.0.1):
- ceilings: each cluster's sustained open-loop rate against the "fast" server (answers at
  once): a ladder from --start-rate up by --step while the level holds its rate (sent within
  the validity rule's 2% of the schedule) with every request answered (a step not held is
  tried twice); the ceiling is the highest rate held. One worker's ladder runs first and the
  two workers' starts from its ceiling, so every step above it is one the single worker
  could not hold.
- overload: --overload x one worker's ceiling (doubled while one worker still holds it)
  offered to both clusters (interleaved, --repeats times): what each answered per second
  (throughput) and sent per second. A rate one worker cannot hold, so the ratio is the
  generators', not the offer's (an offer both send in full reads 1.00x whatever they could do).
- percentiles: at --rate req/s (both hold it) against the "fixed" server (10 ms service, any
  number in parallel), the merged p50/p99 of a two-worker cluster vs one process (`run_load`
  without --cluster). Target: within 5%.
Two schedulers (one with one worker, one with two) run side by side so the runs interleave
and share the machine's moments; each figure is the median of --repeats.
The workers are `dask worker --nthreads 1 --no-nanny` with Dask's profiler off
(docs/load-cluster.md).
Every process here, servers and workers and this client, shares the machine's cores: on a
2-core box the server and two generators compete, so the ratios are floors.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

sys.path.insert(0, str(ROOT / "src"))
from bench_load import start_server  # noqa: E402  (the same test servers, started the same way)
from scalelab.lab.core.machine import current_machine  # noqa: E402
from scalelab.lab.load.cluster import Cluster  # noqa: E402
from scalelab.lab.load.http.generator import HttpConfig  # noqa: E402
from scalelab.lab.load.http.result import LoadResult  # noqa: E402
from scalelab.lab.load.http.run import LoadPlan, run_load  # noqa: E402
from scalelab.lab.load.send import Target, build_request  # noqa: E402


def dask(procs: list[subprocess.Popen[bytes]], *args: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"),
           "DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED": "False"}
    procs.append(subprocess.Popen(
        [sys.executable, "-c", "import sys; from distributed.cli import dask_" + args[0] +
         " as m; sys.argv[0] = 'dask'; m.main()", *args[1:]],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))


def start_cluster(procs: list[subprocess.Popen[bytes]], tmp: Path, name: str,
                  workers: int) -> Cluster:
    f = tmp / f"{name}.json"
    dask(procs, "scheduler", "--host", "127.0.0.1", "--port", "0", "--scheduler-file", str(f),
         "--dashboard-address", ":0")
    deadline = time.monotonic() + 120
    while not f.exists() or not f.read_text().strip():
        if time.monotonic() > deadline:
            raise SystemExit("dask scheduler did not start in 120 s")
        time.sleep(0.2)
    for _ in range(workers):
        dask(procs, "worker", "--scheduler-file", str(f), "--nthreads", "1", "--no-nanny",
             "--host", "127.0.0.1", "--dashboard-address", ":0")
    c = Cluster(json.loads(f.read_text())["address"])
    c.client.wait_for_workers(workers, timeout=180)
    return c


def level(url: str, rate: float, seconds: float, cluster: Cluster | None) -> LoadResult:
    t = Target.parse(url)
    cfg = HttpConfig(target=t, requests=[build_request(t, method="GET", path=t.path, body=None)],
                       mode="open", warmup_s=1.0)
    return run_load(LoadPlan(engine=cfg, rate=rate, duration_s=seconds, cold_start=False),
                    cluster=cluster)


def summary(r: LoadResult) -> dict[str, Any]:
    return {"sent_rps": r.sent_rps, "throughput_rps": r.throughput_rps,
            "p50_ms": r.latency.p50_ms, "p99_ms": r.latency.p99_ms, "valid": r.valid,
            "lag_p99_ms": r.lag_p99_ms, "errors": r.failures, "connections": r.connections,
            "workers": None if r.cluster is None else [
                {"sent_rps": w.sent_rps, "lag_p99_ms": w.lag_p99_ms,
                 "clock_offset_ms": w.clock_offset_ms,
                 "clock_uncertainty_ms": w.clock_uncertainty_ms} for w in r.cluster.workers]}


def med(runs: list[dict[str, Any]], key: str) -> float:
    return statistics.median(float(x[key]) for x in runs)


def loadavg() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def held(r: LoadResult) -> bool:
    """The level sent its schedule (the validity rule's rate test) and every request was
    answered; lag bunching alone does not count (on a busy machine it flags 100 req/s)."""
    behind = any(x.startswith("generator fell behind") for x in r.invalid_reasons)
    return r.requests > 0 and not behind and r.failures == 0


def ladder(url: str, c: Cluster, start: float, step: float, seconds: float,
           name: str, max_steps: int = 25) -> tuple[float, list[dict[str, Any]]]:
    """The highest rate from `start` up by `step` that `c` holds (0 if not even `start`); a
    step not held is tried once more (a busy machine's moment can stall any one level)."""
    best, rate, steps = 0.0, start, []
    for _ in range(max_steps):
        ok = False
        for attempt in (1, 2):
            r = level(url, rate, seconds, c)
            ok = held(r)
            steps.append({"rate": rate, "attempt": attempt, "held": ok, "loadavg": loadavg()[0],
                          **summary(r)})
            print(f"  {name}: {rate:,.0f} req/s: sent {r.sent_rps:,.0f}, answered "
                  f"{r.throughput_rps:,.0f}/s, {r.failures} failed, lag p99 {r.lag_p99_ms} ms:"
                  f" {'held' if ok else 'NOT held'}", file=sys.stderr)
            if ok:
                break
        if not ok:
            break
        best, rate = rate, rate * step
    return best, steps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--start-rate", type=float, default=2000.0)
    ap.add_argument("--step", type=float, default=1.2)
    ap.add_argument("--overload", type=float, default=2.5)
    ap.add_argument("--rate", type=float, default=1000.0)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    procs: list[subprocess.Popen[bytes]] = []
    servers = []
    res: dict[str, Any] = {"machine": asdict(current_machine()),
                           "loadavg_before": loadavg(), "args": vars(a) | {"out": str(a.out)}}
    try:
        fast, fast_url = start_server("fast")
        fixed, fixed_url = start_server("fixed", "--service-ms", "10")
        servers += [fast, fixed]
        with tempfile.TemporaryDirectory() as tmp:
            one = start_cluster(procs, Path(tmp), "one", 1)
            two = start_cluster(procs, Path(tmp), "two", 2)
            # One unreported level each: the workers' first task imports and sets up.
            for c in (one, two):
                level(fast_url, 100, 1.0, c)
            print(f"ceilings (loadavg {loadavg()[0]:.1f})", file=sys.stderr)
            ceil_one, steps_one = ladder(fast_url, one, a.start_rate, a.step, a.seconds, "one")
            if ceil_one == 0:
                raise SystemExit(f"one worker did not hold even --start-rate {a.start_rate:g}; "
                                 "lower it")
            ceil_two, steps_two = ladder(fast_url, two, ceil_one, a.step, a.seconds, "two")
            res["ceilings"] = {"one": steps_one, "two": steps_two}
            over = ceil_one * a.overload
            # The offer must be one a single worker cannot hold (else both send all of it and
            # the ratio reads 1.00x): if it holds, double it, up to 4 times.
            for _ in range(4):
                probe = level(fast_url, over, a.seconds, one)
                print(f"  overload probe {over:,.0f} req/s: one worker sent "
                      f"{probe.sent_rps:,.0f}: {'held, doubling' if held(probe) else 'not held'}",
                      file=sys.stderr)
                if not held(probe):
                    break
                over *= 2
            peak: dict[str, list[dict[str, Any]]] = {"one": [], "two": []}
            pct: dict[str, list[dict[str, Any]]] = {"single": [], "two": []}
            for i in range(a.repeats):
                print(f"repeat {i + 1}/{a.repeats} (loadavg {loadavg()[0]:.1f})", file=sys.stderr)
                peak["one"].append(summary(level(fast_url, over, a.seconds, one)))
                peak["two"].append(summary(level(fast_url, over, a.seconds, two)))
                pct["single"].append(summary(level(fixed_url, a.rate, a.seconds, None)))
                pct["two"].append(summary(level(fixed_url, a.rate, a.seconds, two)))
            one.close()
            two.close()
    finally:
        for p in [*procs, *servers]:
            p.kill()
            p.wait(timeout=10)
    res["loadavg_after"] = loadavg()
    res["overload"] = peak
    res["percentiles"] = pct
    ratios = {
        "ceiling_one_worker_rps": ceil_one, "ceiling_two_workers_rps": ceil_two,
        "ceiling_ratio": ceil_two / ceil_one, "overload_offered_rps": over,
        "overload_answered_rps_one": med(peak["one"], "throughput_rps"),
        "overload_answered_rps_two": med(peak["two"], "throughput_rps"),
        "overload_sent_rps_one": med(peak["one"], "sent_rps"),
        "overload_sent_rps_two": med(peak["two"], "sent_rps"),
        "p50_single_ms": med(pct["single"], "p50_ms"), "p50_two_ms": med(pct["two"], "p50_ms"),
        "p99_single_ms": med(pct["single"], "p99_ms"), "p99_two_ms": med(pct["two"], "p99_ms"),
        "percentile_levels_valid": [x["valid"] for k in ("single", "two") for x in pct[k]],
    }
    for k in ("answered", "sent"):
        ratios[f"overload_{k}_ratio"] = (ratios[f"overload_{k}_rps_two"]
                                         / max(ratios[f"overload_{k}_rps_one"], 1e-9))
    ratios["p50_ratio"] = ratios["p50_two_ms"] / ratios["p50_single_ms"]
    ratios["p99_ratio"] = ratios["p99_two_ms"] / ratios["p99_single_ms"]
    res["summary"] = ratios
    print(json.dumps(ratios, indent=2))

    def verdict(x: float) -> str:
        return "met" if x >= 1.8 else "MISSED"

    print(f"ceilings (highest rate held, steps of {a.step:g}x): two workers {ceil_two:,.0f} "
          f"req/s vs one {ceil_one:,.0f} req/s = {ratios['ceiling_ratio']:.2f}x (target >= "
          f"1.8x: {verdict(ratios['ceiling_ratio'])})")
    ans, sent = ratios["overload_answered_ratio"], ratios["overload_sent_ratio"]
    print(f"overload {over:,.0f} req/s offered: answered two "
          f"{ratios['overload_answered_rps_two']:,.0f}/s vs one "
          f"{ratios['overload_answered_rps_one']:,.0f}/s = {ans:.2f}x ({verdict(ans)}); "
          f"sent {sent:.2f}x")
    for q in ("p50", "p99"):
        r = ratios[f"{q}_ratio"]
        print(f"{q} at {a.rate:g} req/s: two workers {ratios[f'{q}_two_ms']:.2f} ms vs one "
              f"process {ratios[f'{q}_single_ms']:.2f} ms = {r:.3f} (target within 5%: "
              f"{'met' if abs(r - 1) <= 0.05 else 'MISSED'})")
    print(f"loadavg before {res['loadavg_before']}, after {res['loadavg_after']}")
    if a.out:
        a.out.write_text(json.dumps(res, indent=2, default=str))


if __name__ == "__main__":
    main()
