"""Mergeable statistics on the real flights table: partition independence, exactness, sketches."""

from __future__ import annotations

import itertools
import json
import math
import statistics
from fractions import Fraction

import numpy as np
import polars as pl
import pytest

from scalelab.lab.core.errors import BadInputError
from scalelab.system.data.stats import (
    QUANTILES,
    DatasetStats,
    QuantileSketch,
    compute_stats,
    exact_sums,
    merge_all,
)


@pytest.fixture(scope="module")
def flights(flights_typed: pl.DataFrame) -> pl.DataFrame:
    df = flights_typed
    # A float column with fractional values, so the float path is exercised on real data.
    return df.with_columns((pl.col("dep_delay") / 7.0).alias("dep_delay_per7"))


@pytest.fixture(scope="module")
def whole(flights: pl.DataFrame) -> DatasetStats:
    return compute_stats(flights)


def random_partitions(df: pl.DataFrame, seed: int, parts: int) -> list[pl.DataFrame]:
    rng = np.random.default_rng(seed)
    shuffled = df[rng.permutation(df.height)]
    cuts = sorted(rng.choice(np.arange(1, df.height), parts - 1, replace=False).tolist())
    bounds = [0, *cuts, df.height]
    return [shuffled[a:b] for a, b in itertools.pairwise(bounds)]


@pytest.mark.parametrize(("seed", "parts"), [(0, 7), (1, 3)])
def test_merged_stats_do_not_depend_on_the_partitioning(flights: pl.DataFrame,
                                                        whole: DatasetStats, seed: int,
                                                        parts: int) -> None:
    stats = [compute_stats(p) for p in random_partitions(flights, seed, parts)]
    merged = merge_all(stats)
    assert merged == whole  # every field exactly: counts, min/max, exact sums, sketch, counts
    assert json.dumps(merged.to_dict()) == json.dumps(whole.to_dict())
    # associative and commutative: a reversed, tree-shaped merge gives the same object
    rev = stats[::-1]
    mid = len(rev) // 2
    assert merge_all([merge_all(rev[:mid]), merge_all(rev[mid:])]) == whole


def test_an_empty_partition_merges_as_identity(flights: pl.DataFrame,
                                               whole: DatasetStats) -> None:
    assert compute_stats(flights.head(0)).merge(whole) == whole


def test_exact_sums_match_rational_arithmetic() -> None:
    rng = np.random.default_rng(3)
    x = np.concatenate([rng.normal(0, 1e6, 5000), rng.normal(0, 1e-6, 5000),
                        [5e-324, -5e-324, 1e300, -1e300, 0.0, 2.0**52 + 1, 0.1]])
    s, ss = exact_sums(x)
    assert s == sum((Fraction(v) for v in x.tolist()), Fraction(0))
    assert ss == sum((Fraction(v) ** 2 for v in x.tolist()), Fraction(0))


def test_mean_and_std_are_the_correctly_rounded_exact_values(whole: DatasetStats,
                                                             flights: pl.DataFrame) -> None:
    for col in ("dep_delay", "distance", "arr_delay"):
        vals = flights.get_column(col).drop_nulls().to_list()  # ints: Python sums are exact
        n, s, ss = len(vals), sum(vals), sum(v * v for v in vals)
        got = whole.columns[col].numeric
        assert got is not None
        assert (got.sum, got.sum_sq) == (s, ss)
        assert got.mean == float(Fraction(s, n))
        assert got.std == math.sqrt(float(Fraction(n * ss - s * s, n * (n - 1))))
        assert (got.min, got.max) == (min(vals), max(vals))
    per7 = flights.get_column("dep_delay_per7").drop_nulls().head(20_000)
    st = compute_stats(per7.to_frame()).columns["dep_delay_per7"].numeric
    assert st is not None
    exact = sum((Fraction(v) for v in per7.to_list()), Fraction(0))
    assert st.sum == exact and st.mean == float(exact / per7.len())
    assert st.std == pytest.approx(statistics.stdev(per7.to_list()), rel=1e-15)
    dep = whole.columns["dep_delay"]
    assert (dep.count, dep.nulls) == (328_521, 8_255)


def test_quantiles_are_within_the_documented_relative_error(whole: DatasetStats,
                                                            flights: pl.DataFrame) -> None:
    for col in ("dep_delay", "arr_delay", "distance", "air_time", "dep_delay_per7"):
        x = np.sort(flights.get_column(col).drop_nulls().to_numpy())
        n = whole.columns[col].numeric
        assert n is not None
        est = n.quantiles()
        for q in QUANTILES:
            exact = float(x[math.floor(q * (len(x) - 1))])
            got = est[f"p{round(q * 100):g}"]
            assert got is not None
            assert abs(got - exact) <= 0.01 * abs(exact) * (1 + 1e-9) + 1e-9, (col, q, got, exact)


def test_histogram_and_sketch_account_for_every_value(whole: DatasetStats) -> None:
    n = whole.columns["air_time"].numeric
    assert n is not None
    h = n.histogram(10)
    assert len(h["edges"]) == 11 and sum(h["counts"]) == n.finite == n.sketch.count  # type: ignore[arg-type]


def test_categorical_counts_are_exact(whole: DatasetStats, flights: pl.DataFrame) -> None:
    c = whole.columns["carrier"].categorical
    assert c is not None
    vc = flights.get_column("carrier").value_counts()
    assert c.counts == dict(zip(vc[:, 0].to_list(), vc[:, 1].to_list(), strict=True))
    assert c.distinct == 16
    assert c.top_k(3) == [("UA", 58_665), ("B6", 54_635), ("EV", 54_173)]
    tail = whole.columns["tailnum"]
    assert tail.categorical is not None and tail.categorical.distinct == 4_043
    assert tail.nulls == 2_512
    th = whole.columns["time_hour"]
    assert th.kind == "temporal" and th.temporal_min is not None
    assert th.temporal_min < th.temporal_max  # type: ignore[operator]


def test_distinct_overflow_is_partition_independent(flights: pl.DataFrame) -> None:
    # dest has 105 values: with a limit of 50 the whole overflows, while small partitions each
    # stay under it: the merge must overflow too.
    whole = compute_stats(flights, columns=["dest", "origin"], max_distinct=50)
    parts = [compute_stats(p, columns=["dest", "origin"], max_distinct=50)
             for p in flights.head(3000).iter_slices(30)]  # 30 rows: < 50 values each
    assert all(p.columns["dest"].categorical.counts is not None  # type: ignore[union-attr]
               for p in parts)
    merged = merge_all([*parts, compute_stats(flights[3000:], columns=["dest", "origin"],
                                              max_distinct=50)])
    assert merged == whole
    assert whole.columns["dest"].categorical.distinct is None  # type: ignore[union-attr]
    assert whole.columns["origin"].categorical.distinct == 3  # type: ignore[union-attr]


def test_non_finite_values_are_counted_apart() -> None:
    df = pl.DataFrame({"x": [1.0, float("nan"), float("inf"), -float("inf"), None, 3.0],
                       "b": [True, False, True, None, True, True]})
    st = compute_stats(df)
    n = st.columns["x"].numeric
    assert n is not None
    assert (n.finite, n.nan, n.pos_inf, n.neg_inf, st.columns["x"].nulls) == (2, 1, 1, 1, 1)
    assert (n.min, n.max, n.mean) == (1.0, 3.0, 2.0)
    assert st.columns["b"].categorical.counts == {"true": 4, "false": 1}  # type: ignore[union-attr]
    json.dumps(st.to_dict(), allow_nan=False)


def test_to_dict_round_trips(whole: DatasetStats) -> None:
    doc = json.loads(json.dumps(whole.to_dict(), allow_nan=False))
    assert DatasetStats.from_dict(doc) == whole


@pytest.mark.parametrize("mutate", [
    lambda d: d.pop("rows"),
    lambda d: d.update(format="other"),
    lambda d: d["columns"][0].update(kind="weird"),
    lambda d: d["columns"][1]["numeric"].update(sum="x/y"),
])
def test_malformed_stats_documents_are_rejected(whole: DatasetStats, mutate: object) -> None:
    doc = json.loads(json.dumps(whole.to_dict()))
    mutate(doc)  # type: ignore[operator]
    with pytest.raises(BadInputError):
        DatasetStats.from_dict(doc)


def test_merging_different_tables_or_settings_is_refused(flights: pl.DataFrame) -> None:
    a = compute_stats(flights.head(10), columns=["month"])
    with pytest.raises(BadInputError, match="different columns"):
        a.merge(compute_stats(flights.head(10), columns=["day"]))
    with pytest.raises(BadInputError, match="different settings"):
        a.merge(compute_stats(flights.head(10), columns=["month"], relative_accuracy=0.02))
    with pytest.raises(BadInputError, match="one schema"):
        a.merge(compute_stats(flights.head(10).with_columns(pl.col("month").cast(pl.Float64)),
                              columns=["month"]))
    with pytest.raises(BadInputError, match="no column"):
        compute_stats(flights, columns=["nope"])


def test_sketch_quantile_of_known_values() -> None:
    sk = QuantileSketch.of(np.arange(1.0, 101.0))
    est = sk.quantiles([0.0, 0.5, 1.0])
    for got, exact in zip(est, (1.0, 50.0, 100.0), strict=True):
        assert got is not None and abs(got - exact) <= 0.01 * exact
    assert QuantileSketch().quantiles([0.5]) == [None]
