"""Generation beside a busy neighbour core: q4 tokens/s without and with one spinning process.

At 1 and 8 concurrent streams, with the machine otherwise as it is ("quiet") and with one
CPU-spinning process pinned to one core ("busy"), in-process and through `scalelab generate
serve`, optionally for a second source tree (--before-src, e.g. main's) in the same run.

Run: .venv/bin/python benchmarks/bench_neighbour.py [--model smollm2-135m] [--threads 2]
                                                    [--tokens 16] [--rounds 2]
                                                    [--before-src /work/main/src]
     (also `benchmarks/bench_generate.py --only neighbour`)

Each source tree gets one engine process of each kind, started once and kept: an in-process
engine (a child that, like the `scalelab generate` CLI, takes the tree's thread settings
before importing torch: system/generate/threads.py where the tree has it) answering one
measurement per line on stdin, and a `generate serve` driven over HTTP (n concurrent
/v1/completions, ignore_eos, `--tokens` each). Rounds alternate quiet and busy, and within each
the trees and the paths, so the machine's other load falls on all alike; a figure is the best
of the rounds. The load average is printed beside every figure: the machine is shared.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PROMPT = "The history of the printing press begins"
STREAMS = (1, 8)


def loadavg() -> float:
    return os.getloadavg()[0]


def child(model: str, threads: int) -> None:
    """The in-process engine: one JSON line per stream count read from stdin."""
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
    lm = load_model(model, 1024, weights="q4")
    eng = LlmEngine(lm.model, lm.tokenizer, LlmEngineConfig(kv_cache_bytes=128 << 20,
                                                            max_model_len=1024, max_num_seqs=8))
    ids = lm.tokenizer.encode(PROMPT)
    eng.generate([ids], SamplingParams(max_tokens=4, ignore_eos=True))  # warm-up
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        n, tokens = (int(x) for x in line.split())
        t0 = time.perf_counter()
        seqs = eng.generate([list(ids)] * n, SamplingParams(max_tokens=tokens, ignore_eos=True))
        dt = time.perf_counter() - t0
        out = sum(s.num_output for s in seqs)
        print(json.dumps({"tokens_per_s": out / dt, "tokens": out}), flush=True)


def _env(src: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = src
    return env


class InProcess:
    def __init__(self, src: str, model: str, threads: int) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--child", "--model", model, "--threads", str(threads)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=_env(src))
        assert self.proc.stdout is not None
        json.loads(self.proc.stdout.readline())  # ready

    def tokens_per_s(self, n: int, tokens: int) -> float:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{n} {tokens}\n")
        self.proc.stdin.flush()
        return float(json.loads(self.proc.stdout.readline())["tokens_per_s"])

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


class Served:
    def __init__(self, src: str, model: str, threads: int) -> None:
        from scalelab.layers.web.spawn import start_server

        cmd = [sys.executable, "-m", "scalelab", "generate", "serve", "--model", model,
               "--weights", "q4", "--torch-threads", str(threads)]
        self.spawned = start_server(lambda port: [*cmd, "--port", str(port)],
                                    ready_path="/health", timeout_s=300, env=_env(src))
        with urllib.request.urlopen(self.spawned.url + "/v1/models", timeout=30) as r:
            self.name = json.loads(r.read())["data"][0]["id"]
        self.tokens_per_s(1, 4)  # warm-up

    def _one(self, tokens: int, got: list[int]) -> None:
        body = json.dumps({"model": self.name, "prompt": PROMPT, "max_tokens": tokens,
                           "ignore_eos": True, "temperature": 0}).encode()
        req = urllib.request.Request(self.spawned.url + "/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=600) as r:
            got.append(int(json.loads(r.read())["usage"]["completion_tokens"]))

    def tokens_per_s(self, n: int, tokens: int) -> float:
        got: list[int] = []
        ts = [threading.Thread(target=self._one, args=(tokens, got)) for _ in range(n)]
        t0 = time.perf_counter()
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        dt = time.perf_counter() - t0
        if len(got) != n:
            raise RuntimeError(f"{n - len(got)} of {n} requests failed")
        return sum(got) / dt

    def close(self) -> None:
        from scalelab.layers.web.spawn import stop_group

        stop_group(self.spawned.proc)


@contextmanager
def spinner(busy: bool, core: int) -> Iterator[None]:
    """One process spinning on `core` while the block runs (nothing when not busy)."""
    if not busy:
        yield
        return
    proc = subprocess.Popen(["taskset", "-c", str(core), sys.executable, "-c",
                             "while True: pass"])
    try:
        time.sleep(0.5)
        yield
    finally:
        proc.kill()
        proc.wait()


def run(model: str, threads: int, tokens: int, rounds: int,
        trees: dict[str, str]) -> dict[str, Any]:
    """Best tokens/s per (tree, path, quiet|busy, streams) over `rounds` alternated rounds."""
    engines: dict[tuple[str, str], InProcess | Served] = {}
    try:
        for tree, src in trees.items():
            engines[tree, "in-process"] = InProcess(src, model, threads)
            engines[tree, "server"] = Served(src, model, threads)
        best: dict[str, dict[str, Any]] = {}
        core = max(os.sched_getaffinity(0))  # the last core this process may run on
        for r in range(rounds):
            for busy in (False, True):
                with spinner(busy, core):
                    for (tree, path), eng in engines.items():
                        for n in STREAMS:
                            load = loadavg()
                            tps = eng.tokens_per_s(n, tokens)
                            key = f"{tree}/{path}/{'busy' if busy else 'quiet'}/{n}"
                            print(f"round {r + 1} {key}: {tps:.3g} tokens/s (load {load:.1f})",
                                  flush=True)
                            if tps > best.get(key, {}).get("tokens_per_s", -1.0):
                                best[key] = {"tokens_per_s": round(tps, 3), "load": load}
    finally:
        for eng in engines.values():
            eng.close()
    ratios = {}
    for tree in trees:
        for path in ("in-process", "server"):
            for n in STREAMS:
                q = best[f"{tree}/{path}/quiet/{n}"]["tokens_per_s"]
                b = best[f"{tree}/{path}/busy/{n}"]["tokens_per_s"]
                ratios[f"{tree}/{path}/{n}"] = round(b / q, 3) if q else None
    for k, v in ratios.items():
        print(f"busy / quiet {k}: {v}")
    return {"model": model, "threads": threads, "tokens": tokens, "rounds": rounds,
            "trees": trees, "neighbour_core": core, "best": best, "busy_over_quiet": ratios}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=16, help="output tokens per stream")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--before-src", default=None,
                    help="a second source tree measured alongside (e.g. /work/main/src)")
    ap.add_argument("--out", type=Path, default=HERE / "out" / "neighbour.json")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.model, args.threads)
        return
    trees = {"this": str(HERE.parent / "src")}
    if args.before_src:
        trees["before"] = args.before_src
    print(f"model {args.model} q4, torch threads {args.threads}, load average {loadavg():.1f} "
          "(a shared machine: other jobs run beside this)", flush=True)
    res = run(args.model, args.threads, args.tokens, args.rounds, trees)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
