"""A dataset schema (types, nullability, ranges, domains, uniqueness, row count, skew thresholds),
its inference from data and validation against it, with TFDV-like anomalies.

Validation works from mergeable statistics (`stats.DatasetStats`), so it also runs on statistics
merged from Dask partitions. Given a DataFrame it adds what statistics cannot hold: exact counts
and examples of out-of-range values, and exact duplicate counts of high-cardinality keys. From
statistics alone an out-of-range count is a lower bound from the quantile sketch (marked
`approximate`: values in the 1%-wide bucket straddling a bound are not counted), and uniqueness
of a column with more than `max_distinct` values is reported as not checkable (severity info).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any, Literal

import polars as pl

from scalelab.layers.nets.table_schema import (
    ColumnSchema,
    Schema,
    logical_type,
    type_ok,
)
from scalelab.system.data.stats import DatasetStats, compute_stats

MAX_DOMAIN = 1000
"""infer_schema lists a categorical column's domain when it has at most this many values."""
NULL_SLACK = 0.01
"""Inferred max_null_rate = observed rate * 1.1 + 0.01 (0 when no nulls were seen)."""
EXAMPLES = 5
"""Offending values listed per anomaly."""

Severity = Literal["error", "warning", "info"]


def infer_schema(data: pl.DataFrame | DatasetStats, *, max_domain: int = MAX_DOMAIN) -> Schema:
    """Propose a schema that the given data satisfies: observed types, null rates (with slack),
    [min, max] ranges, domains of categoricals with <= max_domain values, unique keys.

    Review it: ranges are the observed ones, so later data outside them is reported.
    The row count is not fixed (set `rows.expected` to check it).
    """
    stats = data if isinstance(data, DatasetStats) else compute_stats(data)
    cols = []
    for c in stats.columns.values():
        typ = logical_type(c.dtype)
        rate = c.null_rate
        cs = ColumnSchema(name=c.name, type=typ, nullable=c.nulls > 0,
                          max_null_rate=min(1.0, round(rate * 1.1 + NULL_SLACK, 6)) if c.nulls
                          else 0.0)
        if c.numeric is not None:
            cs.min, cs.max = c.numeric.min, c.numeric.max
        if c.categorical is not None and c.categorical.counts is not None:
            counts = c.categorical.counts
            if typ == "string" and len(counts) <= max_domain:
                cs.domain = sorted(counts)
            cs.unique = c.nulls == 0 and c.count > 1 and len(counts) == c.count
        elif (isinstance(data, pl.DataFrame) and typ in ("string", "integer") and c.nulls == 0
              and c.count > 1):
            cs.unique = data.get_column(c.name).n_unique() == c.count
        cols.append(cs)
    return Schema(columns=cols)


@dataclasses.dataclass(kw_only=True)
class Anomaly:
    """One finding of `validate`."""

    kind: str
    """missing_column, unexpected_column, type_mismatch, out_of_range, non_finite,
    unknown_category, null_rate_above_bound, duplicate_key, row_count_change, not_checkable,
    drift (skew.drift_anomalies)."""
    severity: Severity
    column: str | None
    """None for dataset-level anomalies."""
    description: str
    count: int | None = None
    """Offending values (or rows); None when not countable."""
    total: int | None = None
    """What `count` is out of (values in the column, or rows)."""
    examples: list[Any] = dataclasses.field(default_factory=list)
    approximate: bool = False
    """True when `count` is estimated from a sketch (validation from statistics only)."""


def validate(data: pl.DataFrame | DatasetStats, schema: Schema, *,
             previous: DatasetStats | None = None) -> list[Anomaly]:
    """Anomalies of `data` against `schema` (and row-count change vs `previous`)."""
    df = data if isinstance(data, pl.DataFrame) else None
    stats = compute_stats(data) if isinstance(data, pl.DataFrame) else data
    out: list[Anomaly] = []
    for name, seen in stats.columns.items():
        if schema.column(name) is None:
            out.append(Anomaly(kind="unexpected_column", severity="warning", column=name,
                               description=f"column {name!r} ({seen.dtype}) is not in the "
                                           "schema"))
    for cs in schema.columns:
        c = stats.columns.get(cs.name)
        if c is None:
            out.append(Anomaly(kind="missing_column", severity="error", column=cs.name,
                               description=f"column {cs.name!r} ({cs.type}) is missing"))
            continue
        actual = logical_type(c.dtype)
        if not type_ok(cs.type, actual):
            out.append(Anomaly(kind="type_mismatch", severity="error", column=cs.name,
                               description=f"expected {cs.type}, found {actual} ({c.dtype})"))
            continue
        total = c.count + c.nulls
        bound = 0.0 if not cs.nullable else cs.max_null_rate
        if bound is not None and c.null_rate > bound:
            out.append(Anomaly(kind="null_rate_above_bound", severity="error", column=cs.name,
                               count=c.nulls, total=total,
                               description=f"{c.nulls} nulls of {total} values (rate "
                                           f"{c.null_rate:.4g} > bound {bound:.4g})"))
        if c.numeric is not None:
            out += _range_anomalies(cs, c.numeric, df)
        if c.categorical is not None and cs.domain is not None:
            out += _domain_anomalies(cs, c.categorical.counts, df, c.count)
        if cs.unique:
            out += _unique_anomalies(cs, c, df)
    out += _row_anomalies(stats.rows, schema, previous)
    return out


def _range_anomalies(cs: ColumnSchema, n: Any, df: pl.DataFrame | None) -> list[Anomaly]:
    out: list[Anomaly] = []
    bad_nf = n.nan + n.pos_inf + n.neg_inf
    if bad_nf:
        out.append(Anomaly(kind="non_finite", severity="error", column=cs.name, count=bad_nf,
                           total=n.finite + bad_nf,
                           description=f"{n.nan} NaN, {n.pos_inf} +inf, {n.neg_inf} -inf values"))
    lo, hi = cs.min, cs.max
    if n.finite == 0 or ((lo is None or n.min >= lo) and (hi is None or n.max <= hi)):
        return out
    rng = f"[{'-inf' if lo is None else f'{lo:g}'}, {'inf' if hi is None else f'{hi:g}'}]"
    if df is not None:
        col = pl.col(cs.name).cast(pl.Float64)
        cond = pl.lit(False)
        if lo is not None:
            cond = cond | (col < lo)
        if hi is not None:
            cond = cond | (col > hi)
        bad = df.select(pl.col(cs.name).filter(cond & col.is_finite())).get_column(cs.name)
        count, approx = bad.len(), False
        examples = bad.unique().sort().head(EXAMPLES).to_list()
    else:
        # Only buckets wholly outside the range count: a lower bound, exact unless a bucket
        # (1% wide) straddles a bound and holds offending values.
        count = sum(k for b_lo, b_hi, k in n.sketch.intervals()
                    if (lo is not None and b_hi < lo) or (hi is not None and b_lo > hi))
        count, approx = max(count, 1), True
        examples = [v for v in (n.min, n.max)
                    if (lo is not None and v < lo) or (hi is not None and v > hi)]
    out.append(Anomaly(kind="out_of_range", severity="error", column=cs.name, count=count,
                       total=n.finite, examples=examples, approximate=approx,
                       description=f"{'~' if approx else ''}{count} values outside {rng} "
                                   f"(observed [{n.min:g}, {n.max:g}])"))
    return out


def _domain_anomalies(cs: ColumnSchema, counts: dict[str, int] | None, df: pl.DataFrame | None,
                      total: int) -> list[Anomaly]:
    allowed = set(cs.domain or [])
    if counts is None and df is not None:
        vc = df.get_column(cs.name).drop_nulls().cast(pl.String).value_counts()
        counts = dict(zip(vc[:, 0].to_list(), vc[:, 1].to_list(), strict=True))
    if counts is None:
        return [Anomaly(kind="not_checkable", severity="info", column=cs.name,
                        description="domain not checked: too many distinct values for exact "
                                    "counts in the statistics; validate the table itself")]
    unknown = {v: k for v, k in counts.items() if v not in allowed}
    if not unknown:
        return []
    n = sum(unknown.values())
    top = sorted(unknown.items(), key=lambda kv: (-kv[1], kv[0]))[:EXAMPLES]
    return [Anomaly(kind="unknown_category", severity="error", column=cs.name, count=n,
                    total=total, examples=[v for v, _ in top],
                    description=f"{n} values ({len(unknown)} distinct) outside the domain "
                                f"(e.g. {', '.join(repr(v) for v, _ in top)})")]


def _unique_anomalies(cs: ColumnSchema, c: Any, df: pl.DataFrame | None) -> list[Anomaly]:
    if df is not None:
        s = df.get_column(cs.name).drop_nulls()
        dups = s.len() - s.n_unique()
        examples = s.filter(s.is_duplicated()).unique().sort().head(EXAMPLES).to_list()
    elif c.categorical is not None and c.categorical.counts is not None:
        counts = c.categorical.counts
        dups = c.count - len(counts)
        examples = sorted(v for v, k in counts.items() if k > 1)[:EXAMPLES]
    else:
        return [Anomaly(kind="not_checkable", severity="info", column=cs.name,
                        description="uniqueness not checked: statistics hold no exact value "
                                    "counts for this column; validate the table itself")]
    if dups == 0:
        return []
    return [Anomaly(kind="duplicate_key", severity="error", column=cs.name, count=dups,
                    total=c.count, examples=examples,
                    description=f"{dups} rows repeat a key already seen (must be unique)")]


def _row_anomalies(rows: int, schema: Schema, previous: DatasetStats | None) -> list[Anomaly]:
    out = []
    tol = schema.row_tolerance
    for ref, what in ((schema.expected_rows, "expected"),
                      (previous.rows if previous is not None else None, "previous")):
        if ref is None:
            continue
        change = (rows - ref) / ref if ref else (math.inf if rows else 0.0)
        if abs(change) > tol:
            out.append(Anomaly(kind="row_count_change", severity="warning", column=None,
                               count=rows, total=ref,
                               description=f"{rows} rows vs {ref} {what} ({change:+.1%}; "
                                           f"tolerance ±{tol:.0%})"))
    return out


def anomalies_to_dicts(anomalies: list[Anomaly]) -> list[Mapping[str, Any]]:
    return [dataclasses.asdict(a) for a in anomalies]
