"""Speculative decoding by prompt lookup: draft the tokens that followed the last occurrence of
the sequence's newest n-gram, then let the target model check them all in one forward.

No second model: on quoting, code editing or any repetitive text the continuation is often
already in the context. Verification is greedy: a draft token is kept while it equals the
target's argmax at its position; the first disagreement is replaced by the target's own token,
so the output is exactly what plain greedy decoding would produce.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from scalelab.lab.core.errors import BadUsageError


@dataclass(kw_only=True)
class SpecConfig:
    num_draft: int = 4
    """Most tokens drafted per step."""
    ngram_max: int = 3
    """Longest suffix looked up in the context."""
    ngram_min: int = 1
    """Shortest suffix still trusted for a lookup."""

    def __post_init__(self) -> None:
        if self.num_draft < 1 or not 1 <= self.ngram_min <= self.ngram_max:
            raise BadUsageError("num_draft >= 1 and 1 <= ngram_min <= ngram_max are required")


def propose(tokens: Sequence[int], cfg: SpecConfig) -> list[int]:
    """Draft tokens: what followed the most recent earlier match of the longest suffix."""
    n_tok = len(tokens)
    for n in range(min(cfg.ngram_max, n_tok - 1), cfg.ngram_min - 1, -1):
        suffix = list(tokens[n_tok - n :])
        # Most recent match first: recent context predicts the continuation best.
        for start in range(n_tok - n - 1, -1, -1):
            if list(tokens[start : start + n]) == suffix:
                follow = list(tokens[start + n : start + n + cfg.num_draft])
                if follow:
                    return follow
    return []


def accept_greedy(drafts: Sequence[int], targets: Sequence[int]) -> list[int]:
    """targets[i] is the target's argmax after drafts[:i] (len(drafts) + 1 of them).

    Returns the accepted drafts followed by one token of the target's own (always >= 1 token).
    """
    assert len(targets) == len(drafts) + 1
    out: list[int] = []
    for d, t in zip(drafts, targets, strict=False):
        if d != t:
            break
        out.append(d)
    out.append(targets[len(out)])
    return out
