"""The promotion gate's rule, pure: a candidate is refused when it is worse than the current
version beyond a tolerance, overall (accuracy, macro F1) or for any single class (per-class F1).

`scalelab serve promote` applies it to a holdout file through the serving repository; the online
updater applies it to the latest labelled window in process. Both call these functions, so the
two gates cannot drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(kw_only=True, frozen=True)
class HoldoutQuality:
    """One version's quality on the holdout."""

    version: int
    rows: int
    accuracy: float
    macro_f1: float
    per_class_f1: dict[str, float | None]
    """None where the class neither occurs nor is predicted (F1 undefined)."""


def per_class_f1(y: np.ndarray, pred: np.ndarray, n_classes: int) -> list[float | None]:
    """F1 per class (pure); None when the class has no support and no predictions."""
    out: list[float | None] = []
    for c in range(n_classes):
        tp = int(((pred == c) & (y == c)).sum())
        fp = int(((pred == c) & (y != c)).sum())
        fn = int(((pred != c) & (y == c)).sum())
        out.append(None if tp + fp + fn == 0 else 2 * tp / (2 * tp + fp + fn))
    return out


def evaluation(version: int, y: np.ndarray, pred: np.ndarray,
               classes: list[str] | tuple[str, ...]) -> HoldoutQuality:
    """Accuracy, macro F1 (mean over the classes where F1 is defined) and per-class F1."""
    f1 = per_class_f1(y, pred, len(classes))
    defined = [f for f in f1 if f is not None]
    return HoldoutQuality(version=version, rows=len(y),
                          accuracy=float((pred == y).mean()) if len(y) else 0.0,
                          macro_f1=float(np.mean(defined)) if defined else 0.0,
                          per_class_f1=dict(zip(classes, f1, strict=True)))


def compare(cur: HoldoutQuality, cand: HoldoutQuality, tolerance: float) -> list[str]:
    """Reasons to refuse `cand` (pure): any metric more than `tolerance` below `cur`'s."""
    reasons = []
    for what, a, b in (("accuracy", cur.accuracy, cand.accuracy),
                       ("macro F1", cur.macro_f1, cand.macro_f1)):
        if b < a - tolerance:
            reasons.append(f"{what} {b:.4f} < current {a:.4f} - tolerance {tolerance}")
    for cls, a2 in cur.per_class_f1.items():
        b2 = cand.per_class_f1.get(cls)
        if a2 is not None and (b2 if b2 is not None else 0.0) < a2 - tolerance:
            reasons.append(f"class {cls!r} F1 {b2 or 0.0:.4f} < current {a2:.4f} - tolerance "
                           f"{tolerance}")
    return reasons
