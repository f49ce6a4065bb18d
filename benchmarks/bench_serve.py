"""scalelab serve (dynamic batching) vs plain FastAPI (no batching), LitServe and MLServer
(each with its own batching), all serving the same flights-shaped TabularNet weights.

Run: .venv/bin/python benchmarks/bench_serve.py [--slo-ms 50] [--seconds 5] [--rates ...]
                                                [--only scalelab,fastapi,...] [--out FILE]

Each server is one process (torch.set_num_threads(1), 127.0.0.1); all four are started, then
take turns at each offered rate, each level repeated (--repeats, median p95 reported).
The client is open-loop: requests are sent at scheduled times (one row each, every body
distinct so no cache or coalescing can help), and latency is measured from the scheduled send
time, so a stalled server is charged for the queue it causes (no coordinated omission). Each
server climbs a ladder of offered rates; "max rps" is the highest completed rate at a level
whose p95 stays under the SLO with < 1% errors. The client shares the machine's cores with the
server: on a 2-core box the numbers are a floor for every server alike.

Peers live in benchmarks/.venvs/{litserve,mlserver}, created by this script on first use with
the same torch (2.13.0 CPU), never project dependencies. They load the same weights through
torch.load(weights_only=True).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
VENVS = HERE / ".venvs"
PEERS = {"litserve": ["torch==2.13.0", "numpy", "litserve==0.2.19"],
         # mlserver 1.7.1 predates uvloop 0.22, which no longer creates a loop in
         # get_event_loop(); its inference workers crash with newer uvloop
         "mlserver": ["torch==2.13.0", "numpy", "mlserver==1.7.1", "uvloop<0.22"]}
PARAMS = {"cardinalities": [17, 4, 105, 150], "embedding_dims": [], "n_numeric": 14,
          "hidden": [128, 128], "n_classes": 4, "dropout": 0.0}
MAX_BATCH, DELAY_MS = 64, 2.0

PEER_NET = textwrap.dedent('''
import torch
from torch import nn

class TabularNet(nn.Module):
    """The same module tree as scalelab.nets.tabular.TabularNet (so the state dict loads)."""
    def __init__(self, p):
        super().__init__()
        dims = p["embedding_dims"] or [max(1, min(16, (c + 1) // 2)) for c in p["cardinalities"]]
        self.embeddings = nn.ModuleList(
            nn.Embedding(c, d) for c, d in zip(p["cardinalities"], dims))
        width, layers = sum(dims) + p["n_numeric"], []
        for h in p["hidden"]:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        layers.append(nn.Linear(width, p["n_classes"]))
        self.mlp = nn.Sequential(*layers)

    def forward(self, cat, num):
        parts = [e(cat[:, i]) for i, e in enumerate(self.embeddings)] + [num]
        return self.mlp(torch.cat(parts, dim=1))

def load(weights, params):
    torch.set_num_threads(1)
    net = TabularNet(params)
    net.load_state_dict(torch.load(weights, weights_only=True))
    return net.eval()

def tensors(body):
    ins = {i["name"]: i for i in body["inputs"]}
    c, n = ins["categorical"], ins["numeric"]
    cat = torch.tensor(c["data"], dtype=torch.int64).reshape(c["shape"])
    num = torch.tensor(n["data"], dtype=torch.float32).reshape(n["shape"])
    return cat, num

def outputs(probs):
    return {"outputs": [
        {"name": "probabilities", "datatype": "FP32", "shape": list(probs.shape),
         "data": probs.reshape(-1).tolist()},
        {"name": "label", "datatype": "INT64", "shape": [probs.shape[0]],
         "data": probs.argmax(1).tolist()}]}
''')

FASTAPI_APP = PEER_NET + textwrap.dedent('''
import json, os, sys
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
net = load(os.environ["BENCH_WEIGHTS"], json.loads(os.environ["BENCH_PARAMS"]))
app = FastAPI()

@app.get("/v2/health/ready")
def ready():
    return {"ready": True}

@app.post("/v2/models/flights/infer")
def infer(body: dict):
    # plain: one forward per request on FastAPI's thread pool, no batching, no queue bound
    cat, num = tensors(body)
    with torch.inference_mode():
        probs = torch.softmax(net(cat, num), dim=1)
    return JSONResponse(outputs(probs))
''')

LITSERVE_APP = PEER_NET + textwrap.dedent('''
import json, os, sys
import litserve as ls

class Api(ls.LitAPI):
    def setup(self, device):
        self.net = load(os.environ["BENCH_WEIGHTS"], json.loads(os.environ["BENCH_PARAMS"]))
    def decode_request(self, request):
        return tensors(request)
    def batch(self, inputs):
        return (torch.cat([c for c, _ in inputs]), torch.cat([n for _, n in inputs]))
    def predict(self, x):
        with torch.inference_mode():
            return torch.softmax(self.net(*x), dim=1)
    def unbatch(self, output):
        return list(output.split(1))
    def encode_response(self, output):
        return outputs(output)

if __name__ == "__main__":
    port = int(sys.argv[1])
    api = Api(max_batch_size=int(os.environ["BENCH_MAX_BATCH"]),
              batch_timeout=float(os.environ["BENCH_DELAY_MS"]) / 1000,
              api_path="/v2/models/flights/infer")
    server = ls.LitServer(api, accelerator="cpu", workers_per_device=1, timeout=30,
                          healthcheck_path="/v2/health/ready")
    server.run(port=port, host="127.0.0.1", generate_client_file=False)
''')

MLSERVER_MODEL = PEER_NET + textwrap.dedent('''
import json, os
import numpy as np
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse

class Flights(MLModel):
    async def load(self):
        self.net = load(os.environ["BENCH_WEIGHTS"], json.loads(os.environ["BENCH_PARAMS"]))
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        ins = {i.name: NumpyCodec.decode_input(i) for i in payload.inputs}
        cat = torch.from_numpy(np.ascontiguousarray(ins["categorical"], dtype=np.int64))
        num = torch.from_numpy(np.ascontiguousarray(ins["numeric"], dtype=np.float32))
        with torch.inference_mode():
            probs = torch.softmax(self.net(cat, num), dim=1).numpy()
        return InferenceResponse(model_name=self.name, outputs=[
            NumpyCodec.encode_output("probabilities", probs),
            NumpyCodec.encode_output("label", probs.argmax(1).astype(np.int64))])
''')


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def peer_python(name: str) -> Path:
    """The peer's venv interpreter, creating the venv on first use."""
    venv = VENVS / name
    py = venv / "bin" / "python"
    marker = venv / ".bench-installed"
    if not marker.exists():
        print(f"[setup] creating {venv} with {' '.join(PEERS[name])} ...", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(py), "-m", "pip", "install", "-q", *PEERS[name]], check=True)
        marker.write_text("ok\n")
    return py


def make_model(work: Path) -> tuple[Path, Path]:
    """The scalelab repository (safetensors) and the same weights as a plain state dict."""
    import torch

    from scalelab.nets.registry import save_module
    from scalelab.nets.repository import write_json
    from scalelab.nets.tabular import TabularConfig, TabularNet

    torch.manual_seed(0)
    net = TabularNet(TabularConfig(**PARAMS))  # type: ignore[arg-type]
    repo = work / "repo"
    save_module(repo / "flights" / "1", net, arch="tabular_mlp", params=PARAMS)
    write_json(repo / "flights" / "config.json", {
        "name": "flights",
        "inputs": [{"name": "categorical", "datatype": "INT64", "shape": [-1, 4]},
                   {"name": "numeric", "datatype": "FP32", "shape": [-1, 14]}],
        "outputs": [{"name": "probabilities", "datatype": "FP32", "shape": [-1, 4]},
                    {"name": "label", "datatype": "INT64", "shape": [-1]}],
        "max_batch_size": MAX_BATCH,
        "dynamic_batching": {"max_queue_delay_ms": DELAY_MS, "max_queue_size": 1024,
                             "default_timeout_ms": 5000},
        "version_policy": {"latest": {"num_versions": 1}}})
    weights = work / "weights.pt"
    torch.save(net.state_dict(), weights)
    return repo, weights


@dataclass
class Started:
    proc: subprocess.Popen[bytes]
    url: str
    version: str


def start(name: str, work: Path, repo: Path, weights: Path) -> Started:
    port = free_port()
    env = {**os.environ, "BENCH_WEIGHTS": str(weights), "BENCH_PARAMS": json.dumps(PARAMS),
           "BENCH_MAX_BATCH": str(MAX_BATCH), "BENCH_DELAY_MS": str(DELAY_MS),
           "OMP_NUM_THREADS": "1"}
    log = (work / f"{name}.log").open("wb")
    ready = "/v2/health/ready"
    if name == "scalelab":
        cmd = [sys.executable, "-c", "from scalelab.cli import main; main()", "serve",
               "--model-repo", str(repo), "--port", str(port), "--torch-threads", "1",
               "--log-level", "warning"]
        version = "scalelab (this repo)"
    elif name == "fastapi":
        (work / "plain_app.py").write_text(FASTAPI_APP)
        cmd = [sys.executable, "-m", "uvicorn", "plain_app:app", "--port", str(port),
               "--host", "127.0.0.1", "--log-level", "warning", "--no-access-log",
               "--app-dir", str(work)]
        version = "fastapi (project venv)"
    elif name == "litserve":
        (work / "lit_app.py").write_text(LITSERVE_APP)
        cmd = [str(peer_python("litserve")), str(work / "lit_app.py"), str(port)]
        version = "litserve==0.2.19"
    elif name == "mlserver":
        py = peer_python("mlserver")
        mdir = work / "mlserver"
        (mdir / "flights").mkdir(parents=True, exist_ok=True)
        (mdir / "flights" / "model.py").write_text(MLSERVER_MODEL)
        (mdir / "settings.json").write_text(json.dumps({
            "http_port": port, "grpc_port": free_port(), "metrics_port": free_port(),
            "host": "127.0.0.1", "parallel_workers": 1, "debug": False}))
        (mdir / "flights" / "model-settings.json").write_text(json.dumps({
            "name": "flights", "implementation": "model.Flights",
            "max_batch_size": MAX_BATCH, "max_batch_time": DELAY_MS / 1000}))
        cmd = [str(py.parent / "mlserver"), "start", str(mdir)]
        ready = "/v2/models/flights/ready"
        version = "mlserver==1.7.1"
    else:
        raise SystemExit(f"unknown server {name}")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=work)
    url = f"http://127.0.0.1:{port}"
    import httpx

    t0 = time.monotonic()
    while time.monotonic() - t0 < 180:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited {proc.returncode}; see {work / (name + '.log')}")
        try:
            if httpx.get(url + ready, timeout=2).status_code == 200:
                return Started(proc, url, version)
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    stop(proc)
    raise RuntimeError(f"{name} not ready in 180 s; see {work / (name + '.log')}")


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def bodies(n: int, seed: int = 0) -> list[bytes]:
    rng = np.random.default_rng(seed)
    cards = PARAMS["cardinalities"]
    out = []
    for _ in range(n):
        cat = [int(rng.integers(0, c)) for c in cards]  # type: ignore[attr-defined]
        num = [round(float(x), 5) for x in rng.normal(size=14)]
        out.append(json.dumps({"inputs": [
            {"name": "categorical", "datatype": "INT64", "shape": [1, 4], "data": cat},
            {"name": "numeric", "datatype": "FP32", "shape": [1, 14], "data": num}]}).encode())
    return out


@dataclass
class Level:
    offered_rps: float
    achieved_rps: float
    ok: int
    errors: int
    p50_ms: float
    p95_ms: float
    p99_ms: float


async def run_level(url: str, rate: float, seconds: float, payloads: list[bytes],
                    start_index: int, max_inflight: int = 1024) -> Level:
    """Open loop at `rate` req/s for `seconds`; latency from each request's scheduled time."""
    import aiohttp

    n = int(rate * seconds)
    lat: list[float] = []
    errors = 0
    inflight = 0
    conn = aiohttp.TCPConnector(limit=max_inflight, force_close=False)
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as session:
        t0 = time.perf_counter() + 0.05

        async def one(i: int) -> None:
            nonlocal errors, inflight
            scheduled = t0 + i / rate
            delay = scheduled - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if inflight >= max_inflight:
                errors += 1  # the client refuses to pile up more: counted as a failure
                return
            inflight += 1
            try:
                async with session.post(url, data=payloads[(start_index + i) % len(payloads)],
                                        headers={"content-type": "application/json"}) as r:
                    await r.read()
                    if r.status == 200:
                        lat.append(time.perf_counter() - scheduled)
                    else:
                        errors += 1
            except (TimeoutError, aiohttp.ClientError):
                errors += 1
            finally:
                inflight -= 1

        await asyncio.gather(*(one(i) for i in range(n)))
        wall = time.perf_counter() - t0
    ms = np.array(lat) * 1000 if lat else np.array([np.nan])
    return Level(offered_rps=rate, achieved_rps=len(lat) / wall, ok=len(lat), errors=errors,
                 p50_ms=float(np.percentile(ms, 50)), p95_ms=float(np.percentile(ms, 95)),
                 p99_ms=float(np.percentile(ms, 99)))


def collapsed(lv: Level, slo_ms: float) -> bool:
    """Far past saturation: higher rates would only measure the collapse."""
    return lv.p95_ms > 4 * slo_ms or lv.errors > 0.2 * max(1, lv.ok + lv.errors)


def best(levels: list[Level], slo_ms: float) -> Level | None:
    good = [lv for lv in levels if lv.p95_ms <= slo_ms and lv.errors <= 0.01 * (lv.ok + lv.errors)]
    return max(good, key=lambda lv: lv.achieved_rps) if good else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--slo-ms", type=float, default=50.0, help="p95 objective")
    ap.add_argument("--seconds", type=float, default=5.0, help="duration of each rate level")
    ap.add_argument("--rates", default="50,100,200,300,450,650,900,1300,1800",
                    help="offered request rates, ascending")
    ap.add_argument("--only", default="scalelab,fastapi,litserve,mlserver")
    ap.add_argument("--repeats", type=int, default=3,
                    help="runs per level and server; the median-p95 run is reported")
    ap.add_argument("--hidden", default="128,128",
                    help="hidden layer widths of the MLP (bigger = more compute per row)")
    ap.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = ap.parse_args()
    PARAMS["hidden"] = [int(h) for h in args.hidden.split(",")]
    rates = [float(x) for x in args.rates.split(",")]
    payloads = bodies(int(max(rates) * args.seconds) * 2 + 1000)
    results: dict[str, dict[str, object]] = {}
    names = args.only.split(",")
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmp:
        work = Path(tmp)
        repo, weights = make_model(work)
        servers: dict[str, Started] = {}
        try:
            for name in names:
                print(f"[start] {name}", file=sys.stderr)
                try:
                    servers[name] = start(name, work, repo, weights)
                except (RuntimeError, subprocess.CalledProcessError) as e:
                    log = work / f"{name}.log"
                    tail = log.read_text(errors="replace")[-1500:] if log.exists() else ""
                    print(f"    FAILED to start: {e}\n{tail}", file=sys.stderr)
                    results[name] = {"error": str(e), "log_tail": tail}
            levels: dict[str, list[Level]] = {n: [] for n in servers}
            for srv in servers.values():  # warm-up
                asyncio.run(run_level(f"{srv.url}/v2/models/flights/infer", 20, 1.0, payloads, 0))
            idx = 0
            # servers take turns at each rate, so background load on a shared machine hits
            # every server alike instead of whichever happened to run during a busy minute
            for rate in rates:
                live = [n for n in servers
                        if not (levels[n] and collapsed(levels[n][-1], args.slo_ms))]
                runs: dict[str, list[Level]] = {n: [] for n in live}
                for _ in range(args.repeats):
                    for n in live:
                        runs[n].append(asyncio.run(run_level(
                            f"{servers[n].url}/v2/models/flights/infer", rate, args.seconds,
                            payloads, idx)))
                        idx += int(rate * args.seconds)
                for n in live:
                    # the repeat with the median p95 stands for the level: one background
                    # spike on a shared machine should not decide a server's capacity
                    lv = sorted(runs[n], key=lambda x: x.p95_ms)[len(runs[n]) // 2]
                    levels[n].append(lv)
                    p95s = ", ".join(f"{x.p95_ms:.1f}" for x in runs[n])
                    print(f"  {n:9s} offered {rate:6.0f}/s got {lv.achieved_rps:7.1f}/s  p50 "
                          f"{lv.p50_ms:7.1f} p95 {lv.p95_ms:7.1f} p99 {lv.p99_ms:7.1f} ms  "
                          f"errors {lv.errors}  (p95 of repeats: {p95s})", file=sys.stderr)
        finally:
            for srv in servers.values():
                stop(srv.proc)
        for n, srv in servers.items():
            b = best(levels[n], args.slo_ms)
            results[n] = {"version": srv.version, "levels": [asdict(lv) for lv in levels[n]],
                          "best": asdict(b) if b else None}
        results = {n: results[n] for n in names if n in results}
    from scalelab.core.machine import current_machine

    machine = current_machine()
    print(f"\nmachine: {machine}; load average {os.getloadavg()}; SLO p95 <= {args.slo_ms} ms; "
          f"{args.seconds:.0f} s per level x {args.repeats} (median p95); 1 row per request; "
          f"hidden {PARAMS['hidden']}; "
          f"batch <= {MAX_BATCH}, delay {DELAY_MS} ms\n")
    ours = (results.get("scalelab") or {}).get("best")
    ours_rps = ours["achieved_rps"] if isinstance(ours, dict) else None
    print(f"| server | max rps (p95 <= {args.slo_ms:.0f} ms) | vs scalelab | p50 ms | p95 ms "
          "| p99 ms |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, r in results.items():
        b = r.get("best")
        if "error" in r:
            print(f"| {name} | failed: {str(r['error'])[:60]} | | | | |")
        elif not isinstance(b, dict):
            print(f"| {r['version']} | none met the SLO | | | | |")
        else:
            ratio = f"{b['achieved_rps'] / ours_rps:.2f}x" if ours_rps else "-"
            print(f"| {r['version']} | {b['achieved_rps']:.0f} | {ratio} | {b['p50_ms']:.1f} "
                  f"| {b['p95_ms']:.1f} | {b['p99_ms']:.1f} |")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"machine": asdict(machine), "slo_ms": args.slo_ms,
                                        "results": results}, indent=2, default=str))


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "src"))
    main()
