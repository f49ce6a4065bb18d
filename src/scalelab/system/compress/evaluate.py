"""Quality per class: precision, recall, F1, and each variant's change against the baseline.

"Overall" is macro F1 (the unweighted mean over classes): the flights classes are skewed (most
flights leave on time), so accuracy would hide a variant that gives up on the rare classes, the
very loss compression tends to cause. Accuracy and support-weighted F1 are reported beside it.
Deltas are in points (x100); a class is flagged when its F1 falls by more than the tolerance.
The scores themselves (and the macro rule) are core/quality.py's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from scalelab.lab.core.quality import Quality, scores


@dataclass(frozen=True, kw_only=True)
class Delta:
    """A variant's quality against the baseline's, in points."""

    macro_f1_points: float
    accuracy_points: float
    per_class_f1_points: dict[str, float]
    worst_class: str
    worst_class_points: float
    flagged: list[str] = field(default_factory=list)
    """Classes whose F1 fell by more than the tolerance."""

    def as_dict(self) -> dict[str, Any]:
        return {"macro_f1_points": self.macro_f1_points, "accuracy_points": self.accuracy_points,
                "per_class_f1_points": self.per_class_f1_points, "worst_class": self.worst_class,
                "worst_class_points": self.worst_class_points, "flagged": self.flagged}


def evaluate(y_true: np.ndarray | torch.Tensor, y_pred: np.ndarray | torch.Tensor,
             classes: list[str]) -> Quality:
    """Per-class P/R/F1 by core/quality.py's rule; rows labelled -1 (unlabelled) are ignored."""
    t = np.asarray(y_true.cpu() if isinstance(y_true, torch.Tensor) else y_true, dtype=np.int64)
    p = np.asarray(y_pred.cpu() if isinstance(y_pred, torch.Tensor) else y_pred, dtype=np.int64)
    keep = t >= 0
    return scores(t[keep], p[keep], classes)


def compare(baseline: Quality, variant: Quality, *, tolerance_points: float = 1.0) -> Delta:
    """Variant minus baseline, in points; flags classes losing more than `tolerance_points`."""
    per = {v.name: 100.0 * (v.f1 - b.f1)
           for b, v in zip(baseline.classes, variant.classes, strict=True)}
    worst = min(per, key=lambda c: per[c])
    return Delta(macro_f1_points=100.0 * (variant.macro_f1 - baseline.macro_f1),
                 accuracy_points=100.0 * (variant.accuracy - baseline.accuracy),
                 per_class_f1_points=per, worst_class=worst, worst_class_points=per[worst],
                 flagged=[c for c, d in per.items() if d < -tolerance_points])


@torch.inference_mode()
def predict_proba(module: Any, categorical: torch.Tensor, numeric: torch.Tensor, *,
                  batch_size: int = 4096) -> torch.Tensor:
    """Softmax probabilities on CPU, in batches (bounded memory on any set size); inputs go
    to the module's device first."""
    device = categorical.device
    if isinstance(module, torch.nn.Module):
        device = next((p.device for p in module.parameters()), device)
    parts = []
    for i in range(0, int(categorical.shape[0]), batch_size):
        logits = module(categorical[i:i + batch_size].to(device),
                        numeric[i:i + batch_size].to(device))
        parts.append(torch.softmax(logits.float(), dim=1).cpu())
    return torch.cat(parts) if parts else torch.zeros((0, 0))
