"""What quantized weights cost in quality: perplexity and greedy agreement against fp32.

Both are measured against the fp32 model of the same source (for a GGUF: its blocks
dequantized to fp32), on `heldout.json` beside this file: ~3.9 KB of prose written for this
project (so no model was trained on it) and 24 prompts. The gate (`GATE`): q4 perplexity within
1% of fp32's either way; int8 at most 1% higher.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from scalelab.layers.nets.llama import LlamaForCausalLM
from scalelab.system.generate.engine import LlmEngine, LlmEngineConfig
from scalelab.system.generate.linears import weight_bytes
from scalelab.system.generate.models import LoadedModel, load_model
from scalelab.system.generate.quant import check_weights
from scalelab.system.generate.sequence import SamplingParams
from scalelab.system.generate.tokenizer import TextTokenizer

HELDOUT = Path(__file__).with_name("heldout.json")
GATE = {"fp32": 0.0, "int8": 1.0, "q4": 1.0}
"""Largest allowed perplexity change against fp32, percent (q4: either way; int8: increase)."""


def heldout() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(HELDOUT.read_text())
    return doc


@torch.inference_mode()
def perplexity(
    model: LlamaForCausalLM, tokenizer: TextTokenizer, text: str, window: int = 256
) -> float:
    """exp(mean next-token NLL) over the text, in non-overlapping windows of `window` tokens
    (each scored from its own start: the same windows for every setting)."""
    ids = tokenizer.encode(text)
    nll, count = 0.0, 0
    for start in range(0, len(ids) - 1, window):
        chunk = torch.tensor([ids[start : start + window + 1]])
        if chunk.shape[1] < 2:
            break
        logits = model(chunk[:, :-1]).float()
        nll += float(F.cross_entropy(logits[0], chunk[0, 1:], reduction="sum"))
        count += chunk.shape[1] - 1
    return math.exp(nll / count)


def greedy(loaded: LoadedModel, prompts: list[str], num_tokens: int) -> list[list[int]]:
    """Greedy continuations of exactly num_tokens (EOS ignored), all prompts batched."""
    eng = LlmEngine(loaded.model, loaded.tokenizer,
                    LlmEngineConfig(kv_cache_bytes=64 << 20, max_model_len=512,
                                    max_num_seqs=len(prompts)))
    ids = [loaded.tokenizer.encode(p) for p in prompts]
    seqs = eng.generate(ids, SamplingParams(max_tokens=num_tokens, ignore_eos=True))
    return [s.token_ids[s.num_prompt :] for s in seqs]


@dataclass
class GenerationQuality:
    weights: str
    perplexity: float
    perplexity_fp32: float
    perplexity_change_pct: float
    agreement: float
    """Mean over prompts of the share of the 64 tokens before the first divergence from fp32."""
    identical: int
    """Prompts whose whole continuation equals fp32's."""
    prompts: int
    tokens: int
    weight_bytes: int
    weight_bytes_fp32: int
    passes: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def agreement(a: list[list[int]], b: list[list[int]]) -> tuple[float, int]:
    """(mean share of tokens before the first divergence, count of identical rows)."""
    shares, same = [], 0
    for x, y in zip(a, b, strict=True):
        n = next((i for i, (p, q) in enumerate(zip(x, y, strict=True)) if p != q), len(x))
        shares.append(n / len(x))
        same += n == len(x)
    return sum(shares) / len(shares), same


def evaluate(
    model: str, weights: str, *, num_tokens: int = 64, seed: int = 0,
    reference: tuple[LoadedModel, float, list[list[int]]] | None = None,
) -> GenerationQuality:
    """Quality of `weights` against fp32 for one model spec (smollm2-135m, tiny, a .gguf).
    `reference` reuses an fp32 (model, perplexity, continuations) across settings."""
    check_weights(weights)
    doc = heldout()
    if reference is None:
        ref = load_model(model, 512, seed=seed)
        ref_bytes = weight_bytes(ref.model)
        ref_ppl = perplexity(ref.model, ref.tokenizer, doc["text"])
        ref_out = greedy(ref, doc["prompts"], num_tokens)
    else:
        ref, ref_ppl, ref_out = reference
        ref_bytes = weight_bytes(ref.model)
    cand = ref if weights == "fp32" else load_model(model, 512, seed=seed, weights=weights)
    # fp32 is the reference itself (re-measuring it after an engine packed its linears would
    # only show oneDNN's summation order)
    ppl = ref_ppl if weights == "fp32" else perplexity(cand.model, cand.tokenizer, doc["text"])
    out = ref_out if weights == "fp32" else greedy(cand, doc["prompts"], num_tokens)
    share, same = agreement(out, ref_out)
    change = (ppl / ref_ppl - 1) * 100
    ok = abs(change) <= GATE[weights] if weights == "q4" else change <= GATE[weights] + 1e-9
    return GenerationQuality(
        weights=weights, perplexity=ppl, perplexity_fp32=ref_ppl,
        perplexity_change_pct=change, agreement=share, identical=same,
        prompts=len(doc["prompts"]), tokens=num_tokens, weight_bytes=weight_bytes(cand.model),
        weight_bytes_fp32=ref_bytes, passes=ok,
    )
