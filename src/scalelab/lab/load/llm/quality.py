"""Output quality under load: greedy agreement with the same endpoint answering one at a time.

A server that batches can change what it generates: padded or differently shaped matmuls sum
in another order, a prefix-cache hit skips a recomputation, a quantized KV pool rounds, and at
temperature 0 one flipped argmax changes every token after it. The probe measures that without
a tokenizer or the model's weights, so it works against any OpenAI-compatible endpoint: a few
seeded prompts are first answered one at a time (concurrency 1: the unbatched reference), then
sent again as the first measured requests of every load level, and each level's answers are
compared with the reference, prompt by prompt:

- identical: the same text and the same number of tokens;
- prefix agreement: the share of the reference's tokens streamed before the first character
  that differs (1.0 when identical), averaged over the level's probe answers.

Token boundaries come from the stream: with one token per event (vLLM without speculative
decoding, usage in every chunk) the count is exact; when events carry several tokens an event
counts as matched only if all of it precedes the divergence (a lower bound), and with no usage
at all one token per event is assumed (the basis says which). Where it cannot be measured —
sampling at temperature > 0, a reference that failed or streamed no text — the answer says
"not measured" and why, instead of a number.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from statistics import fmean

from scalelab.lab.load.llm.stream import ProbeAnswer


@dataclass(frozen=True, kw_only=True)
class Match:
    """One probe prompt's answer at a level against its reference."""

    index: int
    """The probe prompt."""
    identical: bool
    """Same text and the same number of tokens."""
    matched_tokens: int
    """Reference tokens streamed before the first differing character."""
    reference_tokens: int
    """Tokens of the reference answer."""

    @property
    def share(self) -> float:
        return self.matched_tokens / self.reference_tokens if self.reference_tokens else 1.0


@dataclass(frozen=True, kw_only=True)
class Agreement:
    """A level's greedy agreement with the one-at-a-time reference."""

    prompts: int
    """Probe prompts (the reference's size)."""
    compared: int
    """Answers compared (the level's successful probe answers with a reference)."""
    failed: int
    """Probe answers that failed at the level (not compared)."""
    identical_share: float | None
    """Share of compared answers identical to the reference; None: not measured."""
    prefix_agreement: float | None
    """Mean share of reference tokens matched before the first divergence; None: not
    measured."""
    basis: str
    """How token boundaries were known."""
    not_measured: str | None = None
    """Why there is no number (None when measured)."""
    matches: list[Match] = field(default_factory=list)
    """Per answer, in the order answered."""

    def quality(self) -> dict[str, float]:
        """The record's quality fields (empty when not measured)."""
        if self.identical_share is None or self.prefix_agreement is None:
            return {}
        return {"greedy_identical_share": self.identical_share,
                "greedy_prefix_agreement": self.prefix_agreement}

    def extras(self) -> dict[str, object]:
        """The record's `quality_probe` extra (and `quality_not_measured` when so)."""
        d: dict[str, object] = {"quality_probe": {
            "prompts": self.prompts, "compared": self.compared, "failed": self.failed,
            "reference": "the same prompts one at a time (concurrency 1), same endpoint",
            "basis": self.basis, "shares": [round(m.share, 6) for m in self.matches],
            "identical": [m.identical for m in self.matches]}}
        if self.not_measured is not None:
            d["quality_not_measured"] = self.not_measured
        return d


def compare(ref: ProbeAnswer, got: ProbeAnswer) -> Match:
    """`got` against `ref` (both successful): identical, and the tokens matched before the
    first differing character (a reference event counts only when all of it matched)."""
    a, b = ref.text, got.text
    n = min(len(a), len(b))
    common = next((i for i in range(n) if a[i] != b[i]), n)
    total = sum(ref.tokens)
    identical = a == b and total == sum(got.tokens)
    matched, end = 0, 0
    for piece, k in zip(ref.pieces, ref.tokens, strict=True):
        end += len(piece)
        if end > common:
            break
        matched += k
    return Match(index=ref.index, identical=identical,
                 matched_tokens=total if identical else matched, reference_tokens=total)


def basis_of(reference: list[ProbeAnswer]) -> str:
    """How the reference's token boundaries were known (exact, whole events, or chunks)."""
    ok = [r for r in reference if r.error is None]
    if any(r.source == "chunks" for r in ok):
        return "chunks (no usage reported: one token per event assumed)"
    if all(r.source == "usage-continuous" and all(k == 1 for k in r.tokens) for r in ok):
        return "tokens (exact: one token per event)"
    return ("whole events (events carried several tokens; an event counts only when all of it "
            "precedes the divergence: a lower bound)")


def reference_problem(reference: list[ProbeAnswer], temperature: float) -> str | None:
    """Why the reference cannot serve (None: it can)."""
    if temperature > 0:
        return (f"sampling at temperature {temperature:g}: answers differ by design; greedy "
                "agreement needs --temperature 0")
    if not reference:
        return "no quality probe was sent"
    ok = [r for r in reference if r.error is None]
    if not ok:
        kinds = Counter(r.error for r in reference)
        return ("every reference request (one at a time) failed: "
                + ", ".join(f"{k}×{v}" for k, v in sorted(kinds.items(), key=str)))
    if not any(r.text for r in ok):
        return "the server streamed no text (only token counts), so answers cannot be compared"
    return None


def agreement(reference: list[ProbeAnswer], level: list[ProbeAnswer], *,
              temperature: float = 0.0) -> Agreement:
    """A level's probe answers against the reference (pure)."""
    refs = {r.index: r for r in reference if r.error is None}
    basis = basis_of(reference) if refs else "none"
    why = reference_problem(reference, temperature)
    failed = sum(1 for g in level if g.error is not None)
    if why is not None:
        return Agreement(prompts=len(reference), compared=0, failed=failed, identical_share=None,
                         prefix_agreement=None, basis=basis, not_measured=why)
    matches = [compare(refs[g.index], g) for g in level
               if g.error is None and g.index in refs]
    if not matches:
        return Agreement(prompts=len(reference), compared=0, failed=failed, identical_share=None,
                         prefix_agreement=None, basis=basis,
                         not_measured="no probe request succeeded at this level"
                         if failed else "the level sent none of the probe's prompts (fewer "
                         "measured requests than the probe?)")
    return Agreement(prompts=len(reference), compared=len(matches), failed=failed,
                     identical_share=sum(m.identical for m in matches) / len(matches),
                     prefix_agreement=fmean(m.share for m in matches), basis=basis,
                     matches=matches)
