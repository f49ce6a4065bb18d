"""Held-out quality: accuracy, per-class and macro precision/recall/F1, cross-entropy, calibration.

Calibration is the expected calibration error (ECE) over equal-width confidence bins of the
top-class probability, with the reliability table (per bin: mean confidence vs accuracy) that
shows where the model is over- or under-confident. Precision, recall and F1 (and the macro rule)
are core/quality.py's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from scalelab.lab.core import quality
from scalelab.lab.core.quality import ClassScores, quality_key


@dataclass(frozen=True, kw_only=True)
class ReliabilityBin:
    low: float
    high: float
    count: int
    confidence: float | None
    accuracy: float | None


@dataclass(frozen=True, kw_only=True)
class Evaluation:
    n: int
    loss: float
    """Mean cross-entropy (nats) on the held-out split."""
    accuracy: float
    macro_precision: float
    macro_recall: float
    macro_f1: float
    per_class: list[ClassScores]
    ece: float
    reliability: list[ReliabilityBin]

    def summary(self) -> dict[str, float]:
        """Flat numbers for the model manifest (per-class keys by core/quality.py's format)."""
        out = {"accuracy": self.accuracy, "macro_f1": self.macro_f1,
               "macro_precision": self.macro_precision, "macro_recall": self.macro_recall,
               "test_loss": self.loss, "ece": self.ece}
        out.update({quality_key("f1", c.name): c.f1 for c in self.per_class})
        return out


def scores(probs: torch.Tensor, y: torch.Tensor, classes: list[str], *,
           bins: int = 10) -> Evaluation:
    """Quality of predicted class probabilities `probs` [N, C] against labels `y` [N]."""
    n = int(y.shape[0])
    pred = probs.argmax(dim=1)
    q = quality.scores(y.cpu().numpy(), pred.cpu().numpy(), classes)
    conf = probs.max(dim=1).values.double()
    correct = (pred == y).double()
    rel, ece = [], 0.0
    for b in range(bins):
        lo, hi = b / bins, (b + 1) / bins
        mask = (conf > lo) & (conf <= hi) if b else (conf >= lo) & (conf <= hi)
        cnt = int(mask.sum())
        if cnt:
            c, a = float(conf[mask].mean()), float(correct[mask].mean())
            ece += cnt / n * abs(c - a)
            rel.append(ReliabilityBin(low=lo, high=hi, count=cnt, confidence=c, accuracy=a))
        else:
            rel.append(ReliabilityBin(low=lo, high=hi, count=0, confidence=None, accuracy=None))
    nll = float(-torch.log(probs.double().gather(1, y.view(-1, 1)).clamp_min(1e-12)).mean())
    return Evaluation(
        n=n, loss=nll, accuracy=float(correct.mean()) if n else 0.0,
        macro_precision=q.macro_precision, macro_recall=q.macro_recall, macro_f1=q.macro_f1,
        per_class=q.classes, ece=ece, reliability=rel,
    )


@torch.no_grad()
def evaluate(model: nn.Module, cat: torch.Tensor, num: torch.Tensor, y: torch.Tensor,
             classes: list[str], *, batch: int = 8192) -> Evaluation:
    was_training = model.training
    model.eval()
    probs = torch.cat([torch.softmax(model(cat[i:i + batch], num[i:i + batch]).float(), dim=1)
                       for i in range(0, int(y.shape[0]), batch)])
    model.train(was_training)
    return scores(probs, y, classes)
