"""Joins and features: the flights feature contract that train, serve and model read.

Left joins, so no flight is lost: weather on (origin, time_hour) and planes on tailnum; a plane
missing from the planes table gets plane_model "UNKNOWN" and null year/seats. Weather is
de-duplicated on (origin, time_hour) keeping the first row, so the join cannot multiply rows.

``time_hour`` is the scheduled departure hour as a naive Datetime(us) holding UTC (as the
source's "...Z" strings say). Numeric features are Float64 with nulls allowed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import polars as pl

from scalelab.data.quarantine import TIME_FORMATS

CATEGORICAL: tuple[str, ...] = ("carrier", "origin", "dest", "plane_model")
NUMERIC: tuple[str, ...] = (
    "month", "day_of_week", "sched_dep_hour", "sched_arr_hour", "distance", "plane_year",
    "plane_seats", "temp", "dewp", "humid", "wind_speed", "precip", "pressure", "visib")
LABEL = "delay_class"
CLASSES: tuple[str, ...] = ("on_time", "late_15_60", "late_60_plus", "cancelled")
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


def build_features(frame: pl.DataFrame, dims: Dimensions, *,
                   order: Sequence[pl.Expr] = ()) -> pl.DataFrame:
    """Deduplicated typed flights (with delay_class) -> the feature contract's columns, rows in
    input order, or sorted by ORDER (expressions over the input and flight_key; split.py's
    split_order()). Sorting here, before the joins widen each row from ~90 to ~230 bytes,
    copies the narrow table instead of the output (~0.75 GB less peak memory at scale 10)."""
    weekday = day_of_week(frame)
    rows = frame.lazy().with_columns(flight_key().alias("flight_key"))
    if order:
        rows = rows.sort(order)
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
