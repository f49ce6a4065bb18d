"""scalelab's load generator vs wrk and Locust on the same trivial endpoints, in one run.

Run: .venv/bin/python benchmarks/bench_load.py [--seconds 5] [--connections 50] [--repeats 3]
                                               [--out FILE]

Two endpoints, both tests/load/servers.py (one asyncio process on 127.0.0.1):
- "fast" answers at once: the most requests/s each generator sustains (closed loop, N
  connections/users, no think time). The server shares the 2 cores with the generator, so
  every figure is a floor and the server may be the limit for the fastest generators.
- "fixed" answers after 10 ms: latency percentiles at a rate every tool holds (closed loop,
  10 connections ~ 1,000 req/s), where percentiles should be the server's 10 ms plus loopback.
wrk is Debian's wrk 4.1 (apt-get install wrk; skipped with a note when absent): closed loop
only (wrk2's fixed-rate mode is not packaged), so the percentile comparison is closed loop at
the same concurrency for all three. Locust (FastHttpUser, headless, one process) lives in
benchmarks/.venvs/locust, created here on first use, never a project dependency.
Each measurement is repeated (--repeats, tools interleaved so they share the machine's
moments) and the median is reported: on a shared 2-core box single runs swing by 2x or more.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SERVERS = ROOT / "tests" / "load" / "servers.py"
LOCUST_VENV = HERE / ".venvs" / "locust"
LOCUST_REQ = "locust==2.47.0"

sys.path.insert(0, str(ROOT / "src"))
from scalelab.core.machine import current_machine  # noqa: E402
from scalelab.load.connection import Target, build_request  # noqa: E402
from scalelab.load.generator import EngineConfig  # noqa: E402
from scalelab.load.multiproc import LoadPlan, run_load  # noqa: E402


def start_server(kind: str, *args: str) -> tuple[subprocess.Popen[str], str]:
    p = subprocess.Popen([sys.executable, str(SERVERS), kind, *args], stdout=subprocess.PIPE,
                         text=True)
    assert p.stdout is not None
    line = p.stdout.readline()
    if not line.startswith("PORT "):
        p.kill()
        raise SystemExit(f"server {kind} did not start: {line!r}")
    return p, f"http://127.0.0.1:{int(line.split()[1])}/"


def ours(url: str, conc: int, seconds: float, processes: int = 1) -> dict[str, Any]:
    t = Target.parse(url)
    cfg = EngineConfig(target=t, requests=[build_request(t, method="GET", path=t.path, body=None)],
                       mode="closed", concurrency=conc, warmup_s=1.0)
    r = run_load(LoadPlan(engine=cfg, duration_s=seconds, processes=processes, cold_start=False))
    lat = r.latency
    return {"rps": r.throughput_rps, "p50": lat.p50_ms, "p90": lat.p90_ms, "p99": lat.p99_ms,
            "errors": r.failures}


def ours_open(url: str, rate: float, seconds: float, processes: int) -> dict[str, Any]:
    t = Target.parse(url)
    cfg = EngineConfig(target=t, requests=[build_request(t, method="GET", path=t.path, body=None)],
                       mode="open", warmup_s=1.0)
    r = run_load(LoadPlan(engine=cfg, rate=rate, duration_s=seconds, processes=processes,
                          cold_start=False))
    return {"offered": rate, "rps": r.throughput_rps, "sent_rps": r.sent_rps,
            "lag_share": r.lag_share, "valid": r.valid, "p50": r.latency.p50_ms,
            "p99": r.latency.p99_ms}


_UNIT = {"us": 1e-3, "ms": 1.0, "s": 1e3}


def wrk(url: str, conc: int, seconds: float) -> dict[str, Any] | None:
    exe = shutil.which("wrk")
    if exe is None:
        print("note: wrk not installed (apt-get install wrk); skipped")
        return None
    out = subprocess.run([exe, "-t1", f"-c{conc}", f"-d{int(seconds)}s", "--latency", url],
                         capture_output=True, text=True, timeout=seconds + 60).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    pct = {m.group(1): float(m.group(2)) * _UNIT[m.group(3)]
           for m in re.finditer(r"^\s+(\d+)%\s+([\d.]+)(us|ms|s)\s*$", out, re.M)}
    errs = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return {"rps": rps, "p50": pct.get("50"), "p90": pct.get("90"), "p99": pct.get("99"),
            "errors": int(errs.group(1)) if errs else 0}


LOCUSTFILE = textwrap.dedent("""
    from locust import FastHttpUser, constant, task

    class User(FastHttpUser):
        wait_time = constant(0)

        @task
        def get(self):
            self.client.get("/")
""")


def locust_bin() -> Path | None:
    exe = LOCUST_VENV / "bin" / "locust"
    if exe.exists():
        return exe
    print(f"creating {LOCUST_VENV} with {LOCUST_REQ} (first run only) ...")
    try:
        subprocess.run([sys.executable, "-m", "venv", str(LOCUST_VENV)], check=True)
        subprocess.run([str(LOCUST_VENV / "bin" / "pip"), "install", "-q", LOCUST_REQ],
                       check=True, timeout=900)
    except (subprocess.SubprocessError, OSError) as e:
        print(f"note: could not install Locust ({e}); skipped")
        return None
    return exe if exe.exists() else None


def locust(url: str, users: int, seconds: float) -> dict[str, Any] | None:
    exe = locust_bin()
    if exe is None:
        return None
    with tempfile.TemporaryDirectory() as d:
        lf = Path(d) / "locustfile.py"
        lf.write_text(LOCUSTFILE)
        prefix = str(Path(d) / "s")
        subprocess.run([str(exe), "-f", str(lf), "--headless", "-u", str(users), "-r",
                        str(users), "-t", f"{int(seconds + 1)}s", "-H", url.rstrip("/"),
                        "--csv", prefix, "--only-summary", "--loglevel", "ERROR"],
                       capture_output=True, text=True, timeout=seconds + 120)
        with open(prefix + "_stats.csv", newline="") as f:
            row = next(r for r in csv.DictReader(f) if r["Name"] == "Aggregated")
    num = float
    return {"rps": num(row["Requests/s"]), "p50": num(row["50%"]), "p90": num(row["90%"]),
            "p99": num(row["99%"]), "errors": int(row["Failure Count"])}


def median_run(fns: dict[str, Any], repeats: int) -> dict[str, dict[str, Any] | None]:
    """Run every tool `repeats` times, interleaved; per tool the median of each number."""
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            r = fn()
            if r is not None:
                runs[name].append(r)
    out: dict[str, dict[str, Any] | None] = {}
    for name, rs in runs.items():
        out[name] = None if not rs else {
            k: statistics.median([r[k] for r in rs if r[k] is not None] or [0.0])
            for k in rs[0]} | {"runs": [r["rps"] for r in rs]}
    return out


def fmt(v: Any, nd: int = 1) -> str:
    return "-" if v is None else (f"{v:,.{nd}f}" if isinstance(v, float) else str(v))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--connections", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=HERE / "out" / "bench_load.json")
    a = ap.parse_args()
    m = current_machine()
    print(f"machine: {m.cores} cores, {m.memory_bytes / 2**30:.0f} GiB, {m.device}; "
          f"load average {Path('/proc/loadavg').read_text().split()[:3]}")
    res: dict[str, Any] = {"machine": {"cores": m.cores, "device": m.device},
                           "seconds": a.seconds, "connections": a.connections}
    fast, fast_url = start_server("fast")
    fixed, fixed_url = start_server("fixed", "--service-ms", "10")
    try:
        c = a.connections
        print(f"\n1) max sustained rate, trivial endpoint, closed loop, {c} connections/users")
        secs = a.seconds
        peak = median_run({
            "scalelab": lambda: ours(fast_url, c, secs),
            "scalelab (2 processes)": lambda: ours(fast_url, c, secs, processes=2),
            "wrk": lambda: wrk(fast_url, c, secs),
            "locust": lambda: locust(fast_url, c, secs)}, a.repeats)
        assert peak["scalelab"] is not None
        best = peak["scalelab"]["rps"]
        rate = round(0.5 * best, -2)
        peak_open = ours_open(fast_url, rate, a.seconds, processes=1)
        res["max_rate"] = peak
        res["open_loop_at_half_max"] = peak_open
        loc = peak["locust"]
        w = peak["wrk"]
        print(f"{'generator':<24}{'req/s':>12}{'vs locust':>11}{'vs wrk':>9}{'errors':>8}"
              "  runs")
        for name, r in peak.items():
            if r is None:
                print(f"{name:<24}{'skipped':>12}")
                continue
            vs_l = r["rps"] / loc["rps"] if loc else None
            vs_w = r["rps"] / w["rps"] if w else None
            print(f"{name:<24}{r['rps']:>12,.0f}{fmt(vs_l, 2):>11}{fmt(vs_w, 2):>9}"
                  f"{r['errors']:>8.0f}  " + ", ".join(f"{x:,.0f}" for x in r["runs"]))
        print(f"scalelab open loop at {rate:,.0f}/s: sent {peak_open['sent_rps']:,.0f}/s, "
              f"completed {peak_open['rps']:,.0f}/s, lag {peak_open['lag_share']:.1%}, "
              f"valid={peak_open['valid']}")

        print("\n2) percentiles, 10 ms endpoint, closed loop, 10 connections/users (~1,000/s)")
        pct = median_run({"scalelab": lambda: ours(fixed_url, 10, secs),
                          "wrk": lambda: wrk(fixed_url, 10, secs),
                          "locust": lambda: locust(fixed_url, 10, secs)}, a.repeats)
        res["percentiles"] = pct
        print(f"{'generator':<12}{'req/s':>9}{'p50 ms':>9}{'p90 ms':>9}{'p99 ms':>9}"
              f"{'p50/wrk':>9}{'p90/wrk':>9}{'p99/wrk':>9}")
        wr = pct["wrk"]
        for name, r in pct.items():
            if r is None:
                print(f"{name:<12}{'skipped':>9}")
                continue
            ratios = [(r[k] / wr[k]) if wr and wr[k] else None for k in ("p50", "p90", "p99")]
            print(f"{name:<12}{r['rps']:>9,.0f}{fmt(r['p50'], 2):>9}{fmt(r['p90'], 2):>9}"
                  f"{fmt(r['p99'], 2):>9}" + "".join(f"{fmt(x, 3):>9}" for x in ratios))
        if loc:
            two = peak["scalelab (2 processes)"]
            res["ratio_vs_locust"] = best / loc["rps"]
            print(f"\ntarget >= 5x Locust's rate: one process {best / loc['rps']:.1f}x "
                  f"({'met' if best >= 5 * loc['rps'] else 'NOT met'})"
                  + (f", two processes {two['rps'] / loc['rps']:.1f}x" if two else ""))
        sl = pct["scalelab"]
        if wr and sl:
            within = all(abs(sl[k] / wr[k] - 1) <= 0.10 for k in ("p50", "p90", "p99"))
            res["percentiles_within_10pct_of_wrk"] = within
            print(f"target percentiles within 10% of wrk's: {'met' if within else 'NOT met'}")
    finally:
        for p in (fast, fixed):
            p.kill()
            p.wait(timeout=10)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(res, indent=2) + "\n")
    print(f"\nwrote {a.out}")


if __name__ == "__main__":
    main()
