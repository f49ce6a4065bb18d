"""Shared builders for the generation tests: the tiny model and a cache-free greedy reference."""

from __future__ import annotations

import torch

from scalelab.layers.nets.llama import LlamaForCausalLM, build_tiny
from scalelab.system.generate.engine import LlmEngine, LlmEngineConfig
from scalelab.system.generate.tokenizer import byte_tokenizer

TOK = byte_tokenizer()
MODEL = build_tiny(seed=1)


def engine(**kw: object) -> LlmEngine:
    cfg = {"kv_cache_bytes": 1 << 20, "block_size": 4, "max_model_len": 256, **kw}
    return LlmEngine(MODEL, TOK, LlmEngineConfig(**cfg))  # type: ignore[arg-type]


def greedy_reference(model: LlamaForCausalLM, prompt: list[int], n: int) -> list[int]:
    """Plain greedy decoding by full recomputation: no KV cache at all."""
    x = torch.tensor([prompt])
    out: list[int] = []
    with torch.inference_mode():
        for _ in range(n):
            t = int(model(x)[0, -1].argmax())
            out.append(t)
            x = torch.cat([x, torch.tensor([[t]])], dim=1)
    return out


def prompts(k: int) -> list[list[int]]:
    return [TOK.encode(f"prompt {i}: " + "abc def " * (i % 5 + 1)) for i in range(k)]
