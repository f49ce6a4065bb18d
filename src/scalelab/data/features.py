"""Joins and features: the flights feature contract that train, serve and model read.

Left joins, so no flight is lost: weather on (origin, time_hour) and planes on tailnum; a plane
missing from the planes table gets plane_model "UNKNOWN" and null year/seats. Weather is
de-duplicated on (origin, time_hour) keeping the first row, so the join cannot multiply rows.

``time_hour`` is the scheduled departure hour as a naive Datetime(us) holding UTC (as the
source's "...Z" strings say). Numeric features are Float64 with nulls allowed.
"""

from __future__ import annotations

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
    """'20130101-UA-1545-EWR-0515': date, carrier, flight number, origin, scheduled time."""
    return pl.format("{}{}{}-{}-{}-{}-{}",
                     pl.col("year"), pl.col("month").cast(pl.String).str.zfill(2),
                     pl.col("day").cast(pl.String).str.zfill(2), pl.col("carrier"),
                     pl.col("flight"), pl.col("origin"),
                     pl.col("sched_dep_time").cast(pl.String).str.zfill(4))


def build_features(frame: pl.DataFrame, dims: Dimensions) -> pl.DataFrame:
    """Deduplicated typed flights (with delay_class) -> the feature contract's columns."""
    date = pl.date(pl.col("year"), pl.col("month"), pl.col("day"))
    out = (
        frame.lazy()
        .join(dims.weather.lazy(), on=["origin", "time_hour"], how="left")
        .join(dims.planes.lazy(), on="tailnum", how="left")
        .with_columns(
            flight_key().alias("flight_key"),
            pl.col("plane_model").fill_null("UNKNOWN"),
            date.dt.weekday().cast(pl.Float64).alias("day_of_week"),
            (pl.col("sched_dep_time") // 100).cast(pl.Float64).alias("sched_dep_hour"),
            (pl.col("sched_arr_time") // 100).cast(pl.Float64).alias("sched_arr_hour"),
            pl.col("month").cast(pl.Float64), pl.col("distance").cast(pl.Float64),
        )
        .select(FEATURE_COLUMNS)
        .collect()
    )
    return out.cast(feature_schema())  # type: ignore[arg-type]
