"""Promotion gate: a candidate version replaces the current one only if it is not worse on a
holdout, overall (accuracy and macro F1) or for any single class (per-class F1), beyond a
tolerance. The holdout is a table in the flights feature contract; each version encodes it with
its own preprocess.json, exactly as a client of that version would.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl
import torch

from scalelab.core.errors import BadInputError, BadUsageError
from scalelab.nets import registry
from scalelab.nets.repository import check_version, version_dir, versions
from scalelab.serve import faults  # noqa: F401  (fault architectures can be evaluated too)
from scalelab.serve.canary import Routing, current_version, promote, read_routing
from scalelab.serve.features import encode, load_preprocess

LABEL = "delay_class"


@dataclass(kw_only=True, frozen=True)
class Evaluation:
    """One version's quality on the holdout."""

    version: int
    rows: int
    accuracy: float
    macro_f1: float
    per_class_f1: dict[str, float | None]
    """None where the class neither occurs nor is predicted (F1 undefined)."""


@dataclass(kw_only=True)
class Decision:
    current: Evaluation
    candidate: Evaluation
    tolerance: float
    accepted: bool
    reasons: list[str] = field(default_factory=list)
    """Why the candidate was refused (empty when accepted)."""
    routing: Routing | None = None
    """The routing written when accepted (None on refusal or dry run)."""


def per_class_f1(y: np.ndarray, pred: np.ndarray, n_classes: int) -> list[float | None]:
    """F1 per class (pure); None when the class has no support and no predictions."""
    out: list[float | None] = []
    for c in range(n_classes):
        tp = int(((pred == c) & (y == c)).sum())
        fp = int(((pred == c) & (y != c)).sum())
        fn = int(((pred != c) & (y == c)).sum())
        out.append(None if tp + fp + fn == 0 else 2 * tp / (2 * tp + fp + fn))
    return out


def compare(cur: Evaluation, cand: Evaluation, tolerance: float) -> list[str]:
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


def evaluate(repo: Path, model: str, version: int, frame: pl.DataFrame) -> Evaluation:
    vdir = version_dir(repo, model, version)
    pre = load_preprocess(vdir)
    if pre is None:
        raise BadInputError(f"{vdir} has no preprocess.json; promotion needs it to encode the "
                            "holdout")
    if LABEL not in frame.columns:
        raise BadInputError(f"the holdout has no {LABEL!r} column")
    y = frame.get_column(LABEL).cast(pl.Int64).to_numpy()
    cat, num = encode(frame, pre)
    module = registry.load_module(vdir)
    preds = []
    with torch.inference_mode():
        for s in range(0, len(y), 8192):
            logits = module(torch.from_numpy(cat[s:s + 8192]), torch.from_numpy(num[s:s + 8192]))
            preds.append(logits.argmax(dim=1).numpy())
    pred = np.concatenate(preds) if preds else np.zeros(0, dtype=np.int64)
    f1 = per_class_f1(y, pred, len(pre.classes))
    defined = [f for f in f1 if f is not None]
    return Evaluation(version=version, rows=len(y),
                      accuracy=float((pred == y).mean()) if len(y) else 0.0,
                      macro_f1=float(np.mean(defined)) if defined else 0.0,
                      per_class_f1=dict(zip(pre.classes, f1, strict=True)))


def gate(repo: Path, model: str, candidate: int, holdout: Path, *, tolerance: float = 0.01,
         dry_run: bool = False) -> Decision:
    """Evaluate candidate and current on `holdout`; promote (write serving.json) if not worse."""
    if not 0 <= tolerance < 1:
        raise BadUsageError(f"--tolerance {tolerance} must lie in [0, 1)")
    cand = check_version(candidate)
    if cand not in versions(repo, model):
        raise BadUsageError(f"model {model!r} has no version {cand} in {repo}")
    if not holdout.is_file():
        raise BadUsageError(f"holdout {holdout} does not exist")
    try:
        frame = pl.read_parquet(holdout)
    except Exception as e:  # polars raises several error types for non-Parquet input
        raise BadInputError(f"{holdout} is not a readable Parquet file ({e})") from e
    if frame.height == 0:
        raise BadInputError(f"holdout {holdout} has no rows")
    cur = current_version(repo, model, read_routing(repo, model), excluding=cand)
    if cur == cand:
        raise BadUsageError(f"version {cand} is already current")
    e_cur = evaluate(repo, model, cur, frame)
    e_cand = evaluate(repo, model, cand, frame)
    reasons = compare(e_cur, e_cand, tolerance)
    d = Decision(current=e_cur, candidate=e_cand, tolerance=tolerance, accepted=not reasons,
                 reasons=reasons)
    if d.accepted and not dry_run:
        d.routing = promote(repo, model, cand)
    return d
