"""Features with a version: the vocabularies and statistics an update encodes with.

A FeatureSpec is fitted once (on the bootstrap window) and kept while updates fine-tune: the
embedding tables' sizes depend on the vocabularies, so a fine-tune cannot change them. Its
version (nets.feature_version) is recorded with every model and decision; refitting (a retrain)
makes a new version. Encoding is vectorised (one polars replace per column): the whole year's
336,776 events encode in well under a second.

The spec also keeps the reference distributions of its fitting window (quantile bins per numeric
feature, value shares per categorical) for the skew check before promotion.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

from scalelab.layers.nets.feature_version import feature_version
from scalelab.layers.nets.flights import CATEGORICAL, CLASSES, LABEL, NUMERIC

UNK = "<UNK>"
BINS = 10


@dataclass(kw_only=True)
class FeatureSpec:
    categorical: dict[str, list[str]]
    """Column -> vocabulary; index 0 is unknown."""
    numeric: dict[str, dict[str, float]]
    """Column -> {"mean", "std"} used to impute nulls and standardise."""
    classes: list[str] = field(default_factory=lambda: list(CLASSES))
    reference: dict[str, Any] = field(default_factory=dict)
    """Column -> reference distribution (numeric: bin edges and shares; categorical: shares)."""

    @classmethod
    def fit(cls, frame: pl.DataFrame) -> FeatureSpec:
        cats = {c: [UNK, *sorted(str(v) for v in frame.get_column(c).drop_nulls().unique())]
                for c in CATEGORICAL}
        nums: dict[str, dict[str, float]] = {}
        for c in NUMERIC:
            col = frame.get_column(c).drop_nulls().drop_nans().cast(pl.Float64)
            mean = float(col.mean()) if len(col) else 0.0  # type: ignore[arg-type]
            std = float(col.std()) if len(col) > 1 else 0.0  # type: ignore[arg-type]
            # A constant column (month in a one-month window) would divide by zero.
            nums[c] = {"mean": mean, "std": std if std > 0 and math.isfinite(std) else 1.0}
        spec = cls(categorical=cats, numeric=nums)
        spec.reference = reference_distribution(frame)
        return spec

    @property
    def version(self) -> str:
        return feature_version(self.to_dict())

    def cardinalities(self) -> list[int]:
        return [len(self.categorical[c]) for c in CATEGORICAL]

    def to_dict(self) -> dict[str, Any]:
        """preprocess.json's content (what the server and `serve promote` read)."""
        return {"categorical": self.categorical, "numeric": self.numeric,
                "classes": self.classes}

    def encode(self, frame: pl.DataFrame) -> tuple[np.ndarray, np.ndarray]:
        """(categorical int64 [N, 4], numeric float32 [N, 14])."""
        cat = frame.select(
            pl.col(c).cast(pl.String).replace_strict(
                vocab, list(range(len(vocab))), default=0, return_dtype=pl.Int64)
            for c, vocab in self.categorical.items()).to_numpy()
        num = frame.select(
            ((pl.col(c).cast(pl.Float64).fill_nan(None).fill_null(s["mean"]) - s["mean"])
             / s["std"]).cast(pl.Float32)
            for c, s in self.numeric.items()).to_numpy()
        return np.ascontiguousarray(cat, dtype=np.int64), np.ascontiguousarray(num)

    def labels(self, frame: pl.DataFrame) -> np.ndarray:
        return frame.get_column(LABEL).cast(pl.Int64).to_numpy()


def reference_distribution(frame: pl.DataFrame) -> dict[str, Any]:
    ref: dict[str, Any] = {}
    for c in NUMERIC:
        x = frame.get_column(c).cast(pl.Float64).drop_nulls().drop_nans().to_numpy()
        if x.size < BINS:
            continue
        edges = np.unique(np.quantile(x, np.linspace(0, 1, BINS + 1))[1:-1])
        ref[c] = {"edges": edges.tolist(), "shares": _shares(x, edges).tolist()}
    for c in CATEGORICAL:
        vc = frame.get_column(c).drop_nulls().value_counts()
        total = int(vc.get_column("count").sum())
        ref[c] = {"shares": {str(k): n / total for k, n in vc.iter_rows()}} if total else None
    return ref


def _shares(x: np.ndarray, edges: np.ndarray) -> np.ndarray:
    counts = np.bincount(np.searchsorted(edges, x, side="right"), minlength=len(edges) + 1)
    return counts / max(1, x.size)


def psi(ref_shares: np.ndarray, cur_shares: np.ndarray, floor: float = 1e-4) -> float:
    """Population stability index sum((q - p) ln(q / p)) over shared bins (pure); empty bins
    are floored so a bin the reference never saw counts as strong evidence, not infinity."""
    p = np.clip(np.asarray(ref_shares, dtype=np.float64), floor, None)
    q = np.clip(np.asarray(cur_shares, dtype=np.float64), floor, None)
    return float(((q - p) * np.log(q / p)).sum())


def linf(ref: dict[str, float], cur: dict[str, float]) -> float:
    """L-infinity distance between two value-share maps (pure; TFDV's categorical measure)."""
    keys = set(ref) | set(cur)
    return max((abs(ref.get(k, 0.0) - cur.get(k, 0.0)) for k in keys), default=0.0)


def skew(spec: FeatureSpec, frame: pl.DataFrame, thresholds: dict[str, tuple[float | None,
                                                                           float | None]],
         min_rows: int = 200) -> dict[str, dict[str, float]]:
    """Features of `frame` whose distribution left the spec's reference beyond their threshold:
    column -> {"measure": value, "threshold": t}. thresholds: column -> (psi, linf); None = off.
    Fewer than `min_rows` rows say too little to judge (nothing is flagged)."""
    out: dict[str, dict[str, float]] = {}
    if frame.height < min_rows:
        return out
    for c, (t_psi, t_linf) in thresholds.items():
        ref = spec.reference.get(c)
        if ref is None:
            continue
        if c in NUMERIC and t_psi is not None:
            x = frame.get_column(c).cast(pl.Float64).drop_nulls().drop_nans().to_numpy()
            if x.size < min_rows:
                continue
            v = psi(np.asarray(ref["shares"]), _shares(x, np.asarray(ref["edges"])))
            if v > t_psi:
                out[c] = {"psi": v, "threshold": t_psi}
        elif c in CATEGORICAL and t_linf is not None:
            vc = frame.get_column(c).drop_nulls().value_counts()
            total = int(vc.get_column("count").sum())
            v = linf(ref["shares"], {str(k): n / total for k, n in vc.iter_rows()})
            if v > t_linf:
                out[c] = {"linf": v, "threshold": t_linf}
    return out
