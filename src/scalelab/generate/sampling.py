"""Choosing the next token from logits: greedy, temperature, top-p, per-request seeds."""

from __future__ import annotations

import torch

from scalelab.generate.sequence import SamplingParams


def top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Zero all but the smallest set of most likely tokens whose total reaches top_p."""
    if top_p >= 1.0:
        return probs
    sorted_p, order = probs.sort(descending=True)
    cum = sorted_p.cumsum(-1)
    # Keep a token if the mass before it is still short of top_p (the top token always stays).
    keep = (cum - sorted_p) < top_p
    kept = torch.zeros_like(probs).scatter(-1, order, sorted_p * keep)
    return kept / kept.sum(-1, keepdim=True)


def sample_one(
    logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None
) -> int:
    """One token from a (vocab,) row."""
    if params.greedy:
        return int(logits.argmax())
    probs = torch.softmax(logits.float() / params.temperature, dim=-1)
    probs = top_p_filter(probs, params.top_p)
    return int(torch.multinomial(probs, 1, generator=generator))


def make_generator(params: SamplingParams) -> torch.Generator | None:
    if params.greedy:
        return None
    gen = torch.Generator()
    if params.seed is not None:
        gen.manual_seed(params.seed)
    else:
        gen.seed()
    return gen
