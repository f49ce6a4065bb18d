"""What tracing costs the tabular server, side by side in one run: off, sampled 1%, sampled 100%
(and the governance limiter on, with generous limits).

Run: .venv/bin/python benchmarks/bench_observe.py [--parts asgi,http] [--series off,1%,100%]
        [--rounds 9] [--requests 400] [--seconds 3] [--connections 16] [--out FILE]

Parts (series interleaved round by round, so they share the machine's moments, each round
starting with the next series; the median round is reported, with the ratio to `off` taken
per round and its median printed):

- asgi: `scalelab serve`'s whole app (bare-ASGI infer path, dynamic batching, the 1-row
  flights MLP) driven straight over ASGI in this process, one request after another: no
  sockets and no client process, whose noise on a shared 2-core machine would swamp a few
  microseconds per request. This is the hot path's own cost.
- http: one real server process per series on 127.0.0.1 (torch threads 1), loaded by a
  closed loop of --connections clients (`wrk -t1`, Debian's wrk; else `scalelab load --loop
  closed`) for --seconds a round. The client shares the two cores with the server.

Series are a table (`SERIES` below: name -> extra ServerSettings fields and the matching CLI
flags); `--series` picks and orders them. The hook for more: add an entry, e.g.
"limiter on": Series(settings={"governance_file": F}, flags=["--governance", F]) with a
generous governance file, and the same run measures it beside tracing.

Targets: off costs nothing measurable (it is the baseline: no tracer exists when off; the
check is one `is None` per request); sampled 1% costs < 5% throughput. The load average is
printed beside every number: this machine is shared and busy.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests" / "system" / "serve"))

from asgi_driver import (  # noqa: E402
    INFER,
    App,
    rotated,
    start_lifespan,
    stop_lifespan,
    timed_requests,
)


@dataclass(frozen=True)
class Series:
    """One server configuration: `settings` for the in-process app, `flags` for the process.
    `{spans}` in either is replaced by this series' span file."""

    settings: dict[str, Any] = field(default_factory=dict)
    flags: list[str] = field(default_factory=list)


SERIES: dict[str, Series] = {
    "off": Series(),
    "1%": Series(settings={"trace": {"sample": 0.01, "out": "{spans}"}},
                 flags=["--trace-sample", "0.01", "--trace-out", "{spans}"]),
    "100%": Series(settings={"trace": {"sample": 1.0, "out": "{spans}"}},
                   flags=["--trace-sample", "1", "--trace-out", "{spans}"]),
    # governance with every check on every request and nothing refused (docs/governance.md)
    "limiter on": Series(settings={"governance_file": str(HERE / "governance-generous.yaml")},
                         flags=["--governance", str(HERE / "governance-generous.yaml")]),
}


def _fill(v: Any, spans: str) -> Any:
    if isinstance(v, str):
        return v.replace("{spans}", spans)
    if isinstance(v, dict):
        return {k: _fill(x, spans) for k, x in v.items()}
    if isinstance(v, list):
        return [_fill(x, spans) for x in v]
    return v


def load_avg() -> float:
    return os.getloadavg()[0]


def spans_in(path: Path) -> int:
    return sum(1 for _ in path.open()) if path.exists() else 0


# -- asgi ----------------------------------------------------------------------------------------

def _flusher(app: Any) -> Callable[[], None] | None:
    """The tracer's flush of a serve app (under any middleware that keeps it as `.app`)."""
    from scalelab.system.serve.app import ServeApp

    while not isinstance(app, ServeApp) and hasattr(app, "app"):
        app = app.app
    tracing = app.ctx.tracing if isinstance(app, ServeApp) else None
    return None if tracing is None else tracing.flush


async def part_asgi(names: list[str], repo: Path, work: Path, n: int, rounds: int
                    ) -> dict[str, Any]:
    from serve_fixtures import infer_body

    from scalelab.system.serve.app import create_app
    from scalelab.system.serve.settings import ServerSettings

    base = {"model_repo": repo, "access_log": "off", "torch_threads": 1}
    files = {k: work / f"asgi-{i}.jsonl" for i, k in enumerate(names)}
    apps: dict[str, App] = {k: create_app(ServerSettings(  # type: ignore[misc]
        **base, **_fill(SERIES[k].settings, str(files[k])))) for k in names}
    running = [await start_lifespan(a) for a in apps.values()]
    flushes = {k: _flusher(a) for k, a in apps.items()}
    body = json.dumps(infer_body(1)).encode()
    hdr = [(b"content-type", b"application/json"),
           (b"content-length", str(len(body)).encode())]
    for app in apps.values():
        await timed_requests(app, hdr, body, 200)  # warm: first batches, the inline decision
    got: dict[str, list[tuple[float, float]]] = {k: [] for k in apps}
    loads = []
    for r in range(rounds):
        loads.append(load_avg())
        for k in rotated(names, r):
            got[k].append(await timed_requests(apps[k], hdr, body, n, flushes[k]))
    await stop_lifespan(running)
    out = _table(names, {k: [1.0 / w for w, _ in v] for k, v in got.items()}, loads, files,
                 total=n * rounds + 200)
    base = [c for _, c in got[names[0]]]
    for k in names:
        cpu = [c for _, c in got[k]]
        out["series"][k]["cpu_us_per_request"] = round(statistics.median(cpu) * 1e6, 1)
        # CPU per request relative to the baseline, per round: > 1 costs more
        out["series"][k]["cpu_ratio"] = round(statistics.median(
            [c / b for c, b in zip(cpu, base, strict=True)]), 4)
    return out


# -- http ----------------------------------------------------------------------------------------

def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(repo: Path, flags: list[str], log: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = _port()
    cmd = [sys.executable, "-m", "scalelab", "serve", "--model-repo", str(repo), "--port",
           str(port), "--torch-threads", "1", "--access-log", "off", *flags]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    with log.open("wb") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    import httpx

    t0 = time.monotonic()
    while time.monotonic() - t0 < 180:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {log.read_text()[-2000:]}")
        try:
            if httpx.get(url + "/v2/health/ready", timeout=1).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"server not ready: {log.read_text()[-2000:]}")


def _bodies(n: int) -> list[str]:
    from serve_fixtures import infer_body

    return [json.dumps(infer_body(1, seed=i), separators=(",", ":")) for i in range(n)]


def _closed(url: str, seconds: float, conns: int, lua: Path, jsonl: Path) -> float:
    if shutil.which("wrk"):
        out = subprocess.run(["wrk", "-t1", f"-c{conns}", f"-d{seconds:g}s", "-s", str(lua),
                              url + INFER], capture_output=True, text=True, check=True).stdout
        bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
        if bad:
            raise RuntimeError(f"{bad.group(1)} non-2xx responses from {url}")
        m = re.search(r"Requests/sec:\s+([\d.]+)", out)
        assert m is not None, out
        return float(m.group(1))
    p = subprocess.run([sys.executable, "-m", "scalelab", "load", "run", url + INFER, "--loop",
                        "closed", "--concurrency", str(conns), "--duration", f"{seconds:g}s",
                        "--requests-file", str(jsonl), "--no-cold-start", "--json"],
                       capture_output=True, text=True, check=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    return float(json.loads(p.stdout)["levels"][0]["throughput_rps"])


def part_http(names: list[str], repo: Path, work: Path, rounds: int, seconds: float,
              conns: int) -> dict[str, Any]:
    bodies = _bodies(500)
    jsonl = work / "requests.jsonl"
    jsonl.write_text("".join(json.dumps({"body": json.loads(b)}) + "\n" for b in bodies))
    lua = work / "post.lua"
    lua.write_text("\n".join(["local bodies = {"] + [f"  [==[{b}]==]," for b in bodies] + [
        "}", "local i = 0", 'wrk.method = "POST"',
        'wrk.headers["Content-Type"] = "application/json"', "request = function()",
        "  i = i % #bodies + 1", "  return wrk.format(nil, nil, nil, bodies[i])", "end"]) + "\n")
    files = {k: work / f"http-{i}.jsonl" for i, k in enumerate(names)}
    servers = {k: _start(repo, _fill(SERIES[k].flags, str(files[k])), work / f"srv-{i}.log")
               for i, k in enumerate(names)}
    try:
        for _, url in servers.values():
            _closed(url, 1, conns, lua, jsonl)  # warm
        got: dict[str, list[float]] = {k: [] for k in names}
        loads = []
        for r in range(rounds):
            loads.append(load_avg())
            for k in rotated(names, r):
                got[k].append(_closed(servers[k][1], seconds, conns, lua, jsonl))
    finally:
        for proc, _ in servers.values():
            proc.send_signal(signal.SIGTERM)
        for proc, _ in servers.values():
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
    client = f"wrk -t1 -c{conns}" if shutil.which("wrk") else "scalelab load --loop closed"
    out = _table(names, got, loads, files, total=None)
    out["client"] = client
    return out


# -- report --------------------------------------------------------------------------------------

def _table(names: list[str], rps: dict[str, list[float]], loads: list[float],
           files: dict[str, Path], *, total: int | None) -> dict[str, Any]:
    first = names[0]
    rows = {}
    for k in names:
        ratios = [x / b for x, b in zip(rps[k], rps[first], strict=True)]
        rows[k] = {"req_per_s": round(statistics.median(rps[k]), 1),
                   "ratio_to_" + first: round(statistics.median(ratios), 4),
                   "ratio_min": round(min(ratios), 4), "ratio_max": round(max(ratios), 4),
                   "rounds_req_per_s": [round(x, 1) for x in rps[k]],
                   "spans_written": spans_in(files[k])}
    return {"series": rows, "baseline": first, "load_average_per_round": loads,
            "requests_per_series": total}


def render(title: str, part: dict[str, Any]) -> None:
    base = part["baseline"]
    print(f"\n{title}" + (f" ({part['client']})" if "client" in part else ""))
    print(f"| series | req/s (median round) | ratio to {base} (median, min–max) | spans written |")
    print("|---|---:|---:|---:|")
    for k, r in part["series"].items():
        print(f"| {k} | {r['req_per_s']:.0f} | {r['ratio_to_' + base]:.3f} "
              f"({r['ratio_min']:.3f}–{r['ratio_max']:.3f}) | {r['spans_written']} |")
    if any("cpu_us_per_request" in r for r in part["series"].values()):
        print(f"| series | CPU us/request (median round) | CPU ratio to {base} |")
        print("|---|---:|---:|")
        for k, r in part["series"].items():
            print(f"| {k} | {r['cpu_us_per_request']:.0f} | {r['cpu_ratio']:.3f} |")
    la = part["load_average_per_round"]
    print(f"load average (1 min) at each round: {', '.join(f'{x:.1f}' for x in la)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default="asgi,http")
    ap.add_argument("--series", default=",".join(SERIES),
                    help=f"Comma list from {', '.join(SERIES)} (the first is the baseline)."
                    .replace("%", "%%"))  # argparse expands % in help
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--requests", type=int, default=400, help="asgi: requests per series a "
                    "round.")
    ap.add_argument("--seconds", type=float, default=3.0, help="http: seconds per series a "
                    "round.")
    ap.add_argument("--connections", type=int, default=16)
    ap.add_argument("--out", type=Path, default=HERE / "out" / "observe.json")
    a = ap.parse_args()
    names = [s.strip() for s in a.series.split(",") if s.strip()]
    unknown = [s for s in names if s not in SERIES]
    if unknown:
        raise SystemExit(f"--series: unknown {unknown}; known: {', '.join(SERIES)}")
    parts = [p.strip() for p in a.parts.split(",") if p.strip()]
    from serve_fixtures import add_model

    work = Path(tempfile.mkdtemp(prefix="bench-observe-"))
    repo = work / "repo"
    add_model(repo, "flights", {1: 1})
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()} at the start "
          "(shared and busy: other work runs beside this benchmark)")
    results: dict[str, Any] = {"cores": os.cpu_count(), "series": names}
    if "asgi" in parts:
        results["asgi"] = asyncio.run(part_asgi(names, repo, work, a.requests, a.rounds))
        render(f"tabular server over ASGI, 1-row requests one after another, {a.rounds} rounds "
               f"of {a.requests}", results["asgi"])
    if "http" in parts:
        results["http"] = part_http(names, repo, work, a.rounds, a.seconds, a.connections)
        render(f"tabular server processes, closed loop, {a.rounds} rounds of {a.seconds:g} s",
               results["http"])
    print(f"load average at the end: {os.getloadavg()}")
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(results, indent=2), encoding="utf-8")
    print(f"written to {a.out}")


if __name__ == "__main__":
    main()
