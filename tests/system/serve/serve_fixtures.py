"""A small flights-like model repository and a real server process, for the serve tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import torch

from scalelab.layers.nets.registry import save_module
from scalelab.layers.nets.repository import write_json
from scalelab.layers.nets.tabular import TabularConfig, TabularNet

CAT = {"carrier": ["<UNK>", "UA", "B6", "EV", "DL"], "origin": ["<UNK>", "EWR", "JFK", "LGA"],
       "dest": ["<UNK>", "ATL", "ORD", "LAX", "BOS", "MCO"],
       "plane_model": ["<UNK>", "UNKNOWN", "A320"]}
NUMERIC = ["month", "day_of_week", "sched_dep_hour", "sched_arr_hour", "distance", "plane_year",
           "plane_seats", "temp", "dewp", "humid", "wind_speed", "precip", "pressure", "visib"]
CLASSES = ["on_time", "late_15_60", "late_60_plus", "cancelled"]
PREPROCESS = {"categorical": CAT,
              "numeric": {c: {"mean": 10.0 + i, "std": 2.0 + i} for i, c in enumerate(NUMERIC)},
              "classes": CLASSES}
PARAMS = {"cardinalities": [len(v) for v in CAT.values()], "n_numeric": len(NUMERIC),
          "hidden": [16], "n_classes": 4}


def flights_config(name: str, **over: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "name": name, "platform": "scalelab-torch",
        "inputs": [{"name": "categorical", "datatype": "INT64", "shape": [-1, 4]},
                   {"name": "numeric", "datatype": "FP32", "shape": [-1, 14]}],
        "outputs": [{"name": "probabilities", "datatype": "FP32", "shape": [-1, 4]},
                    {"name": "label", "datatype": "INT64", "shape": [-1]}],
        "max_batch_size": 64,
        "dynamic_batching": {"max_queue_delay_ms": 2, "preferred_batch_sizes": [],
                             "max_queue_size": 256, "default_timeout_ms": 1000},
        "version_policy": {"latest": {"num_versions": 2}}}
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(cfg.get(k), dict):
            cfg[k] = {**cfg[k], **v}
        else:
            cfg[k] = v
    return cfg


def add_version(repo: Path, name: str, version: int, *, seed: int, arch: str = "tabular_mlp",
                extra_params: dict[str, Any] | None = None) -> Path:
    torch.manual_seed(seed)
    net = TabularNet(TabularConfig(**PARAMS))
    vdir = repo / name / str(version)
    save_module(vdir, net, arch=arch, params={**PARAMS, **(extra_params or {})})
    write_json(vdir / "preprocess.json", PREPROCESS)
    write_json(vdir / "manifest.json", {"version": version, "seed": seed})
    return vdir


def add_model(repo: Path, name: str, versions: dict[int, int], *, arch: str = "tabular_mlp",
              extra_params: dict[str, Any] | None = None, **cfg: Any) -> None:
    (repo / name).mkdir(parents=True, exist_ok=True)
    write_json(repo / name / "config.json", flights_config(name, **cfg))
    for v, seed in versions.items():
        add_version(repo, name, v, seed=seed, arch=arch, extra_params=extra_params)


def sample_inputs(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    cat = np.stack([rng.integers(0, len(v), n) for v in CAT.values()], axis=1).astype(np.int64)
    num = rng.normal(size=(n, len(NUMERIC))).astype(np.float32)
    return cat, num


def infer_body(n: int = 1, seed: int = 0, *, poison: bool = False, rid: str | None = None
               ) -> dict[str, Any]:
    cat, num = sample_inputs(n, seed)
    if poison:
        num[0, 0] = -999.0
    body: dict[str, Any] = {"inputs": [
        {"name": "categorical", "datatype": "INT64", "shape": [n, 4], "data": cat.tolist()},
        {"name": "numeric", "datatype": "FP32", "shape": [n, 14], "data": num.ravel().tolist()}]}
    if rid is not None:
        body["id"] = rid
    return body


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path

    def logs(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")

    def stop(self, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def start_server(repo: Path, log: Path, *extra: str, env: dict[str, str] | None = None,
                 deadline_s: float = 60.0) -> Server:
    port = free_port()
    cmd = [sys.executable, "-c", "from scalelab.cli import main; main()", "serve",
           "--model-repo", str(repo), "--port", str(port), "--poll-seconds", "0.1", *extra]
    full_env = {k: v for k, v in os.environ.items() if k != "SCALELAB_ADMIN_TOKEN"}
    full_env.update(env or {})
    with log.open("wb") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=full_env)
    srv = Server(url=f"http://127.0.0.1:{port}", proc=proc, log=log)
    t0 = time.monotonic()
    while time.monotonic() - t0 < deadline_s:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited {proc.returncode}:\n{srv.logs()[-3000:]}")
        try:
            if httpx.get(f"{srv.url}/v2/health/ready", timeout=1).status_code == 200:
                return srv
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    srv.stop()
    raise RuntimeError(f"server not ready in {deadline_s} s:\n{srv.logs()[-3000:]}")


class Evil:
    """Unpickling this creates a file: proof that something was unpickled."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (self.marker, "w"))




def predict(repo: Path, model: str, version: int, cat: np.ndarray, num: np.ndarray) -> np.ndarray:
    from scalelab.layers.nets.registry import load_module

    net = load_module(repo / model / str(version))
    with torch.inference_mode():
        return net(torch.from_numpy(cat), torch.from_numpy(num)).argmax(1).numpy()


def write_holdout(path: Path, repo: Path, model: str, label_version: int, n: int = 300,
                  seed: int = 1) -> Path:
    """A holdout table in the flights contract whose labels are `label_version`'s predictions
    (so that version is perfect on it and any other version is worse)."""
    import polars as pl

    from scalelab.system.serve.features import decode, encode, load_preprocess

    pre = load_preprocess(repo / model / str(label_version))
    assert pre is not None
    cat, num = sample_inputs(n, seed)
    frame = pl.DataFrame(decode(cat, num, pre))
    frame = frame.with_columns([pl.col(c).cast(pl.Float64) for c in pre.numeric])
    c2, n2 = encode(frame, pre)
    labels = predict(repo, model, label_version, c2, n2)
    frame = frame.with_columns(pl.Series("delay_class", labels, dtype=pl.Int8))
    frame.write_parquet(path)
    return path
