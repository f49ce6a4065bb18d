"""Features with a version: the vocabularies and statistics an update encodes with.

A FeatureSpec (nets.flights.Preprocess, the one feature encoder, plus reference distributions)
is fitted once (on the bootstrap window) and kept while updates fine-tune: the
embedding tables' sizes depend on the vocabularies, so a fine-tune cannot change them. Its
version (nets.feature_version) is recorded with every model and decision; refitting (a retrain)
makes a new version. Encoding is vectorised (one polars replace per column): the whole year's
336,776 events encode in well under a second.

The spec also keeps the reference distributions of its fitting window (quantile bins per numeric
feature, value shares per categorical) for the skew check before promotion.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

from scalelab.lab.core.drift import linf, psi
from scalelab.layers.nets.feature_version import feature_version
from scalelab.layers.nets.flights import CATEGORICAL, NUMERIC, Preprocess

BINS = 10


@dataclass(kw_only=True)
class FeatureSpec:
    """The flights encoding an update fine-tunes with, plus its fitting window's reference
    distributions. The encoding is nets.flights.Preprocess, the one encoder training and
    serving use, so a published online model's preprocess.json is that of any other version."""

    pre: Preprocess
    reference: dict[str, Any] = field(default_factory=dict)
    """Column -> reference distribution (numeric: bin edges and shares; categorical: shares)."""

    @classmethod
    def fit(cls, frame: pl.DataFrame) -> FeatureSpec:
        return cls(pre=Preprocess.fit(frame), reference=reference_distribution(frame))

    @property
    def version(self) -> str:
        return feature_version(self.to_dict())

    def cardinalities(self) -> list[int]:
        return self.pre.cardinalities()

    def to_dict(self) -> dict[str, Any]:
        """preprocess.json's content (what the server and `serve promote` read)."""
        return self.pre.to_dict()

    def encode(self, frame: pl.DataFrame) -> tuple[np.ndarray, np.ndarray]:
        """(categorical int64 [N, 4], numeric float32 [N, 14])."""
        return self.pre.encode(frame)


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
            v, _ = linf(ref["shares"], {str(k): float(n) for k, n in vc.iter_rows()})
            if v > t_linf:
                out[c] = {"linf": v, "threshold": t_linf}
    return out
