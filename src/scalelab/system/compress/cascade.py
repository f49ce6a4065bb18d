"""Cascade routing: the small model answers when it is sure (top probability >= tau), the large
model answers the rest. The policy is pure (probabilities in, decisions out) so the share routed
and the quality at every tau come exactly from one pass of each model over the test set; the
latency of each tau is then measured on the real composite (nets.variants.CascadeNet).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from scalelab.lab.core.errors import BadUsageError


def route(small_probs: torch.Tensor, tau: float) -> torch.Tensor:
    """Bool [n]: True where the row goes to the large model (small model's top prob < tau)."""
    if not 0.0 <= tau <= 1.0:
        raise BadUsageError(f"cascade threshold {tau} must be in [0, 1]")
    return small_probs.amax(dim=1) < tau


def combine(small_probs: torch.Tensor, large_probs: torch.Tensor, tau: float) -> torch.Tensor:
    """The cascade's probabilities: the large model's on routed rows, the small one's elsewhere."""
    to_large = route(small_probs, tau)
    return torch.where(to_large.unsqueeze(1), large_probs, small_probs)


@dataclass(frozen=True, kw_only=True)
class CascadePoint:
    """The cascade at one threshold."""

    tau: float
    share_to_large: float
    """Share of rows the large model had to answer."""
    predictions: torch.Tensor
    """Predicted class per row."""


def sweep(small_probs: torch.Tensor, large_probs: torch.Tensor,
          taus: list[float]) -> list[CascadePoint]:
    """The cascade's decisions at each tau (exact; no timing)."""
    out = []
    for tau in taus:
        to_large = route(small_probs, tau)
        probs = combine(small_probs, large_probs, tau)
        share = float(to_large.float().mean()) if to_large.numel() else 0.0
        out.append(CascadePoint(tau=tau, share_to_large=share, predictions=probs.argmax(dim=1)))
    return out


def choose_tau(macro_f1: dict[float, float], share: dict[float, float], baseline_f1: float,
               max_loss_points: float) -> float:
    """The threshold that routes the fewest rows to the large model while losing at most
    `max_loss_points` macro-F1 points against the baseline; the highest tau if none does."""
    ok = [t for t in macro_f1 if 100.0 * (baseline_f1 - macro_f1[t]) <= max_loss_points]
    if not ok:
        return max(macro_f1)
    return min(ok, key=lambda t: (share[t], t))
