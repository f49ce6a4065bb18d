"""Promotion gate: a candidate version replaces the current one only if it is not worse on a
holdout, overall (accuracy and macro F1) or for any single class (per-class F1), beyond a
tolerance. The holdout is a table in the flights feature contract; each version encodes it with
its own preprocess.json, exactly as a client of that version would. The pure rule (compare,
HoldoutQuality) lives in core/gate.py, shared with the online updater, and the scores in
core/quality.py; `compare` is re-exported here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl
import torch

from scalelab.lab.core.errors import BadInputError, BadUsageError
from scalelab.lab.core.gate import HoldoutQuality, compare, evaluation
from scalelab.layers.nets import registry
from scalelab.layers.nets.flights import LABEL
from scalelab.layers.nets.repository import check_version, version_dir, versions
from scalelab.system.serve import faults  # noqa: F401  (fault architectures can be evaluated too)
from scalelab.system.serve.canary import Routing, current_version, promote, read_routing
from scalelab.system.serve.features import encode, load_preprocess


@dataclass(kw_only=True)
class PromotionDecision:
    current: HoldoutQuality
    candidate: HoldoutQuality
    tolerance: float
    accepted: bool
    reasons: list[str] = field(default_factory=list)
    """Why the candidate was refused (empty when accepted)."""
    routing: Routing | None = None
    """The routing written when accepted (None on refusal or dry run)."""


def evaluate(repo: Path, model: str, version: int, frame: pl.DataFrame) -> HoldoutQuality:
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
    return evaluation(version, y, pred, pre.classes)


def gate(repo: Path, model: str, candidate: int, holdout: Path, *, tolerance: float = 0.01,
         dry_run: bool = False) -> PromotionDecision:
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
    d = PromotionDecision(current=e_cur, candidate=e_cand, tolerance=tolerance,
                          accepted=not reasons, reasons=reasons)
    if d.accepted and not dry_run:
        d.routing = promote(repo, model, cand)
    return d
