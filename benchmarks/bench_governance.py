"""What governance costs the tabular server's hot path, side by side in one run.

Run: .venv/bin/python benchmarks/bench_governance.py [--requests 300] [--rounds 15] [--out FILE]

Two measurements, both in one process so the series share the machine's moments:

- middleware: the governance layer alone around an ASGI app that answers at once, in CPU
  microseconds per request (`off` = the bare app), for the default class (one bucket), an API
  key (SHA-256 of the key, bucket and concurrency cap) and a bucket plus a requests/day budget;
- server: `scalelab serve`'s whole app (bare-ASGI infer path, dynamic batching, a 1-row flights
  MLP), driven straight over ASGI one request after another (no sockets, no client process: on
  a shared 2-core machine a load generator's own noise would swamp a few microseconds), with
  governance off and on with generous limits (nothing is refused). Reported as requests/s and
  CPU microseconds per request per series, and each as a ratio to off (median of the rounds'
  paired ratios).

Series are interleaved round by round (round r starts with series r mod n) and the median
round is reported; the machine's load
average is printed beside the numbers (this 2-core box is shared and busy).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests" / "system" / "serve"))

from asgi_driver import App, rotated, start_lifespan, stop_lifespan, timed_requests  # noqa: E402
from scalelab.layers.web.governance.config import parse_governance  # noqa: E402
from scalelab.layers.web.governance.governor import Governor  # noqa: E402
from scalelab.layers.web.governance.middleware import Governance  # noqa: E402

KEY = "sk-bench-0123456789"
GENEROUS = HERE / "governance-generous.yaml"
"""Every check on every request, nothing refused (bench_observe's "limiter on" series too)."""
MIDDLEWARE: dict[str, dict[str, Any] | None] = {
    "off": None,
    "default class: bucket": {"default": {"rate": 1e9, "burst": 10**9}},
    "API key: sha256 + bucket + cap": {"clients": {"c": {"keys": [KEY], "rate": 1e9,
                                                         "burst": 10**9,
                                                         "max_concurrency": 10**6}}},
    "bucket + requests/day budget": {"default": {"rate": 1e9, "burst": 10**9,
                                                 "budgets": [{"unit": "requests",
                                                              "period": "day",
                                                              "limit": 1e12}]}},
}



async def _noop(scope: dict[str, Any], receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"{}"})


def _route(scope: dict[str, Any]) -> str | None:
    return "flights" if scope["method"] == "POST" else None


async def middleware(n: int, rounds: int) -> dict[str, float]:
    """Median CPU microseconds per request for each middleware series."""
    apps: dict[str, App] = {
        k: _noop if v is None else Governance(_noop, Governor(parse_governance(v, "bench")),
                                              route=_route, admin_token=None)
        for k, v in MIDDLEWARE.items()}
    hdr = [(b"content-type", b"application/json"), (b"x-api-key", KEY.encode())]
    got: dict[str, list[float]] = {k: [] for k in apps}
    for i in range(rounds):
        for k in rotated(list(apps), i):
            got[k].append((await timed_requests(apps[k], hdr, b"", n * 10))[1])
    return {k: statistics.median(v) * 1e6 for k, v in got.items()}


async def server(n: int, rounds: int, repo: Path, gov_file: Path) -> dict[str, Any]:
    from serve_fixtures import infer_body

    from scalelab.system.serve.app import create_app
    from scalelab.system.serve.settings import ServerSettings

    base = {"model_repo": repo, "access_log": "off", "torch_threads": 1}
    apps: dict[str, App] = {
        "off": create_app(ServerSettings(**base)),  # type: ignore[dict-item]
        "on (generous limits)": create_app(ServerSettings(  # type: ignore[dict-item]
            **base, governance_file=str(gov_file))),
    }
    running = [await start_lifespan(a) for a in apps.values()]
    body = json.dumps(infer_body(1)).encode()
    hdr = [(b"content-type", b"application/json"),
           (b"content-length", str(len(body)).encode())]
    for app in apps.values():
        await timed_requests(app, hdr, body, 200)  # warm: first batches, the inline decision
    got: dict[str, list[tuple[float, float]]] = {k: [] for k in apps}
    for i in range(rounds):
        for k in rotated(list(apps), i):
            got[k].append(await timed_requests(apps[k], hdr, body, n))
    await stop_lifespan(running)
    off = got["off"]
    out: dict[str, Any] = {}
    for k, v in got.items():
        # paired by round: each round's series ran back to back, in the same moment
        wall_ratio = statistics.median(o[0] / x[0] for o, x in zip(off, v, strict=True))
        cpu_ratio = statistics.median(o[1] / x[1] for o, x in zip(off, v, strict=True))
        out[k] = {"req_per_s": round(1.0 / statistics.median(x[0] for x in v), 1),
                  "cpu_us_per_request": round(statistics.median(x[1] for x in v) * 1e6, 1),
                  "throughput_ratio_to_off": round(wall_ratio, 4),
                  "cpu_throughput_ratio_to_off": round(cpu_ratio, 4),
                  "rounds_req_per_s": [round(1.0 / x[0], 1) for x in v]}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=300, help="Requests per series a round.")
    ap.add_argument("--rounds", type=int, default=15,
                    help="Rounds; the series alternate every round, so short rounds share "
                         "the machine's moments.")
    ap.add_argument("--out", type=Path, default=HERE / "out" / "governance.json")
    a = ap.parse_args()
    from serve_fixtures import add_model

    tmp = Path(tempfile.mkdtemp(prefix="bench-gov-"))
    repo = tmp / "repo"
    add_model(repo, "flights", {1: 1})
    load0 = os.getloadavg()
    mw = asyncio.run(middleware(a.requests, a.rounds))
    srv = asyncio.run(server(a.requests, a.rounds, repo, GENEROUS))
    load1 = os.getloadavg()
    print(f"machine: {os.cpu_count()} cores; load average before {load0[0]:.2f}, after "
          f"{load1[0]:.2f} (shared, busy)")
    print("middleware alone (CPU us/request, median of rounds):")
    for k, v in mw.items():
        print(f"  {k:34s} {v:7.2f}  (+{v - mw['off']:.2f} over off)")
    print("tabular server over ASGI, 1-row requests one after another:")
    for k, v in srv.items():
        print(f"  {k:22s} {v['req_per_s']:8.1f} req/s (x{v['throughput_ratio_to_off']:.3f} "
              f"of off, paired rounds)  {v['cpu_us_per_request']:8.1f} CPU us/request "
              f"(x{v['cpu_throughput_ratio_to_off']:.3f} of off)")
        print(f"  {'':22s} rounds: {v['rounds_req_per_s']}")
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps({"load_average": [load0, load1], "middleware_us": mw,
                                 "server": srv, "requests": a.requests, "rounds": a.rounds},
                                indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
