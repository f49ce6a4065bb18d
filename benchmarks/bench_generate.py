"""The generation engine side by side with its baselines, on the same weights and prompts.

Run: .venv/bin/python benchmarks/bench_generate.py [--model smollm2-135m|tiny] [--requests 12]
                                                   [--only batching,paged,prefix,spec,llamacpp]
                                                   [--threads 2] [--out FILE]
     .venv/bin/python benchmarks/bench_generate.py --only batching [--sweep 1,2,4,8,12]
                                                   [--tpot-objective 0.25|2.5x] [--arrival-rate 0.2]
     .venv/bin/python benchmarks/bench_generate.py --only step [--threads 1]   (~1 min)
     .venv/bin/python benchmarks/bench_generate.py --only neighbour [--before-src ../main/src]
     .venv/bin/python benchmarks/bench_generate.py --only profile,onestream [--before-src ...]

Sections (each prints ratios; all results go to --out as one JSON document):
- batching: output tokens/s at a p95 TPOT objective (--tpot-objective). Three modes: continuous
  batching (our engine), static batching (Hugging Face `generate` on the same weights and, by
  default, the same oneDNN-packed linear kernels as ours (--hf-linears plain: its own): the
  requests that have arrived, up to the batch size, left-padded and run to the longest) and one
  request at a time (our engine at max_num_seqs=1). The concurrency setting is swept (--sweep:
  max_num_seqs for continuous, the batch size for static, the two alternating at each setting)
  and each mode's best tokens/s among the settings whose p95 TPOT meets the objective is
  reported, with ratios. TPOT is the same for all: per request, first to last output token over
  n - 1, from its own token times (static's are stamped at every generate step, so a request's
  first token is the end of its batch's prefill). All requests arrive at once; --arrival-rate
  adds the same sweep with seeded Poisson arrivals. The section prints its own duration.
- paged: the same KV byte budget as paged blocks vs contiguous max-length reservation (the
  engine with one max_model_len block per sequence): most concurrent sequences and the share
  of reserved KV slots holding no token.
- prefix: a shared ~200-token system prompt, requests one after another: p50 TTFT with the
  prefix cache on vs off.
- spec: batch 1, prompt-lookup speculative decoding vs plain greedy on a repetitive (quoting)
  and on a non-repetitive workload: tokens/s ratio and acceptance rate.
- step (only when named): one decode step at 1 and at 8 running sequences, wall and CPU
  time, and its CPU split (matrix products / paged attention / the rest) from torch.profiler;
  beside it Hugging Face's decode step on the same weights and prompts, timed alternately.
- weights (only when named): fp32 vs int8 vs q4 weights, tokens/s at 1 and 8 streams, weight
  bytes, server RSS, perplexity, teacher-forced next-token agreement with fp32 and greedy
  agreement (benchmarks/bench_weights.py); with llamacpp named too, each setting's
  teacher-forced next-token agreement with llama.cpp on the same Q4_1 file and ids beside it.
- neighbour (only when named): q4 tokens/s at 1 and 8 concurrent streams with the machine as it
  is ("quiet") and with one CPU-spinning process pinned to one core ("one stream with a busy
  neighbour"), in-process and through `generate serve`, rounds alternating
  (benchmarks/bench_neighbour.py; --before-src adds a second source tree, e.g. main's).
- profile (only when named): one decode step at one stream at q4, --threads: torch.profiler's
  self CPU time per op and per group (int4 products, RMSNorm, attention, casts and copies,
  elementwise, the rest) in ms per step and share, and the forward's share of the engine's step
  (cProfile) (benchmarks/bench_onestream.py --profile).
- onestream (only when named): one stream, ours (q4) against llama.cpp's C API on the same Q4_1
  file, ids and lengths, at 1 and 2 threads, persistent processes, rounds alternating, median
  and range of 3, tokens/s and CPU ms a token (benchmarks/bench_onestream.py; --before-src adds
  a second source tree in the same run).
- llamacpp: llama-cpp-python (in benchmarks/.venvs/llamacpp, made by .ci/llamacpp from the
  wheel cached in benchmarks/.venvs/wheels, built from the sdist when absent) on the same GGUF,
  token ids, threads and exact output lengths (64 per stream, EOS ignored on both sides), 1
  stream and 8 concurrent, in each of its modes (benchmarks/llamacpp_peer.py): batched
  decoding through its C API (n_seq=8, as its examples/batched; its server serves one request
  at a time, so it has no parallel slots) and the high-level API serving requests in turn;
  ours (--weights, default q4: the same Q4_1 blocks) against the peer's best mode, rounds
  alternating, best of 3 each.

The workload is a fixed seeded mix of prompt and output lengths (ignore_eos, so every mode
generates exactly the same number of tokens). Measured on a shared two-core machine: the load
average is printed beside every section, and wall-clock numbers move with it.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from scalelab.lab.core.errors import ScalelabError
from scalelab.system.generate.engine import LlmEngine, LlmEngineConfig
from scalelab.system.generate.models import LoadedModel, load_model
from scalelab.system.generate.objective import (
    SweepPoint,
    TpotBound,
    best_under_objective,
    parse_objective,
    quantile,
    request_tpot,
)
from scalelab.system.generate.runner import kv_bytes_per_token
from scalelab.system.generate.sequence import SamplingParams, Sequence
from scalelab.system.generate.speculative import SpecConfig

HERE = Path(__file__).resolve().parent
VENVS = HERE / ".venvs"
_VOCAB = (
    "time people year way day thing man world life hand part child eye woman place work week "
    "case point number group problem fact river music garden window system table light paper "
    "story money water engine market city data model train serve scale"
)
WORDS = _VOCAB.split()
Work = list[tuple[list[int], int]]
"""(prompt ids, output length) per request."""


def loadavg() -> float:
    return os.getloadavg()[0]


def workload(lm: LoadedModel, n: int, seed: int = 0) -> list[tuple[list[int], int]]:
    """(prompt ids, output length): prompts 16-160 tokens, outputs 16-96 tokens, seeded."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        words = rng.randint(12, 120)
        text = " ".join(rng.choice(WORDS) for _ in range(words))
        out.append((lm.tokenizer.encode(text)[:160], rng.choice([16, 32, 48, 64, 96])))
    return out


def engine(lm: LoadedModel, **kw: Any) -> LlmEngine:
    cfg = {"kv_cache_bytes": 512 << 20, "max_model_len": 512, **kw}
    return LlmEngine(lm.model, lm.tokenizer, LlmEngineConfig(**cfg), name=lm.name)


HF_LINEARS = ["packed"]
"""--hf-linears: HF's linear layers on our oneDNN-packed kernels ("packed") or its own ("plain")."""


def build_hf(lm: LoadedModel) -> Any:
    """transformers' LlamaForCausalLM holding our exact fp32 tensors (the static baseline).
    With --hf-linears packed (the default) its bias-free linears, the tied output layer among
    them, run on the same oneDNN-packed fp32 kernel as the engine's (runner.pack_linears: the
    same module swap the engine makes), so continuous against static compares scheduling,
    not matmul kernels; plain leaves transformers' own nn.Linear (MKL GEMM)."""
    import transformers

    from scalelab.system.generate.runner import can_pack, pack_linears

    c = lm.model.cfg
    hf = transformers.LlamaForCausalLM(
        transformers.LlamaConfig(
            vocab_size=c.vocab_size,
            hidden_size=c.hidden_size,
            intermediate_size=c.intermediate_size,
            num_hidden_layers=c.num_layers,
            num_attention_heads=c.num_heads,
            num_key_value_heads=c.num_kv_heads,
            rms_norm_eps=c.rms_norm_eps,
            max_position_embeddings=c.max_position_embeddings,
            tie_word_embeddings=c.tie_word_embeddings,
            rope_parameters={"rope_type": "default", "rope_theta": c.rope_theta},
        )
    ).eval()
    hf.load_state_dict(lm.model.state_dict(), strict=False)
    if HF_LINEARS[0] == "packed" and can_pack(hf):
        pack_linears(hf)
    return hf


def poisson_arrivals(n: int, rate: float | None, seed: int = 0) -> list[float]:
    """Seconds after the start at which each request arrives: all at 0, or a seeded Poisson
    process of `rate` requests per second (exponential gaps)."""
    if not rate:
        return [0.0] * n
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(rate)
    return out


def _wait_until(t: float) -> None:
    # An idle server waits for its next request; this is the arrival process, not a sync.
    dt = t - time.perf_counter()
    if dt > 0:
        time.sleep(dt)


def _point(
    mode: str,
    setting: int,
    toks: int,
    wall: float,
    tpots: list[float | None],
    ttfts: list[float],
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    gaps = [x for x in tpots if x is not None]
    return {
        "mode": mode,
        "setting": setting,
        "output_tokens": toks,
        "wall_s": round(wall, 2),
        "tokens_per_s": round(toks / wall, 2),
        "p50_tpot_s": round(quantile(gaps, 0.5), 4),
        "p95_tpot_s": round(quantile(gaps, 0.95), 4),
        "p50_ttft_s": round(quantile(ttfts, 0.5), 3),
        "p95_ttft_s": round(quantile(ttfts, 0.95), 3),
        **(extra or {}),
    }


def continuous_run(
    lm: LoadedModel, work: Work, max_num_seqs: int, arrivals: list[float]
) -> dict[str, Any]:
    """Our engine; requests join at the first step after they arrive. TPOT from each
    sequence's own first/last token clocks, TTFT from its (scheduled) arrival."""
    e = engine(lm, max_num_seqs=max_num_seqs)
    t0 = time.perf_counter()
    due = [t0 + a for a in arrivals]
    seqs: list[Sequence] = []
    while len(seqs) < len(work) or e.has_work():
        now = time.perf_counter()
        while len(seqs) < len(work) and due[len(seqs)] <= now:
            ids, n = work[len(seqs)]
            seqs.append(e.add(ids, SamplingParams(max_tokens=n, ignore_eos=True)))
        if e.has_work():
            e.step()
        else:
            _wait_until(due[len(seqs)])
    wall = time.perf_counter() - t0
    # The engine stamps each sequence's first and last token: (last - first) / (n - 1) is
    # request_tpot over all of its token times (their gaps sum to last - first).
    tpots = [
        None
        if s.num_output < 2 or s.first_token_at is None or s.last_token_at is None
        else (s.last_token_at - s.first_token_at) / (s.num_output - 1)
        for s in seqs
    ]
    ttfts = [(s.first_token_at or 0.0) - d for s, d in zip(seqs, due, strict=True)]
    return _point(
        "continuous",
        max_num_seqs,
        sum(s.num_output for s in seqs),
        wall,
        tpots,
        ttfts,
        {
            "mean_tokens_per_step": round(statistics.mean(e.stats.tokens_per_step), 2),
            "max_batch": e.stats.max_running,
        },
    )


def static_run(hf: Any, work: Work, batch: int, arrivals: list[float]) -> dict[str, Any]:
    """Hugging Face `generate` over fixed batches, as its users run it: a batch takes the
    requests that have arrived (up to `batch`), left-padded, and runs to its longest request
    before the next batch starts. Each step's wall time is stamped (a StoppingCriteria HF calls
    after every new token), so request i's k-th token is the batch's k-th stamp: its first
    token is the end of its batch's prefill, and it could be streamed at that pace."""
    from transformers import StoppingCriteria, StoppingCriteriaList

    class Stamp(StoppingCriteria):
        def __init__(self) -> None:
            self.t: list[float] = []

        def __call__(self, input_ids: torch.Tensor, scores: Any, **kw: Any) -> torch.Tensor:
            self.t.append(time.perf_counter())
            return torch.zeros(input_ids.shape[0], dtype=torch.bool)

    t0 = time.perf_counter()
    due = [t0 + a for a in arrivals]
    tpots: list[float | None] = []
    ttfts: list[float] = []
    toks, i = 0, 0
    while i < len(work):
        _wait_until(due[i])
        now = time.perf_counter()
        j = i + 1
        while j < len(work) and j - i < batch and due[j] <= now:
            j += 1
        chunk = work[i:j]
        width = max(len(w[0]) for w in chunk)
        pad = 0
        ids = torch.tensor([[pad] * (width - len(w[0])) + w[0] for w in chunk])
        mask = torch.tensor([[0] * (width - len(w[0])) + [1] * len(w[0]) for w in chunk])
        longest = max(n for _, n in chunk)
        stamp = Stamp()
        with torch.inference_mode():
            hf.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=longest,
                min_new_tokens=longest,
                do_sample=False,
                pad_token_id=pad,
                stopping_criteria=StoppingCriteriaList([stamp]),
            )
        assert len(stamp.t) == longest, (len(stamp.t), longest)
        for k, (_, n) in enumerate(chunk):
            tpots.append(request_tpot(stamp.t[:n]))
            ttfts.append(stamp.t[0] - due[i + k])
            toks += n
        i = j
    wall = time.perf_counter() - t0
    return _point("static", batch, toks, wall, tpots, ttfts)


def _sweep(
    lm: LoadedModel, hf: Any, work: Work, settings: list[int], arrivals: list[float]
) -> list[dict[str, Any]]:
    rows = []
    for s in settings:  # the two modes alternate at each setting: drift hits both alike
        for row in (continuous_run(lm, work, s, arrivals), static_run(hf, work, s, arrivals)):
            row["load"] = round(loadavg(), 2)
            rows.append(row)
            print(
                f"  {row['mode']:>10} {s:>3}: {row['tokens_per_s']:7.2f} tok/s, p95 TPOT "
                f"{row['p95_tpot_s']:.3f} s, p95 TTFT {row['p95_ttft_s']:.2f} s, wall "
                f"{row['wall_s']:.1f} s; load {row['load']:.1f}",
                flush=True,
            )
    return rows


def section_batching(
    lm: LoadedModel,
    work: Work,
    settings: list[int],
    objective: TpotBound,
    rate: float | None,
) -> dict[str, Any]:
    """Output tokens/s at a p95 TPOT objective: each mode's best over the concurrency sweep
    (max_num_seqs for continuous, the batch size for static; one at a time is our engine at
    max_num_seqs=1, the sweep's setting 1), all requests arriving at once and, with
    --arrival-rate, as a seeded Poisson process."""
    hf = build_hf(lm)
    t_start = time.perf_counter()
    la = loadavg()
    # Warm both engines (first-call allocations, lazy imports) outside the timed runs.
    continuous_run(lm, work[:1], 1, [0.0])
    static_run(hf, work[:1], 1, [0.0])
    out: dict[str, Any] = {"settings": settings, "objective": str(objective), "load_before": la}
    variants = [("all_at_once", None)] + ([(f"poisson_{rate:g}_per_s", rate)] if rate else [])
    for name, r in variants:
        print(f"[batching] {name}: sweep {settings}, objective p95 TPOT <= {objective}", flush=True)
        rows = _sweep(lm, hf, work, settings, poisson_arrivals(len(work), r, seed=0))
        one = next((x for x in rows if x["mode"] == "continuous" and x["setting"] == 1), None)
        bound = objective.bound(one["p95_tpot_s"] if one else None)
        pts = {
            mode: [
                SweepPoint(
                    mode=mode,
                    setting=x["setting"],
                    tokens_per_s=x["tokens_per_s"],
                    p95_tpot_s=x["p95_tpot_s"],
                )
                for x in rows
                if x["mode"] == mode
            ]
            for mode in ("continuous", "static")
        }
        best = {m: best_under_objective(v, bound) for m, v in pts.items()}
        if one is not None and one["p95_tpot_s"] <= bound:
            best["one_at_a_time"] = SweepPoint(
                mode="one_at_a_time",
                setting=1,
                tokens_per_s=one["tokens_per_s"],
                p95_tpot_s=one["p95_tpot_s"],
            )
        else:
            best["one_at_a_time"] = None
        res: dict[str, Any] = {
            "arrival_rate_per_s": r,
            "tpot_bound_s": round(bound, 4),
            "rows": rows,
            "best": {m: (None if b is None else vars(b)) for m, b in best.items()},
        }
        c, s, o = best["continuous"], best["static"], best["one_at_a_time"]
        res["continuous_vs_static"] = round(c.tokens_per_s / s.tokens_per_s, 2) if c and s else None
        res["continuous_vs_one"] = round(c.tokens_per_s / o.tokens_per_s, 2) if c and o else None

        def show(b: SweepPoint | None) -> str:
            return "none meets it" if b is None else f"{b.tokens_per_s} tok/s at {b.setting}"

        print(
            f"[batching] {name}, p95 TPOT <= {bound:.3f} s ({objective}): continuous "
            f"{show(c)}, static {show(s)}, one at a time {show(o)}: "
            f"{res['continuous_vs_static']}x static, {res['continuous_vs_one']}x one; "
            f"load {loadavg():.1f}",
            flush=True,
        )
        out[name] = res
    out["load_after"] = loadavg()
    out["section_wall_s"] = round(time.perf_counter() - t_start, 1)
    print(f"[batching] section took {out['section_wall_s']:.0f} s", flush=True)
    return out


ATTENTION_OPS = ("scaled_dot_product", "index_select", "index_copy")
# The engine's linears run as oneDNN's packed matmul (LlmEngineConfig.packed_weights); HF's too
# (--hf-linears packed, the default) or as mm (plain).
MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "mkldnn::_linear_pointwise",
              "aten::_weight_int4pack_mm_for_cpu", "aten::_weight_int8pack_mm")


class HFDecoder:
    """Hugging Face's own decode step on the same weights: prefill a left-padded batch into its
    DynamicCache once, then each `step()` is one forward of one new token per row plus the
    greedy argmax (what `generate` does per step, minus its logits processors)."""

    def __init__(self, hf: Any, prompts: list[list[int]]) -> None:
        width = max(len(x) for x in prompts)
        ids = torch.tensor([[0] * (width - len(x)) + x for x in prompts])
        self.hf = hf
        self.mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in prompts])
        with torch.inference_mode():
            out = hf(input_ids=ids, attention_mask=self.mask, use_cache=True)
        self.cache = out.cache
        self.next = out.logits[:, -1].argmax(-1, keepdim=True)

    @torch.inference_mode()
    def step(self) -> None:
        self.mask = torch.cat([self.mask, torch.ones_like(self.mask[:, :1])], dim=1)
        pos = self.mask.sum(-1, keepdim=True) - 1
        out = self.hf(
            input_ids=self.next,
            attention_mask=self.mask,
            position_ids=pos,
            cache=self.cache,
            use_cache=True,
        )
        self.cache = out.cache
        self.next = out.logits[:, -1].argmax(-1, keepdim=True)


def section_step(lm: LoadedModel, steps: int) -> dict[str, Any]:
    """One decode step at 1 and at 8 running sequences (prompts 40-150 tokens, all past their
    prefill): median wall and CPU time per step, and where the step's CPU time goes (matrix
    products, the paged attention's gather + SDPA, everything else) from torch.profiler; and
    Hugging Face's decode step on the same weights and prompts, timed alternately with ours
    (ours is the engine's whole step: scheduling, forward, sampling, detokenization)."""
    from torch.profiler import ProfilerActivity, profile

    la = loadavg()
    hf = build_hf(lm)
    out: dict[str, Any] = {}
    for nseq in (1, 8):
        e = engine(lm, max_num_seqs=nseq)
        rng = random.Random(3)
        prompts = []
        for _ in range(nseq):
            text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(40, 150)))
            # Clipped for the byte tokenizer of --model tiny (SmolLM2 prompts stay whole).
            prompts.append(lm.tokenizer.encode(text)[:200])
            e.add(prompts[-1], SamplingParams(max_tokens=4 * steps + 8, ignore_eos=True))
        while e.scheduler.waiting or any(s.in_prefill for s in e.scheduler.running):
            e.step()
        e.step()
        ref = HFDecoder(hf, prompts)
        ref.step()
        wall, cpu, hf_wall = [], [], []
        for _ in range(steps):  # alternating: a load change hits both alike
            t0, c0 = time.perf_counter(), time.process_time()
            e.step()
            wall.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
            t0 = time.perf_counter()
            ref.step()
            hf_wall.append(time.perf_counter() - t0)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(3):
                e.step()
        ops = {k.key: k.self_cpu_time_total for k in prof.key_averages()}
        total = sum(ops.values()) or 1.0
        mm = sum(v for k, v in ops.items() if k in MATMUL_OPS)
        att = sum(v for k, v in ops.items() if any(a in k for a in ATTENTION_OPS))
        out[f"{nseq}_seqs"] = {
            "step_ms": round(1e3 * statistics.median(wall), 1),
            "step_cpu_ms": round(1e3 * statistics.median(cpu), 1),
            "ms_per_token": round(1e3 * statistics.median(wall) / nseq, 1),
            "hf_step_ms": round(1e3 * statistics.median(hf_wall), 1),
            "ours_vs_hf_step": round(statistics.median(hf_wall) / statistics.median(wall), 2),
            "share_matmul": round(mm / total, 3),
            "share_attention": round(att / total, 3),
            "share_other": round(1 - (mm + att) / total, 3),
        }
    one, eight = out["1_seqs"], out["8_seqs"]
    out["per_token_speedup_8_vs_1"] = round(one["ms_per_token"] / eight["ms_per_token"], 2)
    out["load"] = la
    print(
        f"[step] decode step {one['step_ms']} ms at 1 sequence (HF {one['hf_step_ms']} ms), "
        f"{eight['step_ms']} ms at 8 (HF {eight['hf_step_ms']} ms; "
        f"{out['per_token_speedup_8_vs_1']}x per token); HF step / ours "
        f"{one['ours_vs_hf_step']}x at 1, {eight['ours_vs_hf_step']}x at 8; at 8: matmul "
        f"{eight['share_matmul']:.0%}, attention {eight['share_attention']:.0%}, other "
        f"{eight['share_other']:.0%} of CPU time; load {la:.1f}",
        flush=True,
    )
    return out


def section_paged(
    lm: LoadedModel,
    work: list[tuple[list[int], int]],
    max_len: int,
    contiguous_seqs: int,
    steps: int,
) -> dict[str, Any]:
    """Same bytes: `contiguous_seqs` max-length reservations, or that many tokens in blocks."""
    la = loadavg()
    budget = kv_bytes_per_token(lm.model.cfg) * max_len * contiguous_seqs
    out: dict[str, Any] = {"kv_budget_bytes": budget, "max_model_len": max_len}
    for name, contiguous in (("paged", False), ("contiguous", True)):
        e = engine(
            lm,
            kv_cache_bytes=budget,
            max_model_len=max_len,
            max_num_seqs=len(work),
            max_batched_tokens=4096,
            contiguous=contiguous,
            prefix_caching=False,
        )
        for w, n in work:
            e.add(w, SamplingParams(max_tokens=n, ignore_eos=True))
        wastes, conc = [], []
        for _ in range(steps):
            if not e.has_work():
                break
            e.step()
            held = sum(len(s) for s in e.scheduler.running)
            reserved = e.blocks.num_used * e.blocks.block_size
            if reserved:
                wastes.append(1 - held / reserved)
            conc.append(e.num_running)
        out[name] = {
            "max_concurrent": max(conc),
            "mean_waste": round(statistics.mean(wastes), 4),
            "blocks": e.blocks.num_blocks,
            "block_size": e.blocks.block_size,
        }
    out["concurrency_ratio"] = round(
        out["paged"]["max_concurrent"] / out["contiguous"]["max_concurrent"], 2
    )
    out["load"] = la
    print(
        f"[paged] same {budget / 2**20:.0f} MiB: paged {out['paged']['max_concurrent']} "
        f"sequences ({out['paged']['mean_waste']:.1%} slots wasted) vs contiguous "
        f"{out['contiguous']['max_concurrent']} ({out['contiguous']['mean_waste']:.1%}): "
        f"{out['concurrency_ratio']}x; load {la:.1f}",
        flush=True,
    )
    return out


def section_prefix(lm: LoadedModel, n: int) -> dict[str, Any]:
    la = loadavg()
    system = lm.tokenizer.encode(
        "You are the support assistant of a rail company. Answer in one short sentence, "
        "quote the timetable exactly, never invent a platform number, and say when you do "
        "not know. " * 4
    )[:200]
    qs = [
        lm.tokenizer.encode(f" Question {i}: when does the {w} train leave?")
        for i, w in enumerate(WORDS[:n])
    ]
    out: dict[str, Any] = {"system_prompt_tokens": len(system)}
    for name, on in (("cache_off", False), ("cache_on", True)):
        e = engine(lm, prefix_caching=on)
        e.generate([system + qs[0]], SamplingParams(max_tokens=1))  # warm (and fill the cache)
        ttfts = []
        for q in qs[1:]:
            (s,) = e.generate([system + q], SamplingParams(max_tokens=4, ignore_eos=True))
            ttfts.append((s.first_token_at or 0) - s.arrival)
        out[name] = {
            "p50_ttft_s": round(quantile(ttfts, 0.5), 4),
            "prefill_tokens": e.stats.prefill_tokens,
            "hit_rate": round(e.blocks.stats.hit_rate, 3),
        }
    out["ttft_ratio"] = round(out["cache_off"]["p50_ttft_s"] / out["cache_on"]["p50_ttft_s"], 2)
    out["load"] = la
    print(
        f"[prefix] p50 TTFT off {out['cache_off']['p50_ttft_s']} s, on "
        f"{out['cache_on']['p50_ttft_s']} s: {out['ttft_ratio']}x lower; load {la:.1f}",
        flush=True,
    )
    return out


def section_spec(lm: LoadedModel, n_tokens: int) -> dict[str, Any]:
    la = loadavg()
    code = (
        "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\n"
        "def mul(a, b):\n    return a * b\n\n"
    )
    tok = lm.tokenizer
    repetitive = [
        tok.encode(
            tok.render_chat([{"role": "user", "content": f"Repeat this code exactly:\n{code}{i}"}])
        )
        for i in range(2)
    ]
    rng = random.Random(1)
    rand = [
        tok.encode(
            tok.render_chat(
                [
                    {
                        "role": "user",
                        "content": "Write a poem about "
                        + " ".join(rng.choice(WORDS) for _ in range(6)),
                    }
                ]
            )
        )
        for _ in range(2)
    ]
    out: dict[str, Any] = {}
    for wname, prompts in (("repetitive", repetitive), ("random", rand)):
        row: dict[str, Any] = {}
        for mode, spec in (("plain", False), ("speculative", True)):
            e = engine(lm, max_num_seqs=1, speculative=spec, spec=SpecConfig(num_draft=4))
            t0 = time.perf_counter()
            seqs = [e.generate([q], SamplingParams(max_tokens=n_tokens))[0] for q in prompts]
            wall = time.perf_counter() - t0
            toks = sum(s.num_output for s in seqs)
            row[mode] = {
                "tokens_per_s": round(toks / wall, 2),
                "output_tokens": toks,
                "acceptance_rate": round(e.stats.acceptance_rate, 3),
                # Forwards run: the load-independent part of the speed-up.
                "steps": e.stats.steps,
                "outputs": [s.output_ids for s in seqs],
            }
        row["identical_outputs"] = row["plain"].pop("outputs") == row["speculative"].pop("outputs")
        row["speedup"] = round(row["speculative"]["tokens_per_s"] / row["plain"]["tokens_per_s"], 2)
        out[wname] = row
        print(
            f"[spec] {wname}: {row['speedup']}x tokens/s, acceptance "
            f"{row['speculative']['acceptance_rate']:.0%}, forwards "
            f"{row['plain']['steps']} -> {row['speculative']['steps']}, identical "
            f"{row['identical_outputs']}; load {loadavg():.1f}",
            flush=True,
        )
    out["load"] = la
    return out


def llamacpp_python() -> Path:
    """The peer's interpreter: benchmarks/.venvs/llamacpp, made by .ci/llamacpp (`make
    llamacpp`) from the cached wheel, which it builds from the sdist once when absent."""
    subprocess.run([str(HERE.parent / ".ci" / "llamacpp"), sys.executable], check=True)
    return VENVS / "llamacpp" / "bin" / "python"


def section_llamacpp(
    lm: LoadedModel, n_tokens: int, threads: int, rounds: int = 3
) -> dict[str, Any]:
    """Ours (at `lm`'s weights) against llama-cpp-python on the same GGUF file, token ids,
    threads and exact output lengths (EOS never ends a sequence on either side). llama.cpp in
    each of its modes (benchmarks/llamacpp_peer.py): batched decoding through its C API with
    n_seq_max = 8 (as its examples/batched; its server holds one lock, so it has no parallel
    slots), the high-level API serving the requests in turn, and each with one stream. The
    peer's best mode is the comparison. Rounds alternate the two sides; best of `rounds` each."""
    from scalelab.system.generate.gguf import smollm2_path
    from scalelab.system.generate.quality import agreement

    la = loadavg()
    py = llamacpp_python()
    texts = [
        f"Tell me about the {w} and the {v}." for w, v in zip(WORDS, WORDS[8:16], strict=False)
    ][:8]
    # Our tokenizer's ids go to both engines: the same input, whatever each tokenizer would add.
    ids = [lm.tokenizer.encode(x) for x in texts]
    cfg = {
        "model": str(smollm2_path()),
        "threads": threads,
        "tokens": n_tokens,
        "prompts": ids,
        "modes": ["batched1", "serial1", "batched", "serial"],
        "rounds": 1,
    }
    e = engine(lm, max_num_seqs=8)
    e.generate(ids, SamplingParams(max_tokens=4, ignore_eos=True))  # warm, as the peer's load
    peer: dict[str, Any] = {}
    ours: dict[str, Any] = {}
    outs: list[list[int]] = []
    for _ in range(rounds):
        r = subprocess.run(
            [str(py), str(HERE / "llamacpp_peer.py"), json.dumps(cfg)],
            capture_output=True,
            text=True,
            check=True,
        )
        got = json.loads(r.stdout.strip().splitlines()[-1])
        for mode in cfg["modes"]:
            if mode not in peer or got[mode]["tokens_per_s"] > peer[mode]["tokens_per_s"]:
                peer[mode] = got[mode]
        for label, group in (("1_stream", ids[:1]), ("8_concurrent", ids)):
            t0 = time.perf_counter()
            seqs = e.generate(group, SamplingParams(max_tokens=n_tokens, ignore_eos=True))
            dt = time.perf_counter() - t0
            toks = sum(s.num_output for s in seqs)
            assert toks == len(group) * n_tokens, (toks, len(group), n_tokens)
            if label not in ours or toks / dt > ours[label]["tokens_per_s"]:
                ours[label] = {"tokens_per_s": round(toks / dt, 2), "tokens": toks}
                if label == "8_concurrent":
                    outs = [s.output_ids for s in seqs]
    agree, same = agreement(outs, peer["batched"]["outputs"])
    for v in peer.values():
        v.pop("outputs")
    best1 = max(("batched1", "serial1"), key=lambda m: peer[m]["tokens_per_s"])
    best8 = max(("batched", "serial"), key=lambda m: peer[m]["tokens_per_s"])
    names = {
        "batched1": "llama.cpp batched API (n_seq=1)",
        "serial1": "llama.cpp high-level API",
        "batched": "llama.cpp batched (n_seq=8)",
        "serial": "llama.cpp serial (high-level API, one request after another)",
    }
    out = {
        "llama_cpp_python": peer,
        "scalelab": ours,
        "weights": lm.weights,
        "threads": threads,
        "tokens_per_stream": n_tokens,
        "rounds": rounds,
        "peer_best_1": names[best1],
        "peer_best_8": names[best8],
        "greedy_agreement_8_vs_batched": round(agree, 3),
        "identical_8_vs_batched": same,
        "load": la,
        "load_end": loadavg(),
        "ratio_1": round(ours["1_stream"]["tokens_per_s"] / peer[best1]["tokens_per_s"], 2),
        "ratio_8": round(ours["8_concurrent"]["tokens_per_s"] / peer[best8]["tokens_per_s"], 2),
    }
    print(
        f"[llamacpp] same Q4_1 file, {threads} thread(s), {n_tokens} tokens per stream, EOS "
        f"ignored on both sides, best of {rounds} alternating rounds; ours at {lm.weights} "
        "weights",
        flush=True,
    )
    for mode in cfg["modes"]:
        print(f"  {names[mode]}: {peer[mode]['tokens_per_s']} tok/s", flush=True)
    print(
        f"[llamacpp] 1 stream: ours {ours['1_stream']['tokens_per_s']} tok/s vs "
        f"{names[best1]} {peer[best1]['tokens_per_s']} ({out['ratio_1']}x); 8 concurrent: ours "
        f"{ours['8_concurrent']['tokens_per_s']} vs {names[best8]} "
        f"{peer[best8]['tokens_per_s']} ({out['ratio_8']}x); greedy agreement with llama.cpp "
        f"{agree:.2f} ({same}/8 identical); load {la:.1f} -> {out['load_end']:.1f}",
        flush=True,
    )
    return out


def section_weights(model: str, threads: int, llamacpp: Path | None) -> dict[str, Any]:
    """fp32 / int8 / q4 weights: tokens/s, memory, quality (benchmarks/bench_weights.py);
    with `llamacpp` (its interpreter) next-token agreement with llama.cpp beside perplexity."""
    sys.path.insert(0, str(HERE))
    import bench_weights

    out: dict[str, Any] = bench_weights.run(model, threads, tokens=64, rounds=2,
                                            llamacpp=llamacpp)
    return out


def section_neighbour(model: str, threads: int, before_src: str | None) -> dict[str, Any]:
    """Quiet vs one spinning neighbour core, in-process and served (bench_neighbour.py)."""
    sys.path.insert(0, str(HERE))
    import bench_neighbour

    trees = {"this": str(HERE.parent / "src")}
    if before_src:
        trees["before"] = before_src
    out: dict[str, Any] = bench_neighbour.run(model, threads, tokens=16, rounds=2, trees=trees)
    return out


def section_profile(threads: int) -> dict[str, Any]:
    """Where one decode step at one stream goes, per op (bench_onestream.profile_step)."""
    sys.path.insert(0, str(HERE))
    import bench_onestream

    out: dict[str, Any] = bench_onestream.profile_step(threads)
    return out


def section_onestream(before_src: str | None) -> dict[str, Any]:
    """One stream against llama.cpp at 1 and 2 threads, alternated (bench_onestream.run)."""
    from scalelab.system.generate.gguf import smollm2_path

    sys.path.insert(0, str(HERE))
    import bench_onestream

    trees = {"this": str(HERE.parent / "src")}
    if before_src:
        trees["before"] = before_src
    out: dict[str, Any] = bench_onestream.run([1, 2], 64, 3, trees, llamacpp_python(),
                                              str(smollm2_path()))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--requests", type=int, default=12)
    ap.add_argument(
        "--sweep",
        default="1,2,4,8,12",
        help="batching: the concurrency settings swept (max_num_seqs for continuous, the batch "
        "size for static; 1 is also the one-at-a-time mode); shorten with e.g. 1,8",
    )
    ap.add_argument(
        "--tpot-objective",
        default="0.25",
        help="batching: the p95 TPOT objective, seconds (0.25) or a multiple of the "
        "one-at-a-time p95 TPOT measured in the same run (2.5x); default 0.25 s, about 2.5x "
        "one-at-a-time's p95 TPOT on the quiet two-core machine (0.09-0.12 s at 2 threads)",
    )
    ap.add_argument(
        "--arrival-rate",
        type=float,
        default=0.0,
        help="batching: also sweep with requests arriving as a seeded Poisson process of this "
        "many requests per second (0: only all at once)",
    )
    ap.add_argument(
        "--only",
        default="batching,paged,prefix,spec,llamacpp",
        help="comma-separated sections; 'step' (decode-step time and its split at 1 and 8 "
        "sequences), 'weights' (fp32/int8/q4: benchmarks/bench_weights.py) and 'neighbour' "
        "(quiet vs a busy neighbour core: benchmarks/bench_neighbour.py), 'profile' (one "
        "stream's step per op) and 'onestream' (one stream vs llama.cpp at 1 and 2 threads: "
        "benchmarks/bench_onestream.py) run only when named",
    )
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--weights",
        default="q4",
        choices=["fp32", "int8", "q4"],
        help="how our engine holds the weights in the llamacpp section (default q4: the GGUF's "
        "own blocks, the same Q4_1 llama.cpp reads, and what `generate serve` runs); the other "
        "sections compare fp32 with HF's fp32 and stay fp32",
    )
    ap.add_argument(
        "--hf-linears",
        default="packed",
        choices=["packed", "plain"],
        help="Hugging Face's linear layers (batching and step sections): on the engine's "
        "oneDNN-packed fp32 kernel (packed, the same kernels as ours) or transformers' own "
        "nn.Linear (plain)",
    )
    ap.add_argument(
        "--before-src",
        default=None,
        help="neighbour, onestream: a second source tree measured in the same run (e.g. "
        "/work/main/src)",
    )
    ap.add_argument("--spec-tokens", type=int, default=48)
    ap.add_argument(
        "--step-count", type=int, default=10, help="decode steps timed per batch size (step)"
    )
    ap.add_argument("--out", type=Path, default=HERE / "out" / "generate.json")
    args = ap.parse_args()
    try:
        objective = parse_objective(args.tpot_objective)
    except ScalelabError as e:
        ap.error(str(e))
    try:
        settings = sorted({int(x) for x in args.sweep.split(",") if x.strip()})
    except ValueError:
        ap.error(f"--sweep {args.sweep!r}: give comma-separated positive integers, e.g. 1,2,4,8")
    if not settings or settings[0] < 1:
        ap.error(f"--sweep {args.sweep!r}: give comma-separated positive integers, e.g. 1,2,4,8")
    HF_LINEARS[0] = args.hf_linears
    t_start = time.perf_counter()
    torch.set_num_threads(args.threads)
    lm = load_model(args.model, max_model_len=1024)
    work = workload(lm, args.requests)
    only = set(args.only.split(","))
    res: dict[str, Any] = {
        "model": lm.name,
        "weights": args.weights,
        "threads": args.threads,
        "cores": os.cpu_count(),
        "requests": args.requests,
        "hf_linears": args.hf_linears,
        "load_start": loadavg(),
    }
    print(
        f"model {lm.name}, {args.requests} requests, torch threads {args.threads}, "
        f"load average {loadavg():.1f} (a shared machine: other jobs run beside this)",
        flush=True,
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    sections = {
        "paged": lambda: section_paged(lm, workload(lm, 96, seed=2), 512, 8, steps=3),
        "prefix": lambda: section_prefix(lm, 6),
        "spec": lambda: section_spec(lm, args.spec_tokens),
        "batching": lambda: section_batching(
            lm, work, settings, objective, args.arrival_rate or None
        ),
        "step": lambda: section_step(lm, args.step_count),
        "llamacpp": lambda: section_llamacpp(
            lm if args.weights == "fp32" else load_model(args.model, 1024, weights=args.weights),
            64,
            args.threads,
        ),
        "weights": lambda: section_weights(
            args.model,
            args.threads,
            llamacpp_python() if "llamacpp" in only and args.model == "smollm2-135m" else None,
        ),
        "neighbour": lambda: section_neighbour(args.model, args.threads, args.before_src),
        "profile": lambda: section_profile(args.threads),
        "onestream": lambda: section_onestream(args.before_src),
    }
    for name, fn in sections.items():
        if name not in only or (name == "llamacpp" and lm.name != "smollm2-135m"):
            continue
        res[name] = fn()
        res["load_end"] = loadavg()
        # Written after every section: a long run that is stopped keeps what it measured.
        args.out.write_text(json.dumps(res, indent=2))
    res["bench_wall_s"] = round(time.perf_counter() - t_start, 1)
    args.out.write_text(json.dumps(res, indent=2))
    print(
        f"wrote {args.out}; took {res['bench_wall_s']:.0f} s; load average at the end "
        f"{loadavg():.1f}"
    )


if __name__ == "__main__":
    main()
