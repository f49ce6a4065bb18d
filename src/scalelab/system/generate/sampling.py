"""Choosing the next token from logits: greedy, temperature, top-p, per-request seeds."""

from __future__ import annotations

import torch

from scalelab.system.generate.sequence import SamplingParams, TokenLogprob

LOGPROB_FLOOR = -9999.0
"""Stands in for -inf (a token top-p or a -inf logit rules out): JSON has no infinity."""


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


def adjust_logits(logits: torch.Tensor, params: SamplingParams,
                  output_ids: list[int]) -> torch.Tensor:
    """OpenAI's logit_bias, presence and frequency penalties on one (vocab,) row: a token seen
    c times in the output loses c * frequency_penalty + (c > 0) * presence_penalty. A copy;
    the raw row stays for logprobs (which vLLM reports before these too)."""
    out = logits.float().clone()
    if params.logit_bias:
        ids = torch.tensor(list(params.logit_bias), dtype=torch.long)
        out[ids] += torch.tensor(list(params.logit_bias.values()))
    if output_ids and (params.presence_penalty or params.frequency_penalty):
        counts = torch.bincount(torch.tensor(output_ids), minlength=out.shape[-1])
        counts = counts[: out.shape[-1]].float()
        out -= counts * params.frequency_penalty + (counts > 0).float() * params.presence_penalty
    return out


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


def token_logprobs(logits: torch.Tensor, tokens: list[int], k: int) -> list[TokenLogprob]:
    """Log-probabilities of `tokens[i]` under `logits[i]` (rows of (n, vocab)) with the k most
    likely tokens of each row: one log_softmax and one topk over the rows asked for."""
    lp = torch.log_softmax(logits[: len(tokens)].float(), dim=-1).clamp_min(LOGPROB_FLOOR)
    chosen = lp.gather(-1, torch.tensor(tokens)[:, None])[:, 0].tolist()
    if k > 0:
        vals, ids = lp.topk(k, dim=-1)
        tops = [tuple(zip(i, v, strict=True)) for i, v in zip(ids.tolist(), vals.tolist(),
                                                               strict=True)]
    else:
        tops = [() for _ in tokens]
    return [TokenLogprob(t, c, top) for t, c, top in zip(tokens, chosen, tops, strict=True)]
