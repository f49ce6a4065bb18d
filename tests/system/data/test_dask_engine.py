"""Local and Dask (a real 2-process LocalCluster) give the same bytes, statistics and digests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scalelab.system.data.dask_engine import skew
from scalelab.system.data.pipeline import PipelineConfig, run_pipeline

pytestmark = [pytest.mark.filterwarnings("ignore::ResourceWarning"),
              pytest.mark.filterwarnings("ignore:.*:UserWarning"),
              pytest.mark.filterwarnings("ignore:.*:RuntimeWarning")]


def test_local_and_dask_are_identical(defective: Path, tmp_path: Path) -> None:
    local = run_pipeline(PipelineConfig(input=defective, out=tmp_path / "local", register=False))
    dask = run_pipeline(PipelineConfig(input=defective, out=tmp_path / "dask", engine="dask",
                                       workers=2, partitions=5, register=False))
    assert dask.file_digests == local.file_digests
    assert dask.digest == local.digest
    for name in ("train.parquet", "test.parquet", "quarantine.parquet", "stats.json"):
        assert (tmp_path / "local" / name).read_bytes() == (tmp_path / "dask" / name).read_bytes()
    stats = json.loads((tmp_path / "dask" / "stats.json").read_text())
    assert stats["train"]["rows"] == local.train_rows
    assert dask.reconciliation == local.reconciliation and dask.reconciliation["holds"]
    p = dask.partitions
    assert p["workers"] == 2 and p["buckets"] == 5 and len(p["bucket"]) == 5
    assert len(p["ingest"]) == local.input_files
    assert sum(b["rows"] for b in p["bucket"]) == sum(
        s.rows_out for s in dask.stages if s.name == "ingest_validate")
    # Skew is max/median of the bucket rows it reports; a few thousand rows never spill.
    assert p["skew"]["bucket_rows"] == skew([float(b["rows"]) for b in p["bucket"]])
    assert p["skew"]["bucket_rows"] > 1.0  # 5 hash buckets of real keys are never equal
    assert p["spilled_disk_bytes"] == 0
    assert set(p["spill"]) and all("rss_bytes" in v for v in p["spill"].values())
    assert all(v["rss_bytes"] > 0 for v in p["spill"].values())
    assert dask.dominant_stage in {s.name for s in dask.stages}


def test_skew() -> None:
    assert skew([1.0, 2.0, 3.0, 10.0]) == 4.0
    assert skew([]) is None and skew([0.0, 0.0]) is None


def test_existing_scheduler_by_address(clean: Path, tmp_path: Path) -> None:
    from dask.distributed import LocalCluster

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                      dashboard_address=None) as cluster:
        r = run_pipeline(PipelineConfig(input=clean, out=tmp_path / "d", engine="dask",
                                        address=cluster.scheduler_address, partitions=3,
                                        register=False, stats=False))
    local = run_pipeline(PipelineConfig(input=clean, out=tmp_path / "l", register=False,
                                        stats=False))
    assert r.file_digests == local.file_digests and r.partitions["buckets"] == 3
    assert r.partitions["workers"] == 1
    assert (tmp_path / "d" / "train.parquet").read_bytes() == (
        tmp_path / "l" / "train.parquet").read_bytes()
