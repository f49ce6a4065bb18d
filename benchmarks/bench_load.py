"""scalelab's load generator vs wrk, Locust and MLPerf LoadGen, in one run.

Run: .venv/bin/python benchmarks/bench_load.py [--parts tools,precision,capacity] [--seconds 5]
         [--connections 50] [--repeats 3] [--cap-repeats 1] [--out FILE]

Parts (all by default):
- tools: peak rate and percentiles vs wrk and Locust (below).
- precision: open-loop send lag p50/p99/max at 100, 1,000 and 5,000 req/s with each event loop
  (asyncio, uvloop), and the validity of levels at 10%, 25% and 50% of the generator's own
  capacity (its closed-loop peak, one process).
- capacity: `scalelab load capacity` vs MLPerf LoadGen's Server scenario (mlcommons-loadgen
  6.0.17 in benchmarks/.venvs/loadgen, created here on first use) on two servers of known
  capacity: tests/lab/load/servers.py "queue" (one FIFO worker, 10 ms fixed service: 100 req/s)
  and `scalelab serve` with a flights model behind a 10 ms serial section (delay_mlp, batch 1).
  Both sides: p99 <= 200 ms, Poisson arrivals, the same requests. LoadGen is driven as a
  ladder of PerformanceOnly runs of --loadgen-seconds (15 s) and at least 1,164 queries each
  (our p99 step; min_query_count), through the same
  exponential-then-bisection search (capacity.search, 5% precision) our command uses, so the
  two differ only in how one rate is judged: our stopping rule with quantile-sized steps, or
  LoadGen's full-length run with its p99 and early-stopping tests.

Two endpoints, both tests/lab/load/servers.py (one asyncio process on 127.0.0.1):
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
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SERVERS = ROOT / "tests" / "lab" / "load" / "servers.py"
LOCUST_VENV = HERE / ".venvs" / "locust"
LOCUST_REQ = "locust==2.47.0"
LOADGEN_VENV = HERE / ".venvs" / "loadgen"
LOADGEN_REQ = "mlcommons-loadgen==6.0.17"

sys.path.insert(0, str(ROOT / "src"))
from scalelab.lab.core.machine import current_machine  # noqa: E402
from scalelab.lab.load.capacity import SearchConfig, Step, search, step_requests  # noqa: E402
from scalelab.lab.load.http.generator import HttpConfig  # noqa: E402
from scalelab.lab.load.http.run import LoadPlan, run_load  # noqa: E402
from scalelab.lab.load.send import Target, build_request  # noqa: E402


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
    cfg = HttpConfig(target=t, requests=[build_request(t, method="GET", path=t.path, body=None)],
                       mode="closed", concurrency=conc, warmup_s=1.0)
    r = run_load(LoadPlan(engine=cfg, duration_s=seconds, processes=processes, cold_start=False))
    lat = r.latency
    return {"rps": r.throughput_rps, "p50": lat.p50_ms, "p90": lat.p90_ms, "p99": lat.p99_ms,
            "errors": r.failures}


def ours_open(url: str, rate: float, seconds: float, processes: int,
              loop_impl: str = "auto", realtime: bool = False) -> dict[str, Any]:
    t = Target.parse(url)
    cfg = HttpConfig(target=t, requests=[build_request(t, method="GET", path=t.path, body=None)],
                       mode="open", warmup_s=1.0, loop_impl=loop_impl,  # type: ignore[arg-type]
                       realtime=realtime)
    r = run_load(LoadPlan(engine=cfg, rate=rate, duration_s=seconds, processes=processes,
                          cold_start=False))
    return {"offered": rate, "rps": r.throughput_rps, "sent_rps": r.sent_rps,
            "lag_share": r.lag_share, "lag_p50_ms": r.lag_p50_ms, "lag_p99_ms": r.lag_p99_ms,
            "lag_max_ms": r.lag_max_ms, "valid": r.valid, "reasons": r.invalid_reasons,
            "p50": r.latency.p50_ms, "p99": r.latency.p99_ms}


def loadavg() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


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


# ---- precision: send lag by rate and event loop; validity below the generator's capacity ----

def precision(fast_url: str, seconds: float, repeats: int, capacity_rps: float) -> dict[str, Any]:
    # (label, event loop, SCHED_FIFO); realtime only where this process may use it.
    loops = [("asyncio", "asyncio", False), ("uvloop", "uvloop", False)]
    if realtime_ok():
        loops.append(("uvloop+rt", "uvloop", True))
    out: dict[str, Any] = {"loadavg_before": loadavg(), "lag": {}, "below_capacity": []}
    print(f"\n3) open-loop send lag (ms) on the trivial endpoint, {seconds:g} s per level, "
          f"median of {repeats}; load average {loadavg()}")
    print(f"{'loop':<10}{'rate':>7}{'lag p50':>9}{'lag p99':>9}{'lag max':>9}{'valid':>7}"
          "  p99 of each run")
    for rate in (100, 1000, 5000):
        for lp, impl, rt in loops:
            runs = [ours_open(fast_url, rate, seconds, 1, impl, rt) for _ in range(repeats)]
            med = {k: statistics.median([r[k] for r in runs]) for k in
                   ("lag_p50_ms", "lag_p99_ms", "lag_max_ms")}
            valid = sum(r["valid"] for r in runs)
            out["lag"][f"{lp}@{rate}"] = {**med, "valid_runs": valid, "runs": runs}
            print(f"{lp:<10}{rate:>7}{med['lag_p50_ms']:>9.3f}{med['lag_p99_ms']:>9.3f}"
                  f"{med['lag_max_ms']:>9.2f}{valid:>5}/{repeats}  "
                  + ", ".join(f"{r['lag_p99_ms']:.3f}" for r in runs))
    print(f"\n   levels below the generator's capacity ({capacity_rps:,.0f} req/s closed loop, "
          "one process): valid?")
    for (share, rt) in [(x, rt) for rt in sorted({lp[2] for lp in loops}) for x in
                        (0.10, 0.25, 0.50)]:
        rate = round(share * capacity_rps, -1)
        runs = [ours_open(fast_url, rate, seconds, 1, "auto", rt) for _ in range(repeats)]
        out["below_capacity"].append({"share": share, "rate": rate, "realtime": rt,
                                      "runs": runs})
        tag = " (realtime)" if rt else ""
        print(f"   {share:.0%} = {rate:,.0f} req/s{tag}: valid {sum(r['valid'] for r in runs)}/"
              f"{repeats}; lag p99 " + ", ".join(f"{r['lag_p99_ms']:.3f}" for r in runs)
              + " ms" + "".join(f"\n      invalid: {x}" for r in runs for x in r["reasons"]))
    out["loadavg_after"] = loadavg()
    return out


def realtime_ok() -> bool:
    from scalelab.lab.core.errors import BadUsageError
    from scalelab.lab.load.clock import realtime

    try:
        with realtime():
            return True
    except BadUsageError:
        return False


# ---- capacity: scalelab load capacity vs MLPerf LoadGen's Server scenario ----

LOADGEN_WORKER = textwrap.dedent("""
    import asyncio, base64, json, re, sys, threading, time
    args = json.loads(sys.argv[1])
    sys.path.insert(0, args["src"])
    import mlperf_loadgen as lg
    from scalelab.lab.load.http.connection import HttpConnection
    from scalelab.lab.load.send import Target

    reqs = [base64.b64decode(x) for x in open(args["requests"]).read().split()]
    target = Target.parse(args["url"])
    loop = asyncio.new_event_loop()
    idle, state = [], {"i": 0, "errors": 0}

    def complete(qid):
        lg.QuerySamplesComplete([lg.QuerySampleResponse(qid, 0, 0)])

    def send(conn, qid):
        conn.send(reqs[state["i"] % len(reqs)], qid)
        state["i"] += 1

    def on_resp(conn, status, qid, now):
        if not 200 <= status < 300:
            state["errors"] += 1
        complete(qid)
        idle.append(conn)

    def on_lost(conn, exc, qid):
        if conn in idle:
            idle.remove(conn)
        if qid is not None:
            state["errors"] += 1
            complete(qid)

    async def open_and_send(qid):
        _, conn = await loop.create_connection(
            lambda: HttpConnection(on_resp, on_lost, time.monotonic), target.host, target.port)
        send(conn, qid)

    def dispatch(ids):
        for qid in ids:
            if idle:
                send(idle.pop(), qid)
            else:
                loop.create_task(open_and_send(qid))

    def issue(samples):
        loop.call_soon_threadsafe(dispatch, [s.id for s in samples])

    threading.Thread(target=loop.run_forever, daemon=True).start()
    sut = lg.ConstructSUT(issue, lambda: None)
    qsl = lg.ConstructQSL(1024, 1024, lambda s: None, lambda s: None)
    st = lg.TestSettings()
    st.scenario = lg.TestScenario.Server
    st.mode = lg.TestMode.PerformanceOnly
    st.server_target_qps = args["qps"]
    st.server_target_latency_ns = int(args["latency_ms"] * 1e6)
    st.server_target_latency_percentile = args["percentile"]
    st.min_duration_ms = int(args["seconds"] * 1000)
    st.min_query_count = args["min_queries"]
    st.schedule_rng_seed = args["seed"]
    log = lg.LogSettings()
    log.log_output.outdir = args["outdir"]
    log.log_output.copy_summary_to_stdout = False
    t0 = time.monotonic()
    lg.StartTestWithLogSettings(sut, qsl, st, log)
    wall = time.monotonic() - t0
    lg.DestroyQSL(qsl)
    lg.DestroySUT(sut)
    text = open(args["outdir"] + "/mlperf_log_summary.txt").read()
    def num(pat):
        m = re.search(pat, text)
        return float(m.group(1)) if m else None
    print(json.dumps({
        "valid": "Result is : VALID" in text,
        "p_ms": (num(r"%.2f percentile latency \\(ns\\)\\s*:\\s*(\\d+)"
                     % (args["percentile"] * 100)) or 0) / 1e6,
        "scheduled_qps": num(r"Scheduled samples per second\\s*:\\s*([\\d.]+)"),
        "completed_qps": num(r"Completed samples per second\\s*:\\s*([\\d.]+)"),
        "early_stopping_ok": "Early stopping satisfied: Yes" in text,
        "constraints_ok": "Performance constraints satisfied : Yes" in text,
        "errors": state["errors"], "wall_s": wall}))
""")


def warm(target: Target, reqs: list[bytes], rate: float, seconds: float) -> None:
    cfg = HttpConfig(target=target, requests=reqs, mode="open")
    run_load(LoadPlan(engine=cfg, rate=rate, duration_s=seconds, cold_start=False))


def loadgen_python() -> Path | None:
    exe = LOADGEN_VENV / "bin" / "python"
    if exe.exists() and subprocess.run([str(exe), "-c", "import mlperf_loadgen"],
                                       capture_output=True).returncode == 0:
        return exe
    print(f"creating {LOADGEN_VENV} with {LOADGEN_REQ} (first run only) ...")
    try:
        subprocess.run([sys.executable, "-m", "venv", str(LOADGEN_VENV)], check=True)
        subprocess.run([str(LOADGEN_VENV / "bin" / "pip"), "install", "-q", LOADGEN_REQ],
                       check=True, timeout=900)
    except (subprocess.SubprocessError, OSError) as e:
        print(f"note: could not install LoadGen ({e}); skipped")
        return None
    return exe if exe.exists() else None


def loadgen_capacity(py: Path, url: str, reqs_file: Path, *, start: float, seconds: float,
                     latency_ms: float, percentile: float, workdir: Path) -> dict[str, Any]:
    steps_raw: list[dict[str, Any]] = []

    def run_step(qps: float) -> Step:
        out = workdir / f"lg{len(steps_raw)}"
        out.mkdir(parents=True, exist_ok=True)
        arg = {"src": str(ROOT / "src"), "url": url, "requests": str(reqs_file), "qps": qps,
               "latency_ms": latency_ms, "percentile": percentile, "seconds": seconds,
               "seed": 1000 + len(steps_raw), "outdir": str(out),
               # At least as many queries as our p99 step (1,164): with LoadGen's default
               # 100, a 15 s run under 31 QPS cannot meet its own early-stopping minimum
               # (459 queries for p99), so every low rate would be INVALID.
               "min_queries": step_requests(percentile, 0.95)}
        p = subprocess.run([str(py), "-c", LOADGEN_WORKER, json.dumps(arg)], capture_output=True,
                           text=True, timeout=seconds * 10 + 120)
        if p.returncode != 0:
            raise SystemExit(f"LoadGen run failed: {p.stderr[-2000:]}")
        r = json.loads(p.stdout.strip().splitlines()[-1])
        r["qps"] = qps
        steps_raw.append(r)
        print(f"   loadgen {qps:7.1f} QPS: {'VALID' if r['valid'] else 'INVALID'}, "
              f"p99 {r['p_ms']:.1f} ms, completed {r['completed_qps'] or 0:.1f}/s, early "
              f"stopping {'ok' if r['early_stopping_ok'] else 'NOT met'}")
        return Step(rate=qps, verdict="pass" if r["valid"] else "fail", requests=0,
                    throughput_rps=r["completed_qps"] or 0.0, quantile_ms=r["p_ms"],
                    quantile_ci_ms=(None, None), error_rate=0.0, valid=True,
                    wall_s=r["wall_s"])

    t0 = time.monotonic()
    res = search(run_step, SearchConfig(start=start, precision=0.05))
    return {"capacity_rps": res.capacity_rps, "interval_rps": list(res.interval_rps),
            "steps": steps_raw, "wall_s": time.monotonic() - t0}


def ours_capacity(url: str, extra: list[str], *, start: float, slo: str) -> dict[str, Any]:
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-c", "from scalelab.cli import main; main()", "load",
                        "capacity", url, "--slo", slo, "--arrival", "poisson", "--start",
                        str(start), "--json", *extra], capture_output=True, text=True,
                       timeout=3600)
    if p.returncode != 0:
        raise SystemExit(f"scalelab load capacity failed: {p.stderr[-2000:]}")
    doc = json.loads(p.stdout)
    for st in doc["steps"]:
        print(f"   scalelab {st['rate']:7.1f} req/s: {st['verdict']:<15} p99 "
              f"{st['quantile_ms'] or 0:.1f} ms, {st['requests']} requests, "
              f"{'valid' if st['valid'] else 'INVALID'}")
    return {"capacity_rps": doc["capacity_rps"], "interval_rps": doc["interval_rps"],
            "step_requests": doc["step_requests"], "steps": doc["steps"],
            "wall_s": time.monotonic() - t0}


def flights_server(tmp: Path) -> tuple[subprocess.Popen[str], str]:
    """`scalelab serve` with one flights model behind a 10 ms serial section, batch 1."""
    sys.path.insert(0, str(ROOT / "tests" / "system" / "serve"))
    from serve_fixtures import add_model, free_port  # the serving tests' model builder

    repo = tmp / "repo"
    add_model(repo, "flights", {1: 1}, arch="delay_mlp",
              extra_params={"batch_ms": 10, "row_ms": 0}, max_batch_size=1,
              dynamic_batching={"max_queue_delay_ms": 0, "max_queue_size": 100_000,
                                "default_timeout_ms": 60_000})
    port = free_port()
    log = (tmp / "serve.log").open("w")
    proc = subprocess.Popen([sys.executable, "-c", "from scalelab.cli import main; main()",
                             "serve", "--model-repo", str(repo), "--port", str(port)],
                            stdout=log, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    import httpx

    for _ in range(600):
        try:
            if httpx.get(f"{url}/v2/health/ready", timeout=1).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    proc.kill()
    raise SystemExit(f"scalelab serve did not start; see {tmp / 'serve.log'}")


def capacity_part(repeats: int, lg_seconds: float, start: float,
                  which: set[str]) -> dict[str, Any]:
    import base64

    from scalelab.lab.load.http import payloads

    py = loadgen_python()
    out: dict[str, Any] = {"loadavg_before": loadavg(), "servers": {}}
    slo_ms, pct = 200.0, 0.99
    print(f"\n4) capacity for p99 <= {slo_ms:g} ms, Poisson: scalelab load capacity vs MLPerf "
          f"LoadGen Server ({lg_seconds:g} s runs); load average {loadavg()}")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        q, q_url = start_server("queue", "--service-ms", "10")
        fl, fl_url = flights_server(tmp)
        try:
            servers = {"queue-10ms (100 req/s)": (q_url, [], None),
                       "flights-serial-10ms": (fl_url + "/v2/models/flights/infer",
                                               ["--payload", "oip", "--model", "flights"],
                                               "flights")}
            for name, (url, extra, model) in servers.items():
                if name.split("-")[0] not in which:
                    continue
                target = Target.parse(url)
                if model is None:
                    specs = payloads.plain_get(target)
                else:
                    meta = payloads.fetch_metadata(target, model)
                    specs = payloads.oip_random(target, model, meta, batch=1, seed=0)
                reqs = payloads.encode(target, specs)
                rf = tmp / f"reqs-{len(out['servers'])}.txt"
                rf.write_text("\n".join(base64.b64encode(r).decode() for r in reqs))
                res: dict[str, Any] = {"ours": [], "loadgen": []}
                for rep in range(repeats):
                    print(f"  {name}, repeat {rep + 1}/{repeats}, load average {loadavg()}")
                    # Alternate who goes first; each search starts on a server warmed the same
                    # way (5 s at the start rate), so neither pays the server's first seconds.
                    order = ["ours", "loadgen"] if rep % 2 == 0 else ["loadgen", "ours"]
                    for who in order:
                        warm(target, reqs, start, 5.0)
                        if who == "ours":
                            res["ours"].append(ours_capacity(url, extra, start=start,
                                                             slo=f"p99<{slo_ms:g}ms"))
                        elif py is not None:
                            res["loadgen"].append(loadgen_capacity(
                                py, url, rf, start=start, seconds=lg_seconds,
                                latency_ms=slo_ms, percentile=pct,
                                workdir=tmp / f"lg-{name[:6]}-{rep}"))
                out["servers"][name] = res
        finally:
            for p in (q, fl):
                p.kill()
                p.wait(timeout=10)
    print(f"\n{'server':<26}{'scalelab req/s':>16}{'LoadGen QPS':>13}{'ratio':>8}"
          f"{'ours s':>8}{'LG s':>8}")
    for name, res in out["servers"].items():
        for i, o in enumerate(res["ours"]):
            lg_r = res["loadgen"][i] if i < len(res["loadgen"]) else None
            ratio = (o["capacity_rps"] / lg_r["capacity_rps"]) if lg_r and o["capacity_rps"] \
                and lg_r["capacity_rps"] else None
            print(f"{name:<26}{fmt(o['capacity_rps']):>16}"
                  f"{fmt(lg_r['capacity_rps'] if lg_r else None):>13}{fmt(ratio, 3):>8}"
                  f"{o['wall_s']:>8.0f}{(lg_r['wall_s'] if lg_r else 0):>8.0f}")
            res.setdefault("ratios", []).append(ratio)
    out["loadavg_after"] = loadavg()
    return out


def tools(a: argparse.Namespace, res: dict[str, Any]) -> float:
    """Parts 1 and 2; returns scalelab's one-process closed-loop peak."""
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
    return best


def peak_closed(fast_url: str, conns: int, seconds: float, repeats: int) -> float:
    return statistics.median(ours(fast_url, conns, seconds)["rps"] for _ in range(repeats))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--parts", default="tools,precision,capacity",
                    help="comma list of: tools, precision, capacity")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--connections", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cap-repeats", type=int, default=1,
                    help="capacity searches per tool and server")
    ap.add_argument("--cap-start", type=float, default=40.0,
                    help="first rate of both capacity searches")
    ap.add_argument("--loadgen-seconds", type=float, default=15.0,
                    help="LoadGen's min_duration per PerformanceOnly run")
    ap.add_argument("--servers", default="queue,flights",
                    help="capacity part: comma list of queue, flights")
    ap.add_argument("--out", type=Path, default=HERE / "out" / "bench_load.json")
    a = ap.parse_args()
    parts = {x.strip() for x in a.parts.split(",") if x.strip()}
    m = current_machine()
    print(f"machine: {m.cores} cores, {m.memory_bytes / 2**30:.0f} GiB, {m.device}; "
          f"load average {loadavg()} (shared with other jobs)")
    res: dict[str, Any] = {"machine": {"cores": m.cores, "device": m.device},
                           "seconds": a.seconds, "connections": a.connections,
                           "loadavg_start": loadavg()}
    best: float | None = None
    if "tools" in parts:
        best = tools(a, res)
    if "precision" in parts:
        fast, fast_url = start_server("fast")
        try:
            if best is None:
                best = peak_closed(fast_url, a.connections, a.seconds, a.repeats)
            res["generator_capacity_rps"] = best
            res["precision"] = precision(fast_url, a.seconds, a.repeats, best)
        finally:
            fast.kill()
            fast.wait(timeout=10)
    if "capacity" in parts:
        res["capacity"] = capacity_part(a.cap_repeats, a.loadgen_seconds, a.cap_start,
                                        {x.strip() for x in a.servers.split(",")})
    res["loadavg_end"] = loadavg()
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(res, indent=2) + "\n")
    print(f"\nload average at the end {loadavg()}; wrote {a.out}")


if __name__ == "__main__":
    main()
