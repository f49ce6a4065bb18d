"""The time split as slices of one sort, and the leakage check's narrowing."""

from __future__ import annotations

from datetime import datetime

import polars as pl
import pytest

from scalelab.system.data.split import (
    SORT_COLUMNS,
    LeakageError,
    check_leakage,
    split_by_time,
    split_order,
)

FEATURES = pl.DataFrame({
    "flight_key": ["b", "a", "c", "d", "e", "f", "g"],
    "time_hour": [datetime(2013, 1, 1), datetime(2013, 1, 1), None, datetime(2013, 12, 1),
                  datetime(2013, 11, 2), datetime(2013, 5, 1), datetime(2013, 11, 1)],
    "month": [1.0, 1.0, 3.0, 12.0, None, 11.0, 11.0]})


def test_split_equals_filter_then_sort_and_drops_rows_without_month() -> None:
    is_test = pl.col("month") >= 11.0
    for frame in (FEATURES, FEATURES.sort(split_order(2))):
        sp = split_by_time(frame, test_months=2, ordered=frame is not FEATURES)
        assert sp.train.equals(FEATURES.filter(~is_test).sort(SORT_COLUMNS))
        assert sp.test.equals(FEATURES.filter(is_test).sort(SORT_COLUMNS))
        assert sp.train["flight_key"].to_list() == ["c", "a", "b"]
        assert sp.test["flight_key"].to_list() == ["f", "g", "d"]
    assert split_by_time(FEATURES.head(0)).train.height == 0


def test_leakage_compares_whole_rows_where_the_first_column_is_shared() -> None:
    df = pl.DataFrame({"flight_key": ["a", "b", "c"], "x": [1, None, 3], "y": [None, 2.0, 3.0]})
    assert check_leakage(df, df.with_columns(pl.lit("z").alias("flight_key"),
                                             pl.lit(9).alias("x"))) == {
        "shared_keys": 0, "shared_rows": 0}
    with pytest.raises(LeakageError, match="2 duplicate row"):
        check_leakage(df, df.slice(1, 2).with_columns(pl.lit("z").alias("flight_key")))
    with pytest.raises(LeakageError, match=r"0 flight_key.*1 duplicate row"):
        check_leakage(df, df.slice(0, 1).with_columns(pl.lit("z").alias("flight_key"),
                                                      pl.lit(None, pl.Int64).alias("x")).vstack(
            df.slice(1, 1).with_columns(pl.lit("w").alias("flight_key"))))
