"""What a pipeline engine (local or Dask) hands to the writer, and the partition statistics
both compute: the one module the pipeline and its engines share (so neither imports the other).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import polars as pl


@dataclass(kw_only=True)
class EngineOutput:
    """Engine output handed to the writer."""

    rows_in: int
    train: pl.DataFrame
    test: pl.DataFrame
    quarantine: pl.DataFrame
    exact_duplicates: int
    key_duplicates: int
    anomalies: list[dict[str, Any]]
    cutoff_month: int
    stats: dict[str, Any] | None
    partitions: dict[str, Any] = field(default_factory=dict)


def compute(df: pl.DataFrame) -> Any:
    """Mergeable statistics of one partition (data/stats.py)."""
    from scalelab.system.data.stats import compute_stats

    return compute_stats(df)


def stats_document(*, train: list[Any], test: list[Any]) -> dict[str, Any]:
    from scalelab.system.data.stats import merge_all

    return {"train": merge_all(train).to_dict(), "test": merge_all(test).to_dict()}


