"""Joins and features: the table in the flights feature contract (nets.flights' columns).

Left joins, so no flight is lost: weather on (origin, time_hour) and planes on tailnum; a plane
missing from the planes table gets plane_model "UNKNOWN" and null year/seats. Weather is
de-duplicated on (origin, time_hour) keeping the first row, so the join cannot multiply rows.

``time_hour`` is the scheduled departure hour as a naive Datetime(us) holding UTC (as the
source's "...Z" strings say). Numeric features are Float64 with nulls allowed.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import polars as pl

from scalelab.layers.nets.flights import CATEGORICAL, LABEL, NUMERIC
from scalelab.system.data.quarantine import TIME_FORMATS
from scalelab.system.data.split import split_order

FEATURE_COLUMNS: tuple[str, ...] = ("flight_key", "time_hour", *CATEGORICAL, *NUMERIC, LABEL)
"""Exactly the columns of train.parquet and test.parquet, in this order."""
INPUT_COLUMNS: tuple[str, ...] = (
    "year", "month", "day", "carrier", "flight", "tailnum", "origin", "dest", "sched_dep_time",
    "sched_arr_time", "distance", "time_hour", LABEL)
"""The deduplicated flights columns build_features reads."""
WEATHER_NUMERIC = ("temp", "dewp", "humid", "wind_speed", "precip", "pressure", "visib")


def feature_schema() -> dict[str, pl.DataType]:
    s: dict[str, pl.DataType] = {"flight_key": pl.String(), "time_hour": pl.Datetime("us")}
    s.update({c: pl.String() for c in CATEGORICAL})
    s.update({c: pl.Float64() for c in NUMERIC})
    s[LABEL] = pl.Int8()
    return s


@dataclass(frozen=True, kw_only=True)
class Dimensions:
    """The small tables every partition joins against (broadcast to Dask workers)."""

    weather: pl.DataFrame
    planes: pl.DataFrame
    carriers: list[str]
    origins: list[str]

    @classmethod
    def from_raw(cls, weather: pl.DataFrame, planes: pl.DataFrame, airlines: pl.DataFrame
                 ) -> Dimensions:
        w = weather.select(
            pl.col("origin"),
            pl.coalesce([pl.col("time_hour").str.to_datetime(f, time_unit="us", strict=False)
                         for f in TIME_FORMATS]).alias("time_hour"),
            *[pl.col(c).cast(pl.Float64, strict=False) for c in WEATHER_NUMERIC],
        ).filter(pl.col("time_hour").is_not_null()).unique(
            ["origin", "time_hour"], keep="first", maintain_order=True)
        p = planes.select(
            pl.col("tailnum"),
            pl.col("model").fill_null("UNKNOWN").alias("plane_model"),
            pl.col("year").cast(pl.Float64, strict=False).alias("plane_year"),
            pl.col("seats").cast(pl.Float64, strict=False).alias("plane_seats"),
        ).unique("tailnum", keep="first", maintain_order=True)
        carriers = sorted(airlines["carrier"].drop_nulls().unique().to_list())
        origins = sorted(w["origin"].drop_nulls().unique().to_list())
        return cls(weather=w, planes=p, carriers=carriers, origins=origins)


def flight_key() -> pl.Expr:
    """'20130101-UA-1545-EWR-0515': date, carrier, flight number, origin, scheduled time.

    Over valid rows (quarantine.RANGES: 4-digit year, non-negative month, day and time) the
    zero padding is arithmetic: ~40% cheaper than formatting and padding each part."""
    date = (pl.col("year").cast(pl.Int32) * 10_000 + pl.col("month").cast(pl.Int32) * 100
            + pl.col("day").cast(pl.Int32))
    hhmm = (pl.col("sched_dep_time").cast(pl.Int32) + 10_000).cast(pl.String).str.slice(1)
    return pl.concat_str([date.cast(pl.String), pl.col("carrier"),
                          pl.col("flight").cast(pl.String), pl.col("origin"), hhmm],
                         separator="-")


def day_of_week(frame: pl.DataFrame) -> pl.Expr:
    """ISO day of week (Float64) of (year, month, day), computed for FRAME's distinct dates
    (a year of flights has 365) and looked up per row: per row it cost ~0.25 s on one thread
    at scale 10. An impossible date (Feb 30) still raises, as it did per row."""
    ymd = (pl.col("year").cast(pl.Int32) * 10_000 + pl.col("month").cast(pl.Int32) * 100
           + pl.col("day").cast(pl.Int32))
    days = frame.select(ymd.unique().sort().alias("ymd")).get_column("ymd")
    if days.null_count():
        return pl.date("year", "month", "day").dt.weekday().cast(pl.Float64)
    d = pl.col("ymd")
    weekdays = days.to_frame().select(
        pl.date(d // 10_000, d // 100 % 100, d % 100).dt.weekday().cast(pl.Float64)).to_series()
    return ymd.replace_strict(days, weekdays, return_dtype=pl.Float64)


_HOUR_US = 3_600_000_000


@functools.cache
def _flight_text_rank() -> pl.Series:
    """rank[n]: the place of str(n) among str(0), ..., str(99_999) in text order."""
    n = np.arange(100_000)
    rank = np.empty_like(n)
    rank[np.argsort(n.astype(str), kind="stable")] = n
    return pl.Series("rank", rank)


def _bits(n: int) -> int:
    """Bits that hold 0 .. n-1."""
    return max(1, (n - 1).bit_length())


def packed_order(frame: pl.DataFrame, dims: Dimensions, test_months: int) -> pl.Series | None:
    """One Int64 per row of FRAME whose order is split_order(test_months)'s (test rows last,
    then time_hour, then flight_key), or None where one cannot be built. Sorting on it is a
    sort of integers; sorting on (bool, datetime, text) compared rows field by field (~10%
    of a scale-10 run's CPU).

    flight_key is 'date-carrier-flight-origin-hhmm' and '-' sorts before digits and capital
    letters, so its text order is the order of its parts' texts: the date (8 digits) and hhmm
    (4) in numeric order, carrier and origin by their place in the sorted domain lists, the
    flight number by its text rank. None when a part does not fit that (a domain name with a
    character at or below '-', a value outside the domains or the ranges below, a time_hour
    that is not a whole hour) or the parts need over 63 bits (data spanning ~2+ years)."""
    if frame.height == 0 or any(ch <= "-" for name in (*dims.carriers, *dims.origins)
                                for ch in name):
        return None
    th = pl.col("time_hour").cast(pl.Int64)
    lim = frame.select(
        th.min().alias("th0"), th.max().alias("th1"), (th % _HOUR_US).max().alias("th_rem"),
        pl.col("year").min().alias("y0"), pl.col("year").max().alias("y1"),
        pl.min_horizontal(pl.col("month", "day", "flight", "sched_dep_time").min()).alias("lo"),
        pl.col("month").max().alias("month"), pl.col("day").max().alias("day"),
        pl.col("flight").max().alias("flight"), pl.col("sched_dep_time").max().alias("hhmm"),
    ).row(0, named=True)
    if any(v is None for v in lim.values()) or lim["th_rem"] != 0 or lim["lo"] < 0 \
            or lim["y0"] < 1000 or lim["y1"] > 9999 or lim["month"] > 12 or lim["day"] > 31 \
            or lim["flight"] >= len(_flight_text_rank()) or lim["hhmm"] > 9999:
        return None
    carriers, origins = sorted(dims.carriers), sorted(dims.origins)
    parts = [
        (pl.col("month") >= 13 - test_months, 1),
        ((th - lim["th0"]) // _HOUR_US, _bits((lim["th1"] - lim["th0"]) // _HOUR_US + 1)),
        # The date's text order: year, then month x 32 + day (month <= 12, day <= 31).
        ((pl.col("year").cast(pl.Int64) - lim["y0"]) * 416 + pl.col("month").cast(pl.Int64) * 32
         + pl.col("day"), _bits((lim["y1"] - lim["y0"] + 1) * 416)),
        (pl.col("carrier").cast(pl.Enum(carriers), strict=False).to_physical(),
         _bits(len(carriers))),
        (pl.lit(_flight_text_rank()).gather(pl.col("flight")), _bits(len(_flight_text_rank()))),
        (pl.col("origin").cast(pl.Enum(origins), strict=False).to_physical(),
         _bits(len(origins))),
        (pl.col("sched_dep_time"), _bits(lim["hhmm"] + 1)),
    ]
    if sum(bits for _, bits in parts) > 63:
        return None
    key = pl.lit(0, pl.Int64)
    for part, bits in parts:
        key = key * (1 << bits) + part.cast(pl.Int64)
    order = frame.select(key.alias("__order")).to_series()
    return None if order.null_count() else order  # a carrier or origin outside the domains


def build_features(frame: pl.DataFrame, dims: Dimensions, *,
                   test_months: int | None = None) -> pl.DataFrame:
    """Deduplicated typed flights (with delay_class) -> the feature contract's columns, rows in
    input order, or (TEST_MONTHS given) sorted by split_order(test_months), as split.py's
    split_by_time(..., ordered=True) expects. Sorting here, before the joins widen each row
    from ~90 to ~230 bytes, copies the narrow table instead of the output (~0.75 GB less peak
    memory at scale 10)."""
    weekday = day_of_week(frame)
    order = None if test_months is None else packed_order(frame, dims, test_months)
    rows = frame.lazy()
    if order is not None:
        rows = rows.with_columns(order).sort(order.name).drop(order.name)
    rows = rows.with_columns(flight_key().alias("flight_key"))
    if test_months is not None and order is None:
        rows = rows.sort(split_order(test_months))
    out = (
        rows
        .join(dims.weather.lazy(), on=["origin", "time_hour"], how="left",
              maintain_order="left")
        .join(dims.planes.lazy(), on="tailnum", how="left", maintain_order="left")
        .with_columns(
            pl.col("plane_model").fill_null("UNKNOWN"),
            weekday.alias("day_of_week"),
            (pl.col("sched_dep_time") // 100).cast(pl.Float64).alias("sched_dep_hour"),
            (pl.col("sched_arr_time") // 100).cast(pl.Float64).alias("sched_arr_hour"),
            pl.col("month").cast(pl.Float64), pl.col("distance").cast(pl.Float64),
        )
        .select(FEATURE_COLUMNS)
        # polars 2.1's default engine ran this plan ~25% slower, with ~40% more page faults
        # and ~0.2 GB more peak memory at scale 10, than the in-memory engine.
        .collect(engine="in-memory")
    )
    return out.cast(feature_schema())  # type: ignore[arg-type]
