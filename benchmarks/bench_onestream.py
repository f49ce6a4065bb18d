"""One decode stream, ours against llama.cpp on the same Q4_1 file, ids, threads and lengths.

Run: .venv/bin/python benchmarks/bench_onestream.py [--threads 1,2] [--tokens 64] [--rounds 3]
                                                    [--before-src /work/main/src]
     (also `benchmarks/bench_generate.py --only onestream`)

Every engine is a child process started once and kept, answering one measurement per line on
stdin: ours (`--weights q4`, max_num_seqs=1, the wait setting `scalelab generate` takes, one
process per source tree and thread count: --before-src adds a second tree, e.g. main's, so a
change's before/after ratio comes from the same run) and llama.cpp's (llama-cpp-python in
benchmarks/.venvs/llamacpp, its C API as llamacpp_peer.py's "batched1": one llama_batch per
step, greedy argmax of the logits, the weights in its plain CPU buffers as
generate/llamacpp_logits.py explains). A measurement is one prompt's prefill and `--tokens`
greedy tokens, EOS ignored on both sides. Rounds alternate every engine, so the machine's other
load falls on all alike; a figure is the median of the rounds with their range, the load
average beside it (the machine is shared).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PROMPT = "Tell me about the time and the river."

PEER = r"""
import ctypes, json, sys, time
import llama_cpp
import numpy as np
from llama_cpp._logger import set_verbose
path, threads, ids = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
llama_cpp.llama_backend_init()
set_verbose(False)
mp = llama_cpp.llama_model_default_params()
mp.use_extra_bufts = False
model = llama_cpp.llama_model_load_from_file(path.encode(), mp)
n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))
cp = llama_cpp.llama_context_default_params()
cp.n_ctx, cp.n_batch, cp.n_ubatch = 1024, 512, 512
cp.n_threads = cp.n_threads_batch = threads
ctx = llama_cpp.llama_init_from_model(model, cp)
batch = llama_cpp.llama_batch_init(512, 0, 1)
def decode(toks, start):
    for i, t in enumerate(toks):
        batch.token[i], batch.pos[i], batch.n_seq_id[i] = t, start + i, 1
        batch.seq_id[i][0], batch.logits[i] = 0, i == len(toks) - 1
    batch.n_tokens = len(toks)
    if llama_cpp.llama_decode(ctx, batch) != 0:
        raise RuntimeError("llama_decode failed")
    ptr = llama_cpp.llama_get_logits_ith(ctx, len(toks) - 1)
    row = np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)), shape=(n_vocab,))
    return int(row.argmax())
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    n = int(line)
    llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ctx), True)
    t0, c0 = time.perf_counter(), time.process_time()
    out = [decode(ids, 0)]
    while len(out) < n:
        out.append(decode([out[-1]], len(ids) + len(out) - 1))
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    print(json.dumps({"tokens_per_s": n / dt, "cpu_ms_per_token": 1e3 * cpu / n, "ids": out}),
          flush=True)
"""


def loadavg() -> float:
    return os.getloadavg()[0]


def child(threads: int) -> None:
    """Our engine at one stream: one JSON line per token count read from stdin."""
    try:
        from scalelab.system.generate.threads import passive_wait
    except ImportError:  # a tree from before the wait setting
        pass
    else:
        passive_wait()
    import torch

    from scalelab.system.generate.engine import LlmEngine, LlmEngineConfig
    from scalelab.system.generate.models import load_model
    from scalelab.system.generate.sequence import SamplingParams

    torch.set_num_threads(threads)
    lm = load_model("smollm2-135m", 1024, weights="q4")
    eng = LlmEngine(lm.model, lm.tokenizer, LlmEngineConfig(
        kv_cache_bytes=64 << 20, max_model_len=1024, max_num_seqs=1))
    ids = lm.tokenizer.encode(PROMPT)
    eng.generate([ids], SamplingParams(max_tokens=4, ignore_eos=True))  # warm-up
    print(json.dumps({"ready": True, "ids": ids}), flush=True)
    for line in sys.stdin:
        t0, c0 = time.perf_counter(), time.process_time()
        (seq,) = eng.generate([ids], SamplingParams(max_tokens=int(line), ignore_eos=True))
        dt, cpu = time.perf_counter() - t0, time.process_time() - c0
        print(json.dumps({"tokens_per_s": seq.num_output / dt,
                          "cpu_ms_per_token": 1e3 * cpu / seq.num_output,
                          "ids": seq.output_ids}), flush=True)


class Worker:
    """A child process answering `tokens_per_s(n)` one line at a time."""

    def __init__(self, argv: list[str], env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env=env)
        self.hello: dict[str, Any] = self._read()

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"worker {self.proc.args!r} exited ({self.proc.wait()})")
        out: dict[str, Any] = json.loads(line)
        return out

    def run(self, tokens: int) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{tokens}\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


def _ours(src: str, threads: int) -> Worker:
    env = {**os.environ, "PYTHONPATH": src}
    return Worker([sys.executable, __file__, "--child", "--threads", str(threads)], env)


def _summary(xs: list[float], digits: int = 1) -> dict[str, float]:
    return {"median": round(statistics.median(xs), digits), "min": round(min(xs), digits),
            "max": round(max(xs), digits)}


def run(threads: list[int], tokens: int, rounds: int, trees: dict[str, str],
        peer_python: Path, gguf: str) -> dict[str, Any]:
    """{threads: {engine: tokens/s summary, ratios}} with loads, rounds alternating engines."""
    out: dict[str, Any] = {"tokens": tokens, "rounds": rounds, "load_start": loadavg()}
    for n in threads:
        ours = {name: _ours(src, n) for name, src in trees.items()}
        ids = next(iter(ours.values())).hello["ids"]
        peer = Worker([str(peer_python), "-c", PEER, gguf, str(n), json.dumps(ids)])
        engines = {**ours, "llama.cpp": peer}
        got: dict[str, list[float]] = {k: [] for k in engines}
        cpu: dict[str, list[float]] = {k: [] for k in engines}
        outputs: dict[str, list[int]] = {}
        loads = []
        try:
            for w in engines.values():
                w.run(8)  # warm
            for _ in range(rounds):
                loads.append(loadavg())
                for k, w in engines.items():
                    r = w.run(tokens)
                    got[k].append(r["tokens_per_s"])
                    cpu[k].append(r["cpu_ms_per_token"])
                    outputs[k] = r["ids"]
        finally:
            for w in engines.values():
                w.close()
        row: dict[str, Any] = {k: _summary(v) for k, v in got.items()}
        for k in trees:
            row[f"ratio_{k}"] = round(statistics.median(
                a / b for a, b in zip(got[k], got["llama.cpp"], strict=True)), 2)
        row["cpu_ms_per_token"] = {k: _summary(v, 2) for k, v in cpu.items()}
        row["same_ids_as_this"] = {k: outputs[k] == outputs["this"] for k in trees}
        row["load"] = [round(x, 2) for x in loads]
        out[f"{n}_threads"] = row
        print(f"[onestream] {n} thread(s), {tokens} tokens, {rounds} alternating rounds, "
              f"load {min(loads):.1f}-{max(loads):.1f}: "
              + "; ".join(f"{k} {s['median']} tok/s ({s['min']}-{s['max']})"
                          for k, s in row.items() if k in engines)
              + "; ours/llama.cpp " + ", ".join(f"{k} {row[f'ratio_{k}']}x" for k in trees)
              + "; CPU ms a token " + ", ".join(
                  f"{k} {v['median']}" for k, v in row["cpu_ms_per_token"].items()),
              flush=True)
    out["load_end"] = loadavg()
    return out


OP_GROUPS = {
    "int4 products": ("_weight_int4pack_mm",),
    "RMSNorm": ("rms_norm", "pow", "sum", "div_", "rsqrt"),
    "attention (KV write, SDPA)": ("scaled_dot_product", "index_copy", "index_select"),
    "dtype casts and copies": ("copy_", "_to_copy", "to", "empty", "empty_strided", "roll"),
    "elementwise (residual, RoPE, SwiGLU)": ("add", "add_", "mul", "silu", "silu_", "cat",
                                             "neg"),
}


def _group(op: str) -> str:
    name = op.removeprefix("aten::")
    for group, keys in OP_GROUPS.items():
        if any(name == k or (k.startswith("_") and k in name) or
               (k in ("scaled_dot_product", "rms_norm") and k in name) for k in keys):
            return group
    return "views, indexing, the rest"


def profile_step(threads: int, steps: int = 40) -> dict[str, Any]:
    """Where one decode step at one stream goes, in this process (--weights q4): torch.profiler's
    self CPU time per op and per group of ops (ms per step, share), and cProfile's split of
    the engine's step into the forward and everything around it (scheduling, sampling,
    detokenization, the runner's per-step tensors)."""
    import cProfile
    import pstats

    import torch
    from torch.profiler import ProfilerActivity, profile

    from scalelab.system.generate.engine import LlmEngine, LlmEngineConfig
    from scalelab.system.generate.models import load_model
    from scalelab.system.generate.sequence import SamplingParams

    torch.set_num_threads(threads)
    lm = load_model("smollm2-135m", 1024, weights="q4")
    eng = LlmEngine(lm.model, lm.tokenizer, LlmEngineConfig(
        kv_cache_bytes=64 << 20, max_model_len=1024, max_num_seqs=1))
    eng.add(lm.tokenizer.encode(PROMPT), SamplingParams(max_tokens=3 * steps + 8,
                                                        ignore_eos=True))
    for _ in range(4):
        eng.step()
    la = loadavg()
    t0 = time.perf_counter()
    for _ in range(steps):
        eng.step()
    wall = (time.perf_counter() - t0) / steps
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            eng.step()
    ops = [(k.key, k.count / steps, k.self_cpu_time_total / steps / 1e3)
           for k in prof.key_averages()]
    total = sum(ms for _, _, ms in ops) or 1.0
    groups: dict[str, float] = {}
    for key, _, ms in ops:
        groups[_group(key)] = groups.get(_group(key), 0.0) + ms
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(steps):
        eng.step()
    pr.disable()
    st = pstats.Stats(pr).stats  # type: ignore[attr-defined]
    step_s = sum(v[3] for k, v in st.items() if k[2] == "step" and k[0].endswith("engine.py"))
    fwd_s = sum(v[3] for k, v in st.items() if k[2] == "__call__" and k[0].endswith("forward.py"))
    out = {
        "threads": threads,
        "step_ms": round(1e3 * wall, 2),
        "profiled_cpu_ms": round(total, 2),
        "ops": [{"op": k, "calls": round(c, 1), "ms": round(ms, 3), "share": round(ms / total, 3)}
                for k, c, ms in sorted(ops, key=lambda o: -o[2])[:20]],
        "groups": {g: {"ms": round(ms, 2), "share": round(ms / total, 3)}
                   for g, ms in sorted(groups.items(), key=lambda g: -g[1])},
        "forward_share_of_step": round(fwd_s / step_s, 3) if step_s else None,
        "load": la,
        "load_end": loadavg(),
    }
    print(f"[profile] one stream, {threads} thread(s): step {out['step_ms']} ms wall; "
          f"torch.profiler self CPU {out['profiled_cpu_ms']} ms/step (profiler overhead "
          f"included); the forward {out['forward_share_of_step']:.1%} of the engine's step "
          f"(cProfile); load {la:.1f}", flush=True)
    for g, v in out["groups"].items():
        print(f"  {g:40s} {v['ms']:7.2f} ms {v['share']:6.1%}", flush=True)
    for o in out["ops"][:12]:
        print(f"    {o['op'][:48]:48s} {o['calls']:6.1f}/step {o['ms']:7.3f} ms "
              f"{o['share']:6.1%}", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--before-src", default=None)
    ap.add_argument("--out", default=None)
    ap.add_argument("--profile", action="store_true",
                    help="only the per-op profile of one decode step, in this process")
    args = ap.parse_args()
    if args.child:
        child(int(args.threads))
        return
    if args.profile:
        prof = {n: profile_step(int(n)) for n in args.threads.split(",")}
        if args.out:
            Path(args.out).write_text(json.dumps(prof, indent=2))
        return
    sys.path.insert(0, str(HERE))
    from bench_generate import llamacpp_python
    from scalelab.system.generate.gguf import smollm2_path

    trees = {"this": str(HERE.parent / "src")}
    if args.before_src:
        trees["before"] = args.before_src
    t0 = time.perf_counter()
    out = run([int(x) for x in args.threads.split(",")], args.tokens, args.rounds, trees,
              llamacpp_python(), str(smollm2_path()))
    print(f"[onestream] {time.perf_counter() - t0:.0f} s", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
