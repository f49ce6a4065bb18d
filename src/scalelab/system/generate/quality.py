"""What quantized weights cost in quality: perplexity and next-token agreement, vs fp32.

Perplexity, teacher-forced next-token agreement and greedy agreement against fp32 (and, given
llama.cpp's predictions, next-token agreement with llama.cpp).

Each is measured against the fp32 model of the same source (for a GGUF: its blocks
dequantized to fp32), on `heldout.json` beside this file: ~3.9 KB of prose written for this
project (so no model was trained on it) and 24 prompts. Teacher-forced: the text's own tokens
go in, and at every position the argmax of the logits is compared (one prediction per position,
no drift after a first divergence); llama.cpp reads the same GGUF file and the same ids
(generate.llamacpp). The gate (`GATE`): q4 perplexity within 1% of fp32's either way; int8 at
most 1% higher.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from scalelab.lab.core.errors import BadUsageError
from scalelab.layers.nets.llama import LlamaForCausalLM
from scalelab.system.generate.engine import LlmEngine, LlmEngineConfig
from scalelab.system.generate.linears import weight_bytes
from scalelab.system.generate.llamacpp import LlamaCppReference, llamacpp_reference
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


def windows(ids: list[int], window: int = 256) -> list[list[int]]:
    """The text's ids cut into non-overlapping windows of `window` predictions: each window is
    its `window` inputs plus the next id (the last input's target); each is read from its own
    start, so every setting and llama.cpp score the same positions."""
    out = []
    for start in range(0, len(ids) - 1, window):
        chunk = ids[start : start + window + 1]
        if len(chunk) < 2:
            break
        out.append(chunk)
    return out


@dataclass(frozen=True)
class TextScore:
    """A model teacher-forced over a text (`windows`): what it predicts at every position."""

    perplexity: float
    """exp(mean next-token NLL) over every scored position."""
    argmax: list[int]
    """The model's most likely next token at every position, the windows in order."""


@torch.inference_mode()
def score_text(
    model: LlamaForCausalLM, tokenizer: TextTokenizer, text: str, window: int = 256
) -> TextScore:
    """Perplexity and the next-token argmax at every position of `text`, over `windows`."""
    nll, count, argmax = 0.0, 0, []
    for ids in windows(tokenizer.encode(text), window):
        chunk = torch.tensor([ids])
        logits = model(chunk[:, :-1]).float()
        nll += float(F.cross_entropy(logits[0], chunk[0, 1:], reduction="sum"))
        count += chunk.shape[1] - 1
        argmax += logits[0].argmax(dim=-1).tolist()
    return TextScore(math.exp(nll / count), argmax)


def perplexity(
    model: LlamaForCausalLM, tokenizer: TextTokenizer, text: str, window: int = 256
) -> float:
    """exp(mean next-token NLL) over the text, in non-overlapping windows of `window` tokens
    (each scored from its own start: the same windows for every setting)."""
    return score_text(model, tokenizer, text, window).perplexity


def token_agreement(a: list[int], b: list[int]) -> float:
    """Share of positions where two teacher-forced next-token predictions are the same token
    (both read the same text: one prediction per position)."""
    if len(a) != len(b) or not a:
        raise ValueError(f"predictions for {len(a)} and {len(b)} positions")
    return sum(x == y for x, y in zip(a, b, strict=True)) / len(a)


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
    next_token_agreement: float
    """Teacher-forced over the held-out text: share of positions whose argmax is fp32's."""
    positions: int
    """Positions of the held-out text scored (each predicted from the text before it)."""
    llamacpp_agreement: float | None = None
    """Teacher-forced: share of positions whose argmax is llama.cpp's on the same GGUF file and
    ids (None: not measured, no --llamacpp)."""
    llamacpp_near_ties: int | None = None
    """Of the positions that differ from llama.cpp, those where llama.cpp's two best logits lie
    within NEAR_TIE of each other (a rounding away from the other choice)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


NEAR_TIE = 0.1
"""Logit gap under which llama.cpp's top two choices count as a near tie."""


@dataclass(frozen=True)
class Reference:
    """The fp32 model of a source, measured once for every setting compared with it."""

    loaded: LoadedModel
    score: TextScore
    greedy: list[list[int]]
    llamacpp: LlamaCppReference | None = None


def reference(
    model: str, *, num_tokens: int = 64, seed: int = 0, llamacpp: str | None = None,
    llamacpp_save: Path | None = None,
) -> Reference:
    """fp32's perplexity, teacher-forced predictions and greedy continuations on the held-out
    text; with `llamacpp` (an interpreter with llama-cpp-python, or a saved .json), llama.cpp's
    predictions on the same GGUF file and ids (llamacpp.llamacpp_reference)."""
    doc = heldout()
    ref = load_model(model, 512, seed=seed)
    lcpp = None
    if llamacpp is not None:
        if not ref.source.endswith(".gguf"):
            raise BadUsageError(f"--llamacpp needs a GGUF model (smollm2-135m or a .gguf file); "
                                f"{model} has none")
        ids = windows(ref.tokenizer.encode(doc["text"]))
        lcpp = llamacpp_reference(llamacpp, Path(ref.source), ids,
                                  threads=torch.get_num_threads(), save=llamacpp_save)
    return Reference(ref, score_text(ref.model, ref.tokenizer, doc["text"]),
                     greedy(ref, doc["prompts"], num_tokens), lcpp)


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
    ref: Reference | None = None,
) -> GenerationQuality:
    """Quality of `weights` against fp32 for one model spec (smollm2-135m, tiny, a .gguf), and
    against llama.cpp where `ref` has its predictions. `ref` reuses the fp32 measurements
    across settings."""
    check_weights(weights)
    doc = heldout()
    if ref is None:
        ref = reference(model, num_tokens=num_tokens, seed=seed)
    base = ref.loaded
    cand = base if weights == "fp32" else load_model(model, 512, seed=seed, weights=weights)
    # fp32 is the reference itself (re-measuring it after an engine packed its linears would
    # only show oneDNN's summation order)
    got = ref.score if weights == "fp32" else score_text(cand.model, cand.tokenizer, doc["text"])
    out = ref.greedy if weights == "fp32" else greedy(cand, doc["prompts"], num_tokens)
    share, same = agreement(out, ref.greedy)
    change = (got.perplexity / ref.score.perplexity - 1) * 100
    ok = abs(change) <= GATE[weights] if weights == "q4" else change <= GATE[weights] + 1e-9
    lc_share, ties = None, None
    if ref.llamacpp is not None:
        lc = ref.llamacpp
        lc_share = token_agreement(got.argmax, lc.argmax)
        ties = sum(a != b and m < NEAR_TIE
                   for a, b, m in zip(got.argmax, lc.argmax, lc.margin, strict=True))
    return GenerationQuality(
        weights=weights, perplexity=got.perplexity, perplexity_fp32=ref.score.perplexity,
        perplexity_change_pct=change, agreement=share, identical=same,
        prompts=len(doc["prompts"]), tokens=num_tokens, weight_bytes=weight_bytes(cand.model),
        weight_bytes_fp32=weight_bytes(base.model), passes=ok,
        next_token_agreement=token_agreement(got.argmax, ref.score.argmax),
        positions=len(got.argmax), llamacpp_agreement=lc_share, llamacpp_near_ties=ties,
    )
