"""Weights settings side by side: fp32, int8 (from fp32) and q4 (the GGUF's own blocks).

Run: .venv/bin/python benchmarks/bench_weights.py [--model smollm2-135m] [--threads 2]
                                                  [--tokens 64] [--out FILE]
     (also: benchmarks/bench_generate.py --only weights)

Per setting, each in its own process so memory does not carry over:
- tokens/s of our engine for 1 stream and for 8 concurrent sequences (greedy, ignore_eos, the
  same prompt and exactly --tokens output tokens each), best of --rounds;
- weight bytes as they run (quant.weight_bytes: oneDNN-packed copies included);
- RSS of a real `scalelab generate serve` process after one completion (VmRSS and VmHWM).
Then quality against fp32 of the same file (scalelab.system.generate.quality): perplexity and
teacher-forced next-token agreement on the shipped held-out text, greedy agreement over --tokens
tokens on its 24 prompts; with --llamacpp PYTHON (an interpreter with llama-cpp-python:
benchmarks/.venvs/llamacpp, `make llamacpp`) also each setting's next-token agreement with
llama.cpp on the same GGUF file and ids. Ratios are against fp32. A shared two-core machine: the
load average is printed beside every number.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SETTINGS = ("fp32", "int8", "q4")
PROMPT = "The history of the printing press begins"


def loadavg() -> float:
    return os.getloadavg()[0]


def child(model: str, weights: str, threads: int, tokens: int, rounds: int) -> dict[str, Any]:
    """One setting's throughput and weight bytes (runs in its own process)."""
    import torch

    from scalelab.system.generate.engine import LlmEngine, LlmEngineConfig
    from scalelab.system.generate.linears import weight_bytes
    from scalelab.system.generate.models import load_model
    from scalelab.system.generate.sequence import SamplingParams

    torch.set_num_threads(threads)
    lm = load_model(model, 1024, weights=weights)
    eng = LlmEngine(lm.model, lm.tokenizer, LlmEngineConfig(kv_cache_bytes=128 << 20,
                                                            max_model_len=1024, max_num_seqs=8))
    ids = lm.tokenizer.encode(PROMPT)
    params = SamplingParams(max_tokens=tokens, ignore_eos=True)
    eng.generate([ids], SamplingParams(max_tokens=4, ignore_eos=True))  # warm-up
    out: dict[str, Any] = {"weights": weights, "weight_bytes": weight_bytes(lm.model)}
    for n in (1, 8):
        best = 0.0
        for _ in range(rounds):
            t0 = time.perf_counter()
            seqs = eng.generate([list(ids)] * n, params)
            dt = time.perf_counter() - t0
            assert all(s.num_output == tokens for s in seqs)
            best = max(best, n * tokens / dt)
        out[f"tokens_per_s_{n}"] = round(best, 2)
    out["load"] = loadavg()
    return out


def kernels(reps: int = 5) -> dict[str, Any]:
    """One SmolLM2 decode step's linears (30 layers of q,k,v,o,gate,up,down + the 49152-row
    output layer) at 1 and 8 rows, per candidate kernel; min over reps of each product, ms.
    At one thread: on a shared machine two threads' OpenMP hand-offs swamp products this small
    (a first run at two threads put every candidate 20-500x above its one-thread time)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    layer = [(576, 576, 2), (192, 576, 2), (1536, 576, 2), (576, 1536, 1)]  # (N, K, count)
    shapes = [(n, k, c * 30) for n, k, c in layer] + [(49152, 576, 1)]

    def timed(f: Any) -> float:
        f()
        best = float("inf")
        for _ in range(reps):
            t0 = time.perf_counter()
            f()
            best = min(best, time.perf_counter() - t0)
        return best

    out: dict[str, Any] = {}
    for rows in (1, 8):
        tot: dict[str, float] = {}
        for n, k, count in shapes:
            w = torch.randn(n, k, generator=g)
            q4 = torch.randint(0, 16, (n, k), dtype=torch.int32, generator=g)
            q8 = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=g)
            packed4 = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q4, 2)
            nib = (q4[:, ::2] | (q4[:, 1::2] << 4)).to(torch.uint8)
            d = torch.rand(n, k // 32)
            onednn = torch.ops.mkldnn._reorder_linear_weight(w, None)
            x = torch.randn(rows, k, generator=g)

            def deq(x: Any = x, nib: Any = nib, d: Any = d, n: int = n, k: int = k) -> Any:
                q = torch.stack([nib & 15, nib >> 4], -1).view(n, k // 32, 32).float()
                return torch.nn.functional.linear(x, (q * d[..., None] - d[..., None]).view(n, k))

            cands: dict[str, Any] = {"fp32 oneDNN-packed (today)": lambda x=x, o=onednn:
                                     torch.ops.mkldnn._linear_pointwise(x, o, None, "none", [], ""),
                                     "fp32 plain (MKL)": lambda x=x, w=w: x @ w.T,
                                     "q4 dequantize-then-matmul (torch ops)": deq}
            for dt, tag in ((torch.float32, "fp32"), (torch.bfloat16, "bf16")):
                xd, sz = x.to(dt), torch.rand(k // 32, n, 2, generator=g).to(dt)
                sc = torch.rand(n, generator=g).to(dt)
                cands[f"int4pack_mm_for_cpu, {tag} activations"] = (
                    lambda xd=xd, p=packed4, sz=sz:
                    torch.ops.aten._weight_int4pack_mm_for_cpu(xd, p, 32, sz))
                cands[f"int8pack_mm, {tag} activations"] = (
                    lambda xd=xd, q8=q8, sc=sc: torch.ops.aten._weight_int8pack_mm(xd, q8, sc))
            for name, f in cands.items():
                tot[name] = tot.get(name, 0.0) + count * timed(f)
        out[f"rows_{rows}_ms"] = {name: round(v * 1e3, 2) for name, v in tot.items()}
        print(f"[kernels] one decode step's linears at {rows} row(s), ms: "
              + ", ".join(f"{k} {v * 1e3:.1f}" for k, v in tot.items())
              + f"; load {loadavg():.1f}", flush=True)
    torch.set_num_threads(before)
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _status_kb(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {key} in /proc/{pid}/status")


def server_rss(model: str, weights: str, threads: int, timeout_s: float = 300) -> dict[str, Any]:
    """RSS of `scalelab generate serve --weights W` after one 16-token completion."""
    port = _free_port()
    cmd = [sys.executable, "-m", "scalelab", "generate", "serve", "--model", model,
           "--weights", weights, "--port", str(port), "--torch-threads", str(threads),
           "--kv-cache-bytes", "128MiB", "--max-model-len", "1024"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"serve exited: {proc.stderr.read().decode()[-500:]}")
            try:
                with urllib.request.urlopen(base + "/health", timeout=2):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("serve did not become healthy") from None
                time.sleep(0.5)
        with urllib.request.urlopen(base + "/v1/models", timeout=10) as r:
            served = json.loads(r.read())["data"][0]["id"]
        body = json.dumps({"model": served, "prompt": PROMPT, "max_tokens": 16}).encode()
        req = urllib.request.Request(base + "/v1/completions", body,
                                     {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            r.read()
        return {"rss_bytes": _status_kb(proc.pid, "VmRSS") * 1024,
                "peak_rss_bytes": _status_kb(proc.pid, "VmHWM") * 1024}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run(model: str, threads: int, tokens: int, rounds: int,
        llamacpp: Path | None = None) -> dict[str, Any]:
    """`llamacpp`: an interpreter with llama-cpp-python; each setting's teacher-forced
    next-token agreement with llama.cpp on the same file goes beside its perplexity."""
    import torch

    from scalelab.system.generate.quality import evaluate, reference

    kern = kernels()
    rows: dict[str, dict[str, Any]] = {}
    for w in SETTINGS:
        cmd = [sys.executable, __file__, "--child", w, "--model", model, "--threads",
               str(threads), "--tokens", str(tokens), "--rounds", str(rounds)]
        res = subprocess.run(cmd, capture_output=True, text=True, check=True)
        rows[w] = json.loads(res.stdout.strip().splitlines()[-1])
        rows[w].update(server_rss(model, w, threads))
        r = rows[w]
        print(f"[weights] {w:>5}: 1 stream {r['tokens_per_s_1']} tok/s, 8 concurrent "
              f"{r['tokens_per_s_8']} tok/s, weights {r['weight_bytes'] / 1e6:.1f} MB, server "
              f"RSS {r['rss_bytes'] / 1e6:.0f} MB (peak {r['peak_rss_bytes'] / 1e6:.0f}); "
              f"load {r['load']:.1f}", flush=True)
    torch.set_num_threads(threads)
    ref = reference(model, num_tokens=tokens,
                    llamacpp=None if llamacpp is None else str(llamacpp))
    lc = ref.llamacpp
    for w in SETTINGS:
        q = evaluate(model, w, num_tokens=tokens, ref=ref).to_dict()
        rows[w]["quality"] = {k: q[k] for k in (
            "perplexity", "perplexity_change_pct", "agreement", "identical", "prompts",
            "passes", "next_token_agreement", "positions", "llamacpp_agreement",
            "llamacpp_near_ties")}
        base = rows["fp32"]
        rows[w]["ratio_1"] = round(rows[w]["tokens_per_s_1"] / base["tokens_per_s_1"], 2)
        rows[w]["ratio_8"] = round(rows[w]["tokens_per_s_8"] / base["tokens_per_s_8"], 2)
        rows[w]["weight_share"] = round(rows[w]["weight_bytes"] / base["weight_bytes"], 3)
        rows[w]["rss_share"] = round(rows[w]["rss_bytes"] / base["rss_bytes"], 3)
        vs = ("" if lc is None else f", next token {q['llamacpp_agreement']:.1%} llama.cpp's "
              f"({q['llamacpp_near_ties']} of the differences near ties)")
        print(f"[weights] {w:>5}: perplexity {q['perplexity']:.3f} "
              f"({q['perplexity_change_pct']:+.2f}% vs fp32), next token (teacher-forced, "
              f"{q['positions']} positions) {q['next_token_agreement']:.1%} fp32's{vs}, "
              f"greedy agreement {q['agreement']:.2f} "
              f"({q['identical']}/{q['prompts']} identical), {rows[w]['ratio_1']}x / "
              f"{rows[w]['ratio_8']}x fp32's tokens/s at 1 / 8, weights "
              f"{rows[w]['weight_share']:.0%} and RSS {rows[w]['rss_share']:.0%} of fp32's, "
              f"gate {'pass' if q['passes'] else 'FAIL'}", flush=True)
    passing = [w for w in SETTINGS if rows[w]["quality"]["passes"]]
    fastest = max(passing, key=lambda w: rows[w]["tokens_per_s_1"] + rows[w]["tokens_per_s_8"] / 8)
    if lc is not None:
        print(f"[weights] llama.cpp {lc.version}, same file and ids: perplexity "
              f"{lc.perplexity:.3f}", flush=True)
    return {"model": model, "threads": threads, "tokens": tokens, "kernels": kern,
            "settings": rows,
            "llamacpp": None if lc is None else {"version": lc.version,
                                                 "perplexity": lc.perplexity},
            "fastest_passing": fastest, "load_end": loadavg()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--llamacpp", type=Path, default=None,
                    help="a Python with llama-cpp-python: next-token agreement with llama.cpp")
    ap.add_argument("--child", choices=SETTINGS, help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, default=HERE / "out" / "weights.json")
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.model, args.child, args.threads, args.tokens, args.rounds)))
        return
    print(f"model {args.model}, torch threads {args.threads}, load average {loadavg():.1f} "
          "(a shared machine: other jobs run beside this)", flush=True)
    res = run(args.model, args.threads, args.tokens, args.rounds, args.llamacpp)
    print(f"fastest setting that passes the quality gate: {res['fastest_passing']}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
