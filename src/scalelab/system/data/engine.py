"""What a pipeline engine (local or Dask) is asked (PipelineConfig) and hands to the writer
(EngineOutput), and the partition statistics both compute: the one module the pipeline and its
engines share (so neither imports the other).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from scalelab.lab.core.errors import BadUsageError

ENGINES = ("local", "dask")
ROW_GROUP_SIZE = 65_536
"""Rows per Parquet row group: the unit of the per-row-group digests."""


@dataclass(frozen=True, kw_only=True)
class PipelineConfig:
    """What `scalelab data run` does."""

    input: Path
    """A flights file, a directory of them, or a dataset written by `data generate`."""
    out: Path
    """Output dataset directory (replaced atomically if it exists)."""
    engine: str = "local"
    """'local' (polars in this process) or 'dask' (distributed futures)."""
    address: str | None = None
    """Dask scheduler address (tcp://HOST:8786); None starts a LocalCluster."""
    workers: int | None = None
    """LocalCluster worker processes (default: available cores)."""
    partitions: int | None = None
    """Hash buckets for the Dask dedupe/join stage (default: 2 x workers)."""
    test_months: int = 2
    """The last TEST_MONTHS months of the year go to test."""
    row_group_size: int = ROW_GROUP_SIZE
    """Rows per Parquet row group."""
    lineage: Path | None = None
    """Lineage store to register the output in (None: $SCALELAB_LINEAGE or ./.scalelab)."""
    register: bool = True
    """Record input -> output edges in the lineage store."""
    stats: bool = True
    """Compute mergeable statistics of train and test (stats.json)."""

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise BadUsageError(f"--engine {self.engine!r}: choose local or dask")
        if self.address and self.engine != "dask":
            raise BadUsageError("--address needs --engine dask")
        if self.workers is not None and not 1 <= self.workers <= 256:
            raise BadUsageError("--workers must be between 1 and 256")
        if self.partitions is not None and not 1 <= self.partitions <= 4096:
            raise BadUsageError("--partitions must be between 1 and 4096")
        if not 1 <= self.test_months <= 11:
            raise BadUsageError("--test-months must be between 1 and 11")
        if self.row_group_size < 1:
            raise BadUsageError("row_group_size must be positive")


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


