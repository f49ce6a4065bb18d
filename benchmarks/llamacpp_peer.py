"""llama.cpp's side of bench_generate's llamacpp section: run by the peer's own interpreter
(llama-cpp-python in benchmarks/.venvs/llamacpp), never imports scalelab.

Input: one JSON document on argv[1]:
  {"model": GGUF path, "threads": n, "tokens": output tokens per stream,
   "prompts": [[token ids], ...] (ours' tokenization, so both engines read the same ids),
   "modes": ["batched", "serial", ...], "rounds": best of this many}
Output: one JSON line on stdout, per mode: tokens/s (best of the rounds), tokens, the greedy
output ids of the best round (so the caller can compare them with ours).

Modes:
- "batched": llama.cpp's batched decoding through the low-level C API, as its
  examples/batched does: one context with n_seq_max = the number of prompts, all prompts
  prefilled in one llama_batch (each its own seq_id, logits only at its last token), then
  one llama_batch per step holding every sequence's next token. Greedy is the argmax of
  each sequence's logits; EOS does not stop a sequence (as ours with ignore_eos), so every
  sequence generates exactly `tokens`.
- "batched1": the same with the first prompt only (one stream, no Python-API overhead).
- "serial": the high-level API as its users and its server run it (`Llama.create_completion`;
  the server holds one lock, so concurrent requests are served in turn): the prompts one after
  another, temperature 0, EOS suppressed through logit_bias (the API stops on EOS otherwise).
- "serial1": the same with the first prompt only.
"""

from __future__ import annotations

import ctypes
import json
import sys
import time
from typing import Any

import llama_cpp
import numpy as np
from llama_cpp._logger import set_verbose


def batched(path: str, threads: int, tokens: int, prompts: list[list[int]]) -> tuple[float, list]:
    """Seconds for prefill + `tokens` greedy steps of all prompts as one batch, and outputs."""
    mp = llama_cpp.llama_model_default_params()
    model = llama_cpp.llama_model_load_from_file(path.encode(), mp)
    vocab = llama_cpp.llama_model_get_vocab(model)
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
    n = len(prompts)
    longest = max(len(p) for p in prompts) + tokens
    cp = llama_cpp.llama_context_default_params()
    cp.n_seq_max = n
    # Split evenly across the sequences when not unified; llama.cpp pads n_ctx to 256.
    cp.n_ctx = n * 256 * ((longest + 255) // 256)
    cp.n_batch = max(sum(len(p) for p in prompts), n)
    cp.n_ubatch = cp.n_batch
    cp.n_threads = threads
    cp.n_threads_batch = threads
    ctx = llama_cpp.llama_init_from_model(model, cp)
    batch = llama_cpp.llama_batch_init(cp.n_batch, 0, n)

    def put(i: int, tok: int, pos: int, seq: int, logits: bool) -> None:
        batch.token[i] = tok
        batch.pos[i] = pos
        batch.n_seq_id[i] = 1
        batch.seq_id[i][0] = seq
        batch.logits[i] = logits

    def decode() -> None:
        rc = llama_cpp.llama_decode(ctx, batch)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")

    def argmax(i: int) -> int:
        ptr = llama_cpp.llama_get_logits_ith(ctx, i)
        row = np.ctypeslib.as_array(
            ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)), shape=(n_vocab,)
        )
        return int(row.argmax())

    try:
        outs: list[list[int]] = [[] for _ in prompts]
        t0 = time.perf_counter()
        k, last = 0, []
        for s, p in enumerate(prompts):
            for j, tok in enumerate(p):
                put(k, tok, j, s, j == len(p) - 1)
                k += 1
            last.append(k - 1)
        batch.n_tokens = k
        decode()
        nxt = [argmax(i) for i in last]
        for step in range(tokens):
            for s in range(n):
                outs[s].append(nxt[s])
            if step == tokens - 1:
                break
            for s, p in enumerate(prompts):
                put(s, nxt[s], len(p) + step, s, True)
            batch.n_tokens = n
            decode()
            nxt = [argmax(s) for s in range(n)]
        dt = time.perf_counter() - t0
    finally:
        llama_cpp.llama_batch_free(batch)
        llama_cpp.llama_free(ctx)
        llama_cpp.llama_model_free(model)
    return dt, outs


def serial(llm: Any, tokens: int, prompts: list[list[int]]) -> tuple[float, list]:
    eos = llama_cpp.llama_vocab_eos(llama_cpp.llama_model_get_vocab(llm.model))
    outs = []
    llm.reset()
    t0 = time.perf_counter()
    for p in prompts:
        r = llm.create_completion(
            p, max_tokens=tokens, temperature=0.0, logit_bias={eos: float("-inf")}
        )
        if r["usage"]["completion_tokens"] != tokens:
            raise RuntimeError(f"serial: {r['usage']['completion_tokens']} tokens, not {tokens}")
        outs.append(None)  # the text only: its ids are not returned by this API
    return time.perf_counter() - t0, outs


def main() -> None:
    cfg = json.loads(sys.argv[1])
    path, threads, tokens = cfg["model"], int(cfg["threads"]), int(cfg["tokens"])
    prompts: list[list[int]] = cfg["prompts"]
    llama_cpp.llama_backend_init()
    set_verbose(False)  # the loader's log is thousands of lines on stderr
    llm = None
    out: dict[str, Any] = {"llama_cpp_python": llama_cpp.__version__}
    for mode in cfg["modes"]:
        group = prompts[:1] if mode.endswith("1") else prompts
        best, outs = float("inf"), []
        for _ in range(int(cfg["rounds"])):
            if mode.startswith("batched"):
                dt, o = batched(path, threads, tokens, group)
            else:
                if llm is None:
                    llm = llama_cpp.Llama(
                        model_path=path,
                        n_ctx=1024,
                        n_threads=threads,
                        n_threads_batch=threads,
                        verbose=False,
                        seed=0,
                    )
                dt, o = serial(llm, tokens, group)
            if dt < best:
                best, outs = dt, o
        toks = len(group) * tokens
        out[mode] = {
            "tokens_per_s": round(toks / best, 2),
            "tokens": toks,
            "wall_s": best,
            "outputs": outs,
        }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
