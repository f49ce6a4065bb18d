"""Classification quality, defined once: per-class precision, recall and F1; accuracy; macro and
support-weighted means; and the one key format a record's `quality` field uses for them.

The macro rule is scikit-learn's `f1_score(average="macro", zero_division=0)` with its default
labels, the classes present in y_true ∪ y_pred:

- a class with true rows or predictions counts in the macro mean; where it was never predicted
  its precision is 0, where it has no true rows its recall is 0 (zero_division=0), so its F1 is 0;
- a class that neither occurs nor is predicted has no defined F1 (`ClassScores.defined` is
  False, its numbers read 0) and is left out of the macro mean, so a holdout that lacks a rare
  class by chance does not score every model lower.

Per-class keys in a record's `quality` are `f1.<class>`, `precision.<class>`, `recall.<class>`
(`quality_key`). Model manifests written before this module hold `f1_<class>` in their
`metrics`; nothing reads per-class keys back from disk, so they stay as written.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


def quality_key(metric: str, cls: str) -> str:
    """The key of a per-class metric (`f1`, `precision`, `recall`) in a record's `quality`."""
    return f"{metric}.{cls}"


@dataclass(frozen=True, kw_only=True)
class ClassScores:
    """One class's scores."""

    name: str
    support: int
    """Rows whose true label is this class."""
    predicted: int
    """Rows predicted as this class."""
    precision: float
    recall: float
    f1: float

    @property
    def defined(self) -> bool:
        """Whether the class occurs or is predicted (else its F1 is undefined, out of the mean)."""
        return self.support + self.predicted > 0


@dataclass(frozen=True, kw_only=True)
class Quality:
    """Quality of one set of predictions against its labels."""

    classes: list[ClassScores]
    accuracy: float
    macro_precision: float
    macro_recall: float
    macro_f1: float
    weighted_f1: float
    """Mean F1 weighted by support."""
    n: int

    @property
    def per_class_f1(self) -> dict[str, float | None]:
        """F1 by class name; None where undefined (the class neither occurs nor is predicted)."""
        return {c.name: c.f1 if c.defined else None for c in self.classes}

    def as_dict(self) -> dict[str, float]:
        """Flat numbers for a record's `quality` field (per-class keys by `quality_key`)."""
        out = {"accuracy": self.accuracy, "macro_f1": self.macro_f1,
               "macro_precision": self.macro_precision, "macro_recall": self.macro_recall,
               "weighted_f1": self.weighted_f1}
        for c in self.classes:
            out[quality_key("f1", c.name)] = c.f1
            out[quality_key("precision", c.name)] = c.precision
            out[quality_key("recall", c.name)] = c.recall
        return out


def _div(a: float, b: float) -> float:
    return a / b if b else 0.0


def _mean(xs: list[float]) -> float:
    return float(np.mean(xs)) if xs else 0.0


def scores(y_true: np.ndarray, y_pred: np.ndarray, classes: Sequence[str]) -> Quality:
    """Scores of integer predictions `y_pred` against labels `y_true` (class indices into
    `classes`), by the macro rule in the module docstring."""
    t = np.asarray(y_true, dtype=np.int64)
    p = np.asarray(y_pred, dtype=np.int64)
    if t.shape != p.shape:
        raise ValueError(f"labels {t.shape} and predictions {p.shape} differ in shape")
    k = len(classes)
    cm = np.zeros((k, k), dtype=np.int64)
    np.add.at(cm, (t, p), 1)
    out = []
    for i, name in enumerate(classes):
        tp, support, predicted = int(cm[i, i]), int(cm[i, :].sum()), int(cm[:, i].sum())
        prec, rec = _div(tp, predicted), _div(tp, support)
        out.append(ClassScores(name=name, support=support, predicted=predicted, precision=prec,
                               recall=rec, f1=_div(2 * prec * rec, prec + rec)))
    n = int(t.size)
    defined = [c for c in out if c.defined]
    return Quality(classes=out, accuracy=_div(float(np.trace(cm)), n),
                   macro_precision=_mean([c.precision for c in defined]),
                   macro_recall=_mean([c.recall for c in defined]),
                   macro_f1=_mean([c.f1 for c in defined]),
                   weighted_f1=_div(sum(c.f1 * c.support for c in out), n), n=n)

