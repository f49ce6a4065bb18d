"""Skew and drift between two datasets, feature by feature (TFDV-style measures).

- Categoricals: L-infinity distance between the normalised value distributions (non-null values):
  max over values v of |p_ref(v) - p_cur(v)|, in [0, 1]. Exact (from exact value counts).
- Numerics, on shared bins: `bins` (default 10) equal-mass bins cut at the reference's deciles.
  The cuts snap to the quantile sketch's fixed bucket boundaries, so both sides' bin masses are
  exact sums of sketch bucket counts (no interpolation; a repeated value never straddles a cut;
  discrete columns get fewer bins). The outer bins are open, so current values beyond the
  reference's range land in them.
  - Jensen-Shannon divergence, base 2, in [0, 1] (0 log 0 = 0; no smoothing needed).
  - Population stability index, sum (q - p) ln(q / p), with empty-bin proportions replaced by
    core/drift.py's `PSI_EPSILON` = 1e-4 (a bin empty on one side contributes ~ p ln(p / 1e-4),
    large but finite).
  - Two-sample Kolmogorov-Smirnov: scipy's `ks_2samp` on the raw values when both sides are
    DataFrames; from statistics only, D = max |F_ref - F_cur| over the sketch bucket boundaries
    (a lower bound of the exact D, within 1% in value) with the asymptotic p-value
    (Kolmogorov distribution, effective n = n m / (n + m)). `ks_method` says which was used.
- Temporal and other columns, and categoricals with more distinct values than the statistics
  keep exact counts for (ids), are listed as skipped with the reason.

The measures themselves are core/drift.py's; this module bins, picks and flags.

Default thresholds (schema.SkewThresholds, overridable per feature in the schema): L-inf 0.1
(TFDV's suggested starting point), JS 0.1, PSI 0.2 (the usual "major shift" line), KS p-value off.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from typing import Literal

import numpy as np
import polars as pl

from scalelab.lab.core.drift import js_divergence, ks_2samp, ks_counts, linf, psi
from scalelab.lab.core.errors import BadInputError
from scalelab.layers.nets.table_schema import Schema, SkewThresholds
from scalelab.system.data.schema import Anomaly
from scalelab.system.data.stats import ColumnStats, DatasetStats, QuantileSketch, compute_stats

BINS = 10


@dataclasses.dataclass(kw_only=True)
class FeatureSkew:
    """The comparison of one feature present on both sides."""

    name: str
    kind: Literal["categorical", "numeric", "skipped"]
    reference_count: int
    current_count: int
    reference_null_rate: float
    current_null_rate: float
    linf: float | None = None
    linf_value: str | None = None
    """The category where the L-infinity distance is attained."""
    js: float | None = None
    psi: float | None = None
    bins: int | None = None
    """Shared bins used for JS and PSI."""
    ks_statistic: float | None = None
    ks_pvalue: float | None = None
    ks_method: str | None = None
    """'scipy.ks_2samp' (raw values) or 'sketch' (from statistics)."""
    thresholds: SkewThresholds = dataclasses.field(default_factory=SkewThresholds)
    flagged: bool = False
    reasons: list[str] = dataclasses.field(default_factory=list)
    """Why it is flagged, e.g. 'psi 0.31 > 0.2'."""
    note: str | None = None
    """Why it was skipped."""


@dataclasses.dataclass(kw_only=True)
class SkewReport:
    """Per-feature skew plus the columns found on one side only."""

    reference_rows: int
    current_rows: int
    features: list[FeatureSkew]
    only_in_reference: list[str]
    only_in_current: list[str]

    @property
    def flagged(self) -> list[FeatureSkew]:
        return [f for f in self.features if f.flagged]


def shared_bins(ref: QuantileSketch, cur: QuantileSketch,
                bins: int = BINS) -> tuple[np.ndarray, np.ndarray]:
    """Counts of both sketches in `bins` equal-mass bins of the reference (see module doc)."""
    bk = ref.buckets()
    n = ref.count
    cum = np.cumsum([c for _, _, c in bk])
    cuts: list[tuple[int, int]] = []
    for j in range(1, bins):
        key = bk[int(np.searchsorted(cum, math.floor(j * n / bins), side="right"))][0]
        if key != bk[-1][0] and (not cuts or key > cuts[-1]):
            cuts.append(key)
    counts = []
    for sk in (ref, cur):
        c = np.zeros(len(cuts) + 1)
        for key, _, k in sk.buckets():
            c[bisect.bisect_left(cuts, key)] += k
        counts.append(c)
    return counts[0], counts[1]


def sketch_ks(ref: QuantileSketch, cur: QuantileSketch) -> tuple[float, float]:
    """KS statistic over the shared sketch bucket boundaries and its asymptotic p-value."""
    return ks_counts({k: c for k, _, c in ref.buckets()}, {k: c for k, _, c in cur.buckets()})


def _flag(f: FeatureSkew) -> None:
    t = f.thresholds
    for name, value, limit in (("linf", f.linf, t.linf), ("js", f.js, t.js),
                               ("psi", f.psi, t.psi)):
        if value is not None and limit is not None and value > limit:
            f.reasons.append(f"{name} {value:.4g} > {limit:g}")
    if f.ks_pvalue is not None and t.ks_pvalue is not None and f.ks_pvalue < t.ks_pvalue:
        f.reasons.append(f"ks p-value {f.ks_pvalue:.3g} < {t.ks_pvalue:g}")
    f.flagged = bool(f.reasons)


def _feature(name: str, r: ColumnStats, c: ColumnStats, thresholds: SkewThresholds, bins: int,
             ref_df: pl.DataFrame | None, cur_df: pl.DataFrame | None) -> FeatureSkew:
    f = FeatureSkew(name=name, kind="skipped", reference_count=r.count, current_count=c.count,
                    reference_null_rate=r.null_rate, current_null_rate=c.null_rate,
                    thresholds=thresholds)
    if r.kind != c.kind:
        f.note = f"kinds differ: {r.kind} ({r.dtype}) vs {c.kind} ({c.dtype})"
        f.reasons.append(f.note)
        f.flagged = True
        return f
    if r.count == 0 or c.count == 0:
        f.note = "no non-null values on one side"
        return f
    if r.categorical is not None and c.categorical is not None:
        if r.categorical.counts is None or c.categorical.counts is None:
            f.note = "too many distinct values for exact counts (an identifier?)"
            return f
        f.kind = "categorical"
        f.linf, f.linf_value = linf(r.categorical.counts, c.categorical.counts)
    elif r.numeric is not None and c.numeric is not None:
        if r.numeric.finite == 0 or c.numeric.finite == 0:
            f.note = "no finite values on one side"
            return f
        f.kind = "numeric"
        p, q = shared_bins(r.numeric.sketch, c.numeric.sketch, bins)
        f.bins, f.js, f.psi = len(p), js_divergence(p, q), psi(p, q)
        if ref_df is not None and cur_df is not None:
            xr, xc = (d.get_column(name).drop_nulls().cast(pl.Float64).to_numpy()
                      for d in (ref_df, cur_df))
            f.ks_statistic, f.ks_pvalue = ks_2samp(xr[np.isfinite(xr)], xc[np.isfinite(xc)])
            f.ks_method = "scipy.ks_2samp"
        else:
            f.ks_statistic, f.ks_pvalue = sketch_ks(r.numeric.sketch, c.numeric.sketch)
            f.ks_method = "sketch"
    else:
        f.note = f"{r.kind} columns are not compared"
        return f
    _flag(f)
    return f


def compare(reference: pl.DataFrame | DatasetStats, current: pl.DataFrame | DatasetStats, *,
            schema: Schema | None = None, bins: int = BINS) -> SkewReport:
    """Skew of `current` against `reference` for every column present on both sides.

    Train vs test, today vs yesterday, or training data vs a sample of served requests (a flat
    table of the feature columns: columns on one side only are listed, not compared).
    """
    if bins < 2:
        raise BadInputError(f"bins must be >= 2, got {bins}")
    ref_df = reference if isinstance(reference, pl.DataFrame) else None
    cur_df = current if isinstance(current, pl.DataFrame) else None
    rs = compute_stats(reference) if isinstance(reference, pl.DataFrame) else reference
    cs = compute_stats(current) if isinstance(current, pl.DataFrame) else current
    if rs.relative_accuracy != cs.relative_accuracy:
        raise BadInputError("reference and current statistics use different sketch accuracies; "
                            "recompute one of them with the other's settings")
    sch = schema or Schema(columns=[])
    features = [_feature(n, r, cs.columns[n], sch.skew_for(n), bins, ref_df, cur_df)
                for n, r in rs.columns.items() if n in cs.columns]
    return SkewReport(reference_rows=rs.rows, current_rows=cs.rows, features=features,
                      only_in_reference=[n for n in rs.columns if n not in cs.columns],
                      only_in_current=[n for n in cs.columns if n not in rs.columns])


def drift_anomalies(report: SkewReport) -> list[Anomaly]:
    """Flagged features as validation anomalies (kind 'drift', severity warning)."""
    return [Anomaly(kind="drift", severity="warning", column=f.name,
                    description="drift vs previous: " + "; ".join(f.reasons))
            for f in report.flagged]
