"""`scalelab load --cluster`: two Dask workers vs one, and the merged percentiles vs one process.

Run: .venv/bin/python benchmarks/bench_load_cluster.py [--seconds 3] [--repeats 3]
         [--peak-rate 30000] [--rate 200] [--out FILE]

On this machine, with tests/load/servers.py as the target (one asyncio process on 127.0.0.1):
- peak: the aggregate open-loop send rate a cluster of one worker and one of two workers
  sustain, offered --peak-rate req/s (far above what one generator sends) at the "fast" server
  (answers at once): the measured sends per second. Target: two workers >= 1.8x one.
- percentiles: at --rate req/s against the "fixed" server (10 ms service, any number in
  parallel), the merged p50/p99 of a two-worker cluster vs one process (`run_load` without
  --cluster) at the same rate. Target: within 5%.
Two schedulers (one with one worker, one with two) run side by side so the runs interleave
(A, B, A, B, ...) and share the machine's moments; each figure is the median of --repeats.
The workers are `dask worker --nthreads 1 --no-nanny` with Dask's profiler off (docs/load.md).
Every process here, servers and workers and this client, shares the machine's cores: on a
2-core box the server and two generators compete, so the peak ratio is a floor.
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
SERVERS = ROOT / "tests" / "load" / "servers.py"

sys.path.insert(0, str(ROOT / "src"))
from scalelab.core.machine import current_machine  # noqa: E402
from scalelab.load.cluster import Cluster  # noqa: E402
from scalelab.load.http.generator import EngineConfig  # noqa: E402
from scalelab.load.http.result import LoadResult  # noqa: E402
from scalelab.load.http.run import LoadPlan, run_load  # noqa: E402
from scalelab.load.send import Target, build_request  # noqa: E402


def start_server(kind: str, *args: str) -> tuple[subprocess.Popen[str], str]:
    p = subprocess.Popen([sys.executable, str(SERVERS), kind, *args], stdout=subprocess.PIPE,
                         text=True)
    assert p.stdout is not None
    line = p.stdout.readline()
    if not line.startswith("PORT "):
        p.kill()
        raise SystemExit(f"server {kind} did not start: {line!r}")
    return p, f"http://127.0.0.1:{int(line.split()[1])}/"


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
    cfg = EngineConfig(target=t, requests=[build_request(t, method="GET", path=t.path, body=None)],
                       mode="open", warmup_s=1.0)
    return run_load(LoadPlan(engine=cfg, rate=rate, duration_s=seconds, cold_start=False),
                    cluster=cluster)


def summary(r: LoadResult) -> dict[str, Any]:
    return {"sent_rps": r.sent_rps, "throughput_rps": r.throughput_rps,
            "p50_ms": r.latency.p50_ms, "p99_ms": r.latency.p99_ms, "valid": r.valid,
            "lag_p99_ms": r.lag_p99_ms, "errors": r.failures,
            "workers": None if r.cluster is None else [
                {"sent_rps": w.sent_rps, "lag_p99_ms": w.lag_p99_ms,
                 "clock_offset_ms": w.clock_offset_ms,
                 "clock_uncertainty_ms": w.clock_uncertainty_ms} for w in r.cluster.workers]}


def med(runs: list[dict[str, Any]], key: str) -> float:
    return statistics.median(float(x[key]) for x in runs)


def loadavg() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--peak-rate", type=float, default=30_000.0)
    ap.add_argument("--rate", type=float, default=200.0)
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
            peak: dict[str, list[dict[str, Any]]] = {"one": [], "two": []}
            pct: dict[str, list[dict[str, Any]]] = {"single": [], "two": []}
            for i in range(a.repeats):
                print(f"repeat {i + 1}/{a.repeats} (loadavg {loadavg()[0]:.1f})", file=sys.stderr)
                peak["one"].append(summary(level(fast_url, a.peak_rate, a.seconds, one)))
                peak["two"].append(summary(level(fast_url, a.peak_rate, a.seconds, two)))
                pct["single"].append(summary(level(fixed_url, a.rate, a.seconds, None)))
                pct["two"].append(summary(level(fixed_url, a.rate, a.seconds, two)))
            one.close()
            two.close()
    finally:
        for p in [*procs, *servers]:
            p.kill()
            p.wait(timeout=10)
    res["loadavg_after"] = loadavg()
    res["peak"] = peak
    res["percentiles"] = pct
    one_rps, two_rps = med(peak["one"], "sent_rps"), med(peak["two"], "sent_rps")
    ratios = {
        "peak_sent_rps_one_worker": one_rps, "peak_sent_rps_two_workers": two_rps,
        "peak_ratio": two_rps / one_rps,
        "p50_single_ms": med(pct["single"], "p50_ms"), "p50_two_ms": med(pct["two"], "p50_ms"),
        "p99_single_ms": med(pct["single"], "p99_ms"), "p99_two_ms": med(pct["two"], "p99_ms"),
    }
    ratios["p50_ratio"] = ratios["p50_two_ms"] / ratios["p50_single_ms"]
    ratios["p99_ratio"] = ratios["p99_two_ms"] / ratios["p99_single_ms"]
    res["summary"] = ratios
    print(json.dumps(ratios, indent=2))
    print(f"peak: two workers {two_rps:,.0f} req/s vs one {one_rps:,.0f} req/s = "
          f"{ratios['peak_ratio']:.2f}x (target >= 1.8x: "
          f"{'met' if ratios['peak_ratio'] >= 1.8 else 'MISSED'})")
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
