"""The promotion gate's rule, pure: a candidate is refused when it is worse than the current
version beyond a tolerance, overall (accuracy, macro F1) or for any single class (per-class F1).

`scalelab serve promote` applies it to a holdout file through the serving repository; the online
updater applies it to the latest labelled window in process. Both call these functions, so the
two gates cannot drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from scalelab.lab.core.quality import scores


@dataclass(kw_only=True, frozen=True)
class HoldoutQuality:
    """One version's quality on the holdout."""

    version: int
    rows: int
    accuracy: float
    macro_f1: float
    per_class_f1: dict[str, float | None]
    """None where the class neither occurs nor is predicted (F1 undefined)."""


def evaluation(version: int, y: np.ndarray, pred: np.ndarray,
               classes: list[str] | tuple[str, ...]) -> HoldoutQuality:
    """Accuracy, macro F1 and per-class F1 by core/quality.py's one rule."""
    q = scores(y, pred, classes)
    return HoldoutQuality(version=version, rows=q.n, accuracy=q.accuracy, macro_f1=q.macro_f1,
                          per_class_f1=q.per_class_f1)


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
