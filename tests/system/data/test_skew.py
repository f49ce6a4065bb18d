"""Skew and drift on the real flights table: identical data, a time split, shifted samples."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from scalelab.lab.core.drift import PSI_EPSILON, js_divergence, psi
from scalelab.lab.core.drift import linf as linf_distance
from scalelab.lab.core.errors import BadInputError
from scalelab.layers.nets.table_schema import Schema
from scalelab.system.data.schema import infer_schema
from scalelab.system.data.skew import compare, drift_anomalies
from scalelab.system.data.stats import DatasetStats, compute_stats

COLUMNS = ["month", "dep_delay", "distance", "carrier", "origin", "tailnum", "time_hour"]


@pytest.fixture(scope="module")
def flights(flights_typed: pl.DataFrame) -> pl.DataFrame:
    return flights_typed.select(COLUMNS)


@pytest.fixture(scope="module")
def split(flights: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    return flights.filter(pl.col("month") <= 10), flights.filter(pl.col("month") > 10)


@pytest.fixture(scope="module")
def split_stats(split: tuple[pl.DataFrame, pl.DataFrame]) -> tuple[DatasetStats, DatasetStats]:
    return compute_stats(split[0]), compute_stats(split[1])


def test_measures_on_known_distributions() -> None:
    assert js_divergence(np.array([1.0, 0.0]), np.array([0.0, 1.0])) == 1.0
    assert js_divergence(np.array([3.0, 5.0]), np.array([6.0, 10.0])) == 0.0
    expected = 0.5 * math.log(1.0 / 0.5) + (PSI_EPSILON - 0.5) * math.log(PSI_EPSILON / 0.5)
    assert psi(np.array([1.0, 1.0]), np.array([2.0, 0.0])) == pytest.approx(expected, rel=1e-12)
    assert linf_distance({"a": 3, "b": 1}, {"a": 1, "b": 1, "c": 2}) == (0.5, "a")


def test_identical_data_has_no_skew(flights: pl.DataFrame) -> None:
    r = compare(flights, flights)
    assert r.flagged == [] and r.only_in_reference == r.only_in_current == []
    by = {f.name: f for f in r.features}
    for name in ("month", "dep_delay", "distance"):
        assert (by[name].js, by[name].psi, by[name].ks_statistic) == (0.0, 0.0, 0.0)
        assert by[name].ks_pvalue == 1.0
    assert by["carrier"].linf == 0.0 and by["tailnum"].linf == 0.0
    assert by["time_hour"].kind == "skipped"


def test_time_split_flags_exactly_the_month(split: tuple[pl.DataFrame, pl.DataFrame]) -> None:
    train, test = split
    r = compare(train, test)
    assert [f.name for f in r.flagged] == ["month"]
    month = r.flagged[0]
    # Nov-Dec are outside Jan-Oct: all of `test` falls in the reference's last bin.
    assert month.js is not None and month.js > 0.7 and month.psi is not None and month.psi > 5
    assert month.ks_statistic == 1.0 and month.ks_method == "scipy.ks_2samp"
    carrier = next(f for f in r.features if f.name == "carrier")
    tc, sc = (d.get_column("carrier").value_counts() for d in (train, test))
    exact, _ = linf_distance(dict(tc.iter_rows()), dict(sc.iter_rows()))
    assert carrier.linf == exact and carrier.linf is not None and carrier.linf < 0.1


def test_statistics_only_gives_the_same_binned_measures(
        split: tuple[pl.DataFrame, pl.DataFrame],
        split_stats: tuple[DatasetStats, DatasetStats]) -> None:
    raw = compare(*split)
    st = compare(*split_stats)
    for a, b in zip(raw.features, st.features, strict=True):
        assert (a.name, a.js, a.psi, a.linf, a.flagged) == (b.name, b.js, b.psi, b.linf,
                                                             b.flagged)
        if a.kind == "numeric":
            assert b.ks_method == "sketch"
            # the sketch's D is taken on 1%-wide buckets: close to the exact one
            assert abs(a.ks_statistic - b.ks_statistic) < 0.01  # type: ignore[operator]


def test_shifted_samples_are_flagged(flights: pl.DataFrame) -> None:
    ref = flights.filter(pl.col("month") <= 6)
    cur = flights.filter(pl.col("month") <= 6).with_columns(
        pl.col("dep_delay") + 30,
        pl.when(pl.col("carrier") == "EV").then(pl.lit("UA")).otherwise(pl.col("carrier"))
        .alias("carrier"))
    r = compare(ref, cur)
    flagged = {f.name: f for f in r.flagged}
    assert sorted(flagged) == ["carrier", "dep_delay"]
    ev = ref.filter(pl.col("carrier") == "EV").height / ref.filter(
        pl.col("carrier").is_not_null()).height
    assert flagged["carrier"].linf == pytest.approx(ev, rel=1e-12)
    assert flagged["carrier"].linf_value in ("EV", "UA")
    assert any(s.startswith("psi") for s in flagged["dep_delay"].reasons)


def test_schema_thresholds_override_the_defaults(
        split_stats: tuple[DatasetStats, DatasetStats]) -> None:
    train, test = split_stats
    schema = infer_schema(train)
    month = next(c for c in schema.columns if c.name == "month")
    month.skew = {"js": None, "psi": None}
    assert compare(train, test, schema=schema).flagged == []
    strict = Schema(columns=schema.columns)
    strict.skew_defaults.linf = 0.001
    names = [f.name for f in compare(train, test, schema=strict).flagged]
    assert "carrier" in names and "month" not in names
    anomalies = drift_anomalies(compare(train, test, schema=strict))
    assert {a.kind for a in anomalies} == {"drift"}


def test_request_log_sample_with_only_some_columns(flights: pl.DataFrame,
                                                   tmp_path: Path) -> None:
    log = tmp_path / "requests.jsonl"
    sample = flights.filter(pl.col("month") == 12).select("carrier", "distance", "dep_delay")
    sample.head(2000).with_columns(pl.col("distance").cast(pl.Float64)).write_ndjson(log)
    served = pl.read_ndjson(log)
    r = compare(flights, served)
    assert r.only_in_reference == ["month", "origin", "tailnum", "time_hour"]
    assert r.only_in_current == []
    assert [f.name for f in r.features] == ["dep_delay", "distance", "carrier"]
    assert all(f.kind in ("numeric", "categorical") for f in r.features)


def test_kind_mismatch_is_flagged_and_bad_bins_refused(flights: pl.DataFrame) -> None:
    cur = flights.head(100).with_columns(pl.col("distance").cast(pl.String))
    r = compare(flights.head(100), cur)
    d = next(f for f in r.features if f.name == "distance")
    assert d.flagged and d.note is not None and "kinds differ" in d.note
    with pytest.raises(BadInputError, match="bins"):
        compare(flights.head(10), flights.head(10), bins=1)
