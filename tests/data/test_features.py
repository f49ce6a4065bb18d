"""Features: the key-only joins + gathers give exactly what full left joins give."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from scalelab.data.dedupe import deduplicate
from scalelab.data.features import (
    FEATURE_COLUMNS,
    INPUT_COLUMNS,
    build_features,
    feature_schema,
    flight_key,
)
from scalelab.data.ingest import ingest_file, list_inputs
from scalelab.data.pipeline import load_dimensions
from scalelab.data.quarantine import validate
from scalelab.data.split import split_order


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
    out = build_features(frame, dims, order=split_order(2))
    assert out.equals(ref)
    assert out.filter(pl.col("plane_model") == "UNKNOWN").height >= 1
    assert out["temp"].null_count() >= 1
