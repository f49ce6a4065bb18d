"""Per-column dataset statistics that merge exactly across partitions.

`compute_stats(partition)` on each partition, then `merge_all(parts)`, gives the *same object*
(==, and the same JSON) as `compute_stats(whole)`, whatever the partitioning. Every piece of state
is either an integer count, a min/max, or an exact rational, so merging is exact, associative and
commutative:

- count, nulls, NaN/±inf counts, min, max: exact.
- sum and sum of squares of the finite values: exact rationals (each float64 is split into
  integer limbs per binary exponent and summed in int64, then combined in Python ints), so mean
  and std are computed once from exact totals and rounded once: bit-identical across partitionings.
- quantiles and histograms: a log-bucketed sketch (DDSketch-style) whose bucket boundaries are
  fixed powers of gamma = (1+a)/(1-a), a = `RELATIVE_ACCURACY` (1%), independent of the data and
  its partitioning. Bucket counts are integers, so the merged sketch is exact; the *estimate* it
  gives for a quantile is within relative error a of the exact lower order statistic
  x[floor(q*(n-1))] (values with |x| < `ZERO_THRESHOLD` share one zero bucket: absolute error
  below that threshold).
- categorical (string, boolean, categorical) values: exact value counts while the column has at
  most `max_distinct` distinct values (default 10,000); above that the counts are dropped and
  `distinct` is reported as unknown ("overflow"). Whether a merged column overflows depends only
  on the union's distinct count, so this is partition-independent too.
- temporal columns: min and max (physical integer units), count, nulls.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from fractions import Fraction
from typing import Any, Literal

import numpy as np
import polars as pl

from scalelab.lab.core.errors import BadInputError

RELATIVE_ACCURACY = 0.01
"""Quantile sketch accuracy: estimates are within 1% (relative) of the exact order statistic."""
ZERO_THRESHOLD = 1e-9
"""|x| below this is counted in the sketch's zero bucket."""
MAX_DISTINCT = 10_000
"""Exact value counts are kept for categorical columns with at most this many distinct values."""
QUANTILES = (0.01, 0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99)
"""Quantiles listed in summaries (p1 ... p99)."""
FORMAT = "scalelab.stats/1"

Kind = Literal["numeric", "categorical", "temporal", "other"]

# int64 limb sums stay exact for chunks up to 2**24 rows (largest limb product < 2**37).
_CHUNK = 1 << 24


def _dyadic(total: int, exp2: int) -> Fraction:
    return Fraction(total << exp2) if exp2 >= 0 else Fraction(total, 1 << -exp2)


def exact_sums(x: np.ndarray) -> tuple[Fraction, Fraction]:
    """Exact sum and sum of squares of finite float64 values, as rationals.

    x = M * 2**(e-53) with |M| < 2**53 an integer; |M| is split into 27+26-bit limbs for the sum
    and 18-bit limbs for the square, each summed in int64 per exponent (exact), then combined in
    Python ints. Costs a sort by exponent: about 3x a plain float sum.
    """
    s, ss = Fraction(0), Fraction(0)
    for start in range(0, len(x), _CHUNK):
        a, b = _exact_sums_chunk(x[start:start + _CHUNK])
        s += a
        ss += b
    return s, ss


def _exact_sums_chunk(x: np.ndarray) -> tuple[Fraction, Fraction]:
    if len(x) == 0:
        return Fraction(0), Fraction(0)
    m, e = np.frexp(x)
    mi = (m * 2.0**53).astype(np.int64)
    sign = np.sign(mi)
    am = np.abs(mi)
    order = np.argsort(e, kind="stable")
    es = e[order]
    starts = np.concatenate(([0], np.flatnonzero(np.diff(es)) + 1))
    exps = [int(v) for v in es[starts]]

    def gsum(arr: np.ndarray) -> list[int]:
        return [int(v) for v in np.add.reduceat(arr[order], starts)]

    hi, lo = gsum(sign * (am >> 27)), gsum(sign * (am & ((1 << 27) - 1)))
    a, b, c = am >> 36, (am >> 18) & ((1 << 18) - 1), am & ((1 << 18) - 1)
    sq_terms = [(gsum(a * a), 72), (gsum(2 * a * b), 54), (gsum(2 * a * c + b * b), 36),
                (gsum(2 * b * c), 18), (gsum(c * c), 0)]
    base = exps[0]
    total = 0
    total_sq = 0
    for g, ex in enumerate(exps):
        total += ((hi[g] << 27) + lo[g]) << (ex - base)
        total_sq += sum(t[g] << sh for t, sh in sq_terms) << (2 * (ex - base))
    return _dyadic(total, base - 53), _dyadic(total_sq, 2 * (base - 53))


@dataclasses.dataclass(kw_only=True)
class QuantileSketch:
    """Log-bucketed counts: bucket i holds values in (gamma**(i-1), gamma**i]; mirrored for < 0."""

    relative_accuracy: float = RELATIVE_ACCURACY
    """Relative error bound of quantile estimates; fixes the bucket boundaries."""
    pos: dict[int, int] = dataclasses.field(default_factory=dict)
    """Bucket index -> count of positive values."""
    neg: dict[int, int] = dataclasses.field(default_factory=dict)
    """Bucket index (of |x|) -> count of negative values."""
    zero: int = 0
    """Count of values with |x| < ZERO_THRESHOLD."""

    def __post_init__(self) -> None:
        if not 0 < self.relative_accuracy < 1:
            raise BadInputError(
                f"relative_accuracy must be in (0, 1), got {self.relative_accuracy}")

    @property
    def gamma(self) -> float:
        return (1 + self.relative_accuracy) / (1 - self.relative_accuracy)

    @classmethod
    def of(cls, x: np.ndarray, relative_accuracy: float = RELATIVE_ACCURACY) -> QuantileSketch:
        """Sketch of finite float64 values."""
        sk = cls(relative_accuracy=relative_accuracy)
        ax = np.abs(x)
        small = ax < ZERO_THRESHOLD
        sk.zero = int(small.sum())
        log_gamma = math.log(sk.gamma)
        for target, mask in ((sk.pos, (x > 0) & ~small), (sk.neg, (x < 0) & ~small)):
            idx = np.ceil(np.log(ax[mask]) / log_gamma).astype(np.int64)
            keys, counts = np.unique(idx, return_counts=True)
            target.update(zip(keys.tolist(), counts.tolist(), strict=True))
        return sk

    @property
    def count(self) -> int:
        return self.zero + sum(self.pos.values()) + sum(self.neg.values())

    def merge(self, other: QuantileSketch) -> QuantileSketch:
        if other.relative_accuracy != self.relative_accuracy:
            raise BadInputError("cannot merge sketches with different relative_accuracy "
                                f"({self.relative_accuracy} vs {other.relative_accuracy})")
        return QuantileSketch(relative_accuracy=self.relative_accuracy,
                              pos=_add_counts(self.pos, other.pos),
                              neg=_add_counts(self.neg, other.neg), zero=self.zero + other.zero)

    def buckets(self) -> list[tuple[tuple[int, int], float, int]]:
        """(order key, representative value, count) in increasing value order.

        Keys are the same for every sketch with this accuracy, so two sketches can be compared
        bucket by bucket (the shared bins of skew measures).
        """
        g = self.gamma
        out = [((0, -i), -2 * g**i / (g + 1), c) for i, c in sorted(self.neg.items(), reverse=True)]
        if self.zero:
            out.append(((1, 0), 0.0, self.zero))
        out += [((2, i), 2 * g**i / (g + 1), c) for i, c in sorted(self.pos.items())]
        return out

    def intervals(self) -> list[tuple[float, float, int]]:
        """(low, high, count) per bucket in increasing order: every counted value v has
        low <= v <= high (bounds inclusive on both sides, to absorb rounding in the log)."""
        g = self.gamma
        out = [(-(g**i), -(g ** (i - 1)), c) for i, c in sorted(self.neg.items(), reverse=True)]
        if self.zero:
            out.append((-ZERO_THRESHOLD, ZERO_THRESHOLD, self.zero))
        out += [(g ** (i - 1), g**i, c) for i, c in sorted(self.pos.items())]
        return out

    def quantiles(self, qs: Iterable[float]) -> list[float | None]:
        """Estimates of the lower order statistic x[floor(q*(n-1))] for each q in [0, 1]."""
        n = self.count
        bk = self.buckets()
        cum = np.cumsum([c for _, _, c in bk]) if bk else np.array([], dtype=np.int64)
        out: list[float | None] = []
        for q in qs:
            if not 0 <= q <= 1:
                raise BadInputError(f"quantile {q} is outside [0, 1]")
            if n == 0:
                out.append(None)
                continue
            rank = math.floor(q * (n - 1))
            out.append(bk[int(np.searchsorted(cum, rank, side="right"))][1])
        return out


def _add_counts(a: Mapping[Any, int], b: Mapping[Any, int]) -> dict[Any, int]:
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, 0) + v
    return out


def _min(a: Any, b: Any) -> Any:
    return b if a is None else a if b is None else min(a, b)


def _max(a: Any, b: Any) -> Any:
    return b if a is None else a if b is None else max(a, b)


@dataclasses.dataclass(kw_only=True)
class NumericStats:
    """Mergeable state of a numeric column (non-null values only)."""

    finite: int = 0
    """Number of finite values (NaN and ±inf are counted apart and excluded below)."""
    nan: int = 0
    pos_inf: int = 0
    neg_inf: int = 0
    min: float | None = None
    """Smallest finite value."""
    max: float | None = None
    """Largest finite value."""
    sum: Fraction = Fraction(0)
    """Exact sum of the finite values."""
    sum_sq: Fraction = Fraction(0)
    """Exact sum of squares of the finite values."""
    sketch: QuantileSketch = dataclasses.field(default_factory=QuantileSketch)
    """Quantile sketch of the finite values."""

    @classmethod
    def of(cls, s: pl.Series, relative_accuracy: float) -> NumericStats:
        s = s.drop_nulls()
        big = s.dtype.is_integer() and len(s) > 0 and max(
            abs(int(s.min())), abs(int(s.max()))) >= 2**53  # type: ignore[arg-type]
        x = s.cast(pl.Float64).to_numpy()
        xf = x[np.isfinite(x)]
        if big:
            # Beyond 2**53 an int64 -> float64 cast rounds; sum those in Python ints instead.
            ints = s.to_list()
            total, total_sq = Fraction(sum(ints)), Fraction(sum(v * v for v in ints))
        else:
            total, total_sq = exact_sums(xf)
        return cls(finite=len(xf), nan=int(np.isnan(x).sum()), pos_inf=int(np.isposinf(x).sum()),
                   neg_inf=int(np.isneginf(x).sum()),
                   min=float(xf.min()) if len(xf) else None,
                   max=float(xf.max()) if len(xf) else None,
                   sum=total, sum_sq=total_sq, sketch=QuantileSketch.of(xf, relative_accuracy))

    def merge(self, o: NumericStats) -> NumericStats:
        return NumericStats(finite=self.finite + o.finite, nan=self.nan + o.nan,
                            pos_inf=self.pos_inf + o.pos_inf, neg_inf=self.neg_inf + o.neg_inf,
                            min=_min(self.min, o.min), max=_max(self.max, o.max),
                            sum=self.sum + o.sum, sum_sq=self.sum_sq + o.sum_sq,
                            sketch=self.sketch.merge(o.sketch))

    @property
    def mean(self) -> float | None:
        return float(self.sum / self.finite) if self.finite else None

    @property
    def std(self) -> float | None:
        """Sample standard deviation (n-1), from the exact sums: one rounding."""
        if self.finite < 2:
            return None
        var = (self.sum_sq - self.sum * self.sum / self.finite) / (self.finite - 1)
        return math.sqrt(float(var))

    def quantiles(self, qs: Iterable[float] = QUANTILES) -> dict[str, float | None]:
        """Sketch estimates, clamped to the exact [min, max]."""
        qs = list(qs)
        out: dict[str, float | None] = {}
        for q, v in zip(qs, self.sketch.quantiles(qs), strict=True):
            out[f"p{round(q * 100, 6):g}"] = (
                None if v is None else min(max(v, self.min), self.max))  # type: ignore[type-var]
        return out

    def histogram(self, bins: int = 10) -> dict[str, list[float] | list[int]]:
        """Equal-width bins over [min, max]; each sketch bucket is placed by its representative
        value, so a count may sit one bin off near an edge (within the sketch's 1%)."""
        if self.min is None or self.max is None:
            return {"edges": [], "counts": []}
        edges = np.linspace(self.min, self.max, bins + 1) if self.max > self.min else \
            np.array([self.min, self.max])
        counts = np.zeros(len(edges) - 1, dtype=np.int64)
        for _, rep, c in self.sketch.buckets():
            i = int(np.searchsorted(edges, rep, side="right")) - 1
            counts[min(max(i, 0), len(counts) - 1)] += c
        return {"edges": edges.tolist(), "counts": counts.tolist()}


@dataclasses.dataclass(kw_only=True)
class CategoricalStats:
    """Mergeable state of a string/boolean/categorical column."""

    counts: dict[str, int] | None = dataclasses.field(default_factory=dict)
    """Exact count per value, or None when the column has more than max_distinct values."""

    @property
    def distinct(self) -> int | None:
        return None if self.counts is None else len(self.counts)

    def top_k(self, k: int = 10) -> list[tuple[str, int]]:
        """Most frequent values, ties broken by value (deterministic); [] when overflowed."""
        if self.counts is None:
            return []
        return sorted(self.counts.items(), key=lambda kv: (-kv[1], kv[0]))[:k]

    def merge(self, o: CategoricalStats, max_distinct: int) -> CategoricalStats:
        if self.counts is None or o.counts is None:
            return CategoricalStats(counts=None)
        merged = _add_counts(self.counts, o.counts)
        return CategoricalStats(counts=merged if len(merged) <= max_distinct else None)


@dataclasses.dataclass(kw_only=True)
class ColumnStats:
    """Statistics of one column: counts for all kinds, plus the part for its kind."""

    name: str
    dtype: str
    """The polars dtype, as text (e.g. 'Float64', 'String', "Datetime(time_unit='us')")."""
    kind: Kind
    count: int = 0
    """Non-null values."""
    nulls: int = 0
    numeric: NumericStats | None = None
    categorical: CategoricalStats | None = None
    temporal_min: int | None = None
    """Temporal columns: smallest physical value (e.g. microseconds since the epoch)."""
    temporal_max: int | None = None

    @property
    def null_rate(self) -> float:
        total = self.count + self.nulls
        return self.nulls / total if total else 0.0

    def merge(self, o: ColumnStats, max_distinct: int) -> ColumnStats:
        if (o.name, o.dtype, o.kind) != (self.name, self.dtype, self.kind):
            raise BadInputError(
                f"cannot merge statistics of column {self.name!r} ({self.dtype}) with "
                f"{o.name!r} ({o.dtype}); all partitions must share one schema")
        return ColumnStats(
            name=self.name, dtype=self.dtype, kind=self.kind, count=self.count + o.count,
            nulls=self.nulls + o.nulls,
            numeric=self.numeric.merge(o.numeric) if self.numeric and o.numeric else None,
            categorical=(self.categorical.merge(o.categorical, max_distinct)
                         if self.categorical and o.categorical else None),
            temporal_min=_min(self.temporal_min, o.temporal_min),
            temporal_max=_max(self.temporal_max, o.temporal_max))


def column_kind(dtype: pl.DataType) -> Kind:
    """How a polars dtype is summarised."""
    if dtype.is_numeric():
        return "numeric"
    if dtype in (pl.String, pl.Boolean) or isinstance(dtype, pl.Categorical | pl.Enum):
        return "categorical"
    if dtype.is_temporal():
        return "temporal"
    return "other"


def _column_stats(s: pl.Series, relative_accuracy: float, max_distinct: int) -> ColumnStats:
    kind = column_kind(s.dtype)
    nulls = s.null_count()
    cs = ColumnStats(name=s.name, dtype=str(s.dtype), kind=kind, count=len(s) - nulls, nulls=nulls)
    if kind == "numeric":
        cs.numeric = NumericStats.of(s, relative_accuracy)
    elif kind == "categorical":
        text = s.drop_nulls()
        text = (text.cast(pl.String).str.to_lowercase() if s.dtype == pl.Boolean
                else text.cast(pl.String))
        vc = text.value_counts()
        counts = dict(zip(vc[:, 0].to_list(), vc[:, 1].to_list(), strict=True))
        cs.categorical = CategoricalStats(counts=counts if len(counts) <= max_distinct else None)
    elif kind == "temporal" and cs.count:
        phys = s.drop_nulls().to_physical()
        cs.temporal_min, cs.temporal_max = int(phys.min()), int(phys.max())  # type: ignore[arg-type]
    return cs


@dataclasses.dataclass(kw_only=True)
class DatasetStats:
    """Statistics of a table: row count and one ColumnStats per column (in table order)."""

    rows: int = 0
    columns: dict[str, ColumnStats] = dataclasses.field(default_factory=dict)
    relative_accuracy: float = RELATIVE_ACCURACY
    """Quantile sketch accuracy used (must match to merge)."""
    max_distinct: int = MAX_DISTINCT
    """Categorical exact-count limit used (must match to merge)."""

    def merge(self, other: DatasetStats) -> DatasetStats:
        """Statistics of the union of both tables' rows. Exact, associative and commutative."""
        if (self.relative_accuracy, self.max_distinct) != (other.relative_accuracy,
                                                           other.max_distinct):
            raise BadInputError("cannot merge statistics computed with different settings "
                                f"(relative_accuracy {self.relative_accuracy} vs "
                                f"{other.relative_accuracy}, max_distinct {self.max_distinct} vs "
                                f"{other.max_distinct}); recompute with the same settings")
        if set(self.columns) != set(other.columns):
            diff = sorted(set(self.columns) ^ set(other.columns))
            raise BadInputError(f"cannot merge statistics of tables with different columns "
                                f"(only on one side: {', '.join(diff)})")
        return DatasetStats(
            rows=self.rows + other.rows, relative_accuracy=self.relative_accuracy,
            max_distinct=self.max_distinct,
            columns={n: c.merge(other.columns[n], self.max_distinct)
                     for n, c in self.columns.items()})

    def to_dict(self, *, top_k: int = 10, bins: int = 10) -> dict[str, Any]:
        """JSON-able: the mergeable state plus a derived `summary` per column (ignored on load)."""
        cols = []
        for c in self.columns.values():
            d: dict[str, Any] = {"name": c.name, "dtype": c.dtype, "kind": c.kind,
                                 "count": c.count, "nulls": c.nulls}
            summary: dict[str, Any] = {"null_rate": c.null_rate}
            if c.numeric is not None:
                n = c.numeric
                d["numeric"] = {
                    "finite": n.finite, "nan": n.nan, "pos_inf": n.pos_inf, "neg_inf": n.neg_inf,
                    "min": n.min, "max": n.max, "sum": str(n.sum), "sum_sq": str(n.sum_sq),
                    "sketch": {"pos": {str(k): v for k, v in sorted(n.sketch.pos.items())},
                               "neg": {str(k): v for k, v in sorted(n.sketch.neg.items())},
                               "zero": n.sketch.zero}}
                summary.update(mean=n.mean, std=n.std, min=n.min, max=n.max,
                               quantiles=n.quantiles(), histogram=n.histogram(bins))
            if c.categorical is not None:
                counts = c.categorical.counts
                d["categorical"] = {
                    "counts": None if counts is None else dict(sorted(counts.items()))}
                summary.update(distinct=c.categorical.distinct,
                               top_k=[[v, k] for v, k in c.categorical.top_k(top_k)])
            if c.kind == "temporal":
                d["temporal"] = {"min": c.temporal_min, "max": c.temporal_max}
            d["summary"] = summary
            cols.append(d)
        return {"format": FORMAT, "rows": self.rows, "relative_accuracy": self.relative_accuracy,
                "max_distinct": self.max_distinct, "columns": cols}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> DatasetStats:
        """Inverse of to_dict; a clear BadInputError on anything malformed."""
        try:
            if d.get("format") != FORMAT:
                raise BadInputError(f"not a statistics document (format {d.get('format')!r}, "
                                    f"expected {FORMAT!r})")
            ra = float(d["relative_accuracy"])
            out = cls(rows=int(d["rows"]), relative_accuracy=ra,
                      max_distinct=int(d["max_distinct"]))
            for c in d["columns"]:
                cs = ColumnStats(name=str(c["name"]), dtype=str(c["dtype"]), kind=c["kind"],
                                 count=int(c["count"]), nulls=int(c["nulls"]))
                if cs.kind not in ("numeric", "categorical", "temporal", "other"):
                    raise BadInputError(f"column {cs.name!r}: unknown kind {cs.kind!r}")
                if (n := c.get("numeric")) is not None:
                    sk = n["sketch"]
                    cs.numeric = NumericStats(
                        finite=int(n["finite"]), nan=int(n["nan"]), pos_inf=int(n["pos_inf"]),
                        neg_inf=int(n["neg_inf"]),
                        min=None if n["min"] is None else float(n["min"]),
                        max=None if n["max"] is None else float(n["max"]),
                        sum=Fraction(n["sum"]), sum_sq=Fraction(n["sum_sq"]),
                        sketch=QuantileSketch(
                            relative_accuracy=ra, zero=int(sk["zero"]),
                            pos={int(k): int(v) for k, v in sk["pos"].items()},
                            neg={int(k): int(v) for k, v in sk["neg"].items()}))
                if (g := c.get("categorical")) is not None:
                    counts = g["counts"]
                    cs.categorical = CategoricalStats(
                        counts=None if counts is None else {str(k): int(v)
                                                            for k, v in counts.items()})
                if (t := c.get("temporal")) is not None:
                    cs.temporal_min = None if t["min"] is None else int(t["min"])
                    cs.temporal_max = None if t["max"] is None else int(t["max"])
                out.columns[cs.name] = cs
            return out
        except BadInputError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError, ZeroDivisionError) as e:
            raise BadInputError(f"malformed statistics document ({type(e).__name__}: {e}); "
                                "regenerate it with `scalelab data stats DATA --json`") from None


def compute_stats(df: pl.DataFrame, *, columns: Iterable[str] | None = None,
                  relative_accuracy: float = RELATIVE_ACCURACY,
                  max_distinct: int = MAX_DISTINCT) -> DatasetStats:
    """Statistics of `df` (or of `columns` only). Merge per-partition results with merge_all."""
    names = list(df.columns) if columns is None else list(columns)
    missing = [c for c in names if c not in df.columns]
    if missing:
        raise BadInputError(f"no column(s) {', '.join(map(repr, missing))}; "
                            f"columns are: {', '.join(df.columns)}")
    if max_distinct < 1:
        raise BadInputError(f"max_distinct must be >= 1, got {max_distinct}")
    QuantileSketch(relative_accuracy=relative_accuracy)  # validates the accuracy
    return DatasetStats(
        rows=df.height, relative_accuracy=relative_accuracy, max_distinct=max_distinct,
        columns={n: _column_stats(df.get_column(n), relative_accuracy, max_distinct)
                 for n in names})


def merge_all(parts: Iterable[DatasetStats]) -> DatasetStats:
    """Merge per-partition statistics (any order, any grouping: the result is the same)."""
    parts = list(parts)
    if not parts:
        raise BadInputError("merge_all needs at least one DatasetStats")
    out = parts[0]
    for p in parts[1:]:
        out = out.merge(p)
    return out
