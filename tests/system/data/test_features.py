"""Features: the key-only joins + gathers give exactly what full left joins give."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import polars as pl

from scalelab.system.data.dedupe import deduplicate
from scalelab.system.data.features import (
    FEATURE_COLUMNS,
    INPUT_COLUMNS,
    Dimensions,
    build_features,
    feature_schema,
    flight_key,
    packed_order,
)
from scalelab.system.data.ingest import ingest_file, list_inputs
from scalelab.system.data.pipeline import load_dimensions
from scalelab.system.data.quarantine import validate
from scalelab.system.data.split import split_order


def test_features_equal_full_left_joins(clean: Path) -> None:
    root, files = list_inputs(clean)
    dims = load_dimensions(root)
    good = pl.concat([validate(ingest_file(f, root).frame, carriers=dims.carriers,
                               origins=dims.origins)[0] for f in files])
    frame = deduplicate(good, keep_columns=INPUT_COLUMNS).frame
    # A tail number the planes table lacks, and an hour the weather table lacks.
    frame = frame.with_columns(
        pl.when(pl.int_range(pl.len()) == 0).then(pl.lit("N0NE")).otherwise("tailnum")
        .alias("tailnum"),
        pl.when(pl.int_range(pl.len()) == 1).then(pl.col("time_hour") + pl.duration(minutes=1))
        .otherwise("time_hour").alias("time_hour"))
    ref = (frame.lazy().with_columns(flight_key().alias("flight_key")).sort(split_order(2))
           .join(dims.weather.lazy(), on=["origin", "time_hour"], how="left",
                 maintain_order="left")
           .join(dims.planes.lazy(), on="tailnum", how="left", maintain_order="left")
           .with_columns(
               pl.col("plane_model").fill_null("UNKNOWN"),
               pl.date("year", "month", "day").dt.weekday().cast(pl.Float64)
               .alias("day_of_week"),
               (pl.col("sched_dep_time") // 100).cast(pl.Float64).alias("sched_dep_hour"),
               (pl.col("sched_arr_time") // 100).cast(pl.Float64).alias("sched_arr_hour"),
               pl.col("month").cast(pl.Float64), pl.col("distance").cast(pl.Float64))
           .select(FEATURE_COLUMNS).collect().cast(feature_schema()))  # type: ignore[arg-type]
    out = build_features(frame, dims, test_months=2)
    assert out.equals(ref)
    assert out.filter(pl.col("plane_model") == "UNKNOWN").height >= 1
    assert out["temp"].null_count() >= 1


def _flights(rows: list[tuple[int, int, int, str, int, str, int, str]]) -> pl.DataFrame:
    """(month, day, hour, carrier, flight, origin, sched_dep_time, tailnum) -> typed flights."""
    return pl.DataFrame(
        [{"year": 2013, "month": m, "day": d, "carrier": c, "flight": f, "tailnum": t,
          "origin": o, "dest": "IAH", "sched_dep_time": s, "sched_arr_time": 1200,
          "distance": 1400, "time_hour": datetime(2013, m, d, h), "delay_class": 0}
         for m, d, h, c, f, o, s, t in rows],
        schema={"year": pl.Int16, "month": pl.Int8, "day": pl.Int8, "carrier": pl.String,
                "flight": pl.Int32, "tailnum": pl.String, "origin": pl.String,
                "dest": pl.String, "sched_dep_time": pl.Int16, "sched_arr_time": pl.Int16,
                "distance": pl.Int16, "time_hour": pl.Datetime("us"), "delay_class": pl.Int8})


def _by_split_order(frame: pl.DataFrame) -> pl.DataFrame:
    return frame.with_columns(flight_key().alias("flight_key")).sort(split_order(2))


def test_packed_order_is_the_text_order_of_the_flight_key(clean: Path) -> None:
    dims = load_dimensions(list_inputs(clean)[0])
    # Flight 200 sorts after 1545 as text; 9E before AA; same hour, other dates and sides.
    frame = _flights([
        (1, 1, 5, "UA", 200, "EWR", 515, "N1"), (1, 1, 5, "UA", 1545, "EWR", 515, "N1"),
        (1, 1, 5, "AA", 1545, "LGA", 559, "N2"), (1, 1, 5, "9E", 7, "JFK", 500, "N3"),
        (1, 1, 5, "UA", 1545, "EWR", 505, "N1"), (12, 31, 23, "B6", 1, "JFK", 2359, "N4"),
        (11, 1, 0, "B6", 99_999, "JFK", 0, "N4"), (1, 2, 5, "UA", 20, "EWR", 515, "N1"),
        (10, 31, 23, "UA", 3, "EWR", 2300, "N1"), (1, 1, 4, "WN", 12, "LGA", 459, "N5")])
    order = packed_order(frame, dims, 2)
    assert order is not None
    assert frame.sort(order).with_columns(flight_key().alias("flight_key")).equals(
        _by_split_order(frame))
    out = build_features(frame, dims, test_months=2)
    assert out["flight_key"].to_list() == _by_split_order(frame)["flight_key"].to_list()


def test_packed_order_declines_what_it_cannot_order(clean: Path) -> None:
    dims = load_dimensions(list_inputs(clean)[0])
    frame = _flights([(1, 1, 5, "UA", 200, "EWR", 515, "N1"),
                      (1, 1, 5, "UA", 1545, "EWR", 515, "N1")])
    half_hour = frame.with_columns(pl.col("time_hour") + pl.duration(minutes=30))
    before_1970 = frame.with_columns(  # a negative timestamp, not a whole hour
        pl.Series("time_hour", [datetime(1969, 12, 31, 23, 30), datetime(1969, 12, 31, 23, 10)]))
    unknown = frame.with_columns(pl.lit("ZZ").alias("carrier"))
    dashed = Dimensions(weather=dims.weather, planes=dims.planes,
                        carriers=[*dims.carriers, "A-"], origins=dims.origins)
    assert packed_order(half_hour, dims, 2) is None
    assert packed_order(before_1970, dims, 2) is None
    assert packed_order(unknown, dims, 2) is None
    assert packed_order(frame, dashed, 2) is None
    assert packed_order(frame.head(0), dims, 2) is None
    # build_features then sorts by split_order itself: the same rows in the same order.
    for f, d in ((half_hour, dims), (before_1970, dims), (unknown, dims), (frame, dashed)):
        assert build_features(f, d, test_months=2)["flight_key"].to_list() == \
            _by_split_order(f)["flight_key"].to_list()
