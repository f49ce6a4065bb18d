"""The time-based train/test split and its leakage check.

Cutoff (documented, deterministic): a flight whose scheduled month is in the last
``test_months`` months of the year goes to test (default 2: November and December), everything
earlier to train. Every scaled copy repeats the same year, so each copy is split the same way.

Leakage check (fails loudly with LeakageError): no flight_key on both sides, and no row whose
content (every column but flight_key) appears on both sides (a duplicate under another key).
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from scalelab.core.errors import RunFailedError

SORT_COLUMNS = ("time_hour", "flight_key")
"""The canonical row order of train.parquet and test.parquet."""


class LeakageError(RunFailedError):
    """Rows (or duplicates of them) on both sides of the split."""


@dataclass(frozen=True, kw_only=True)
class SplitResult:
    train: pl.DataFrame
    test: pl.DataFrame
    cutoff_month: int
    """First month (1-12) that goes to test."""


def split_by_time(features: pl.DataFrame, *, test_months: int = 2) -> SplitResult:
    cutoff = 13 - test_months
    is_test = pl.col("month") >= float(cutoff)
    train = features.filter(~is_test).sort(SORT_COLUMNS)
    test = features.filter(is_test).sort(SORT_COLUMNS)
    return SplitResult(train=train, test=test, cutoff_month=cutoff)


def check_leakage(train: pl.DataFrame, test: pl.DataFrame) -> dict[str, int]:
    """Count leaks; raise LeakageError if there is any."""
    keys = train.select("flight_key").join(test.select("flight_key"), on="flight_key",
                                           how="semi").height
    content = [c for c in train.columns if c != "flight_key"]
    dup = train.select(content).unique().join(test.select(content).unique(), on=content,
                                              how="semi", nulls_equal=True).height
    if keys or dup:
        raise LeakageError(f"train/test leakage: {keys} flight_key(s) and {dup} duplicate row(s) "
                           "are on both sides; the split is not time-disjoint")
    return {"shared_keys": keys, "shared_rows": dup}
