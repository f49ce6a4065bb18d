"""The generator: deterministic, seeded, nested scales, exact ground truth of the defects."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from scalelab.lab.core.errors import BadUsageError
from scalelab.layers.lineage.manifest import file_digest
from scalelab.system.data.generate import (
    DefectSpec,
    GenerateConfig,
    Written,
    base_flights,
    generate,
    generate_one,
    parse_defects,
)


def test_same_seed_same_bytes_and_scales_nest(tmp_path: Path) -> None:
    a = generate(GenerateConfig(scales=(1, 2), out=tmp_path / "a", seed=3, sample=3000,
                                defects=parse_defects("duplicates=0.02,nulls=0.01")))
    b = generate(GenerateConfig(scales=(2,), out=tmp_path / "b", seed=3, sample=3000,
                                defects=parse_defects("duplicates=0.02,nulls=0.01")))
    assert a[1]["digest"] == b[0]["digest"]
    # Copy 0 of x2 is x1: adding a scale never changes the smaller ones.
    for f in (tmp_path / "a" / "x1" / "flights").iterdir():
        twin = tmp_path / "a" / "x2" / "flights" / f.name
        assert file_digest(f).digest == file_digest(twin).digest
    c = generate(GenerateConfig(scales=(1,), out=tmp_path / "c", seed=4, sample=3000,
                                defects=parse_defects("duplicates=0.02,nulls=0.01")))
    assert c[0]["digest"] != a[0]["digest"]


def test_copies_are_perturbed_not_duplicated(tmp_path: Path) -> None:
    generate(GenerateConfig(scales=(2,), out=tmp_path, sample=5000))
    root = tmp_path / "x2" / "flights"
    c0 = pl.read_csv(root / "part-c000-m05.csv", infer_schema=False)
    c1 = pl.read_csv(root / "part-c001-m05.csv", infer_schema=False)
    assert c0.height == c1.height
    flight0 = c0["flight"].cast(pl.Int64)
    assert (c1["flight"].cast(pl.Int64) == flight0 + 10_000).all()
    assert (c1["hour"] == c0["hour"]).all() and (c1["time_hour"] == c0["time_hour"]).all()
    assert (c1["sched_dep_time"] != c0["sched_dep_time"]).sum() > c0.height // 2
    cancelled0 = c0["dep_time"] == "NA"
    assert (cancelled0 == (c1["dep_time"] == "NA")).all()
    m = json.loads((tmp_path / "x2" / "manifest.json").read_text())
    assert m["parameters"]["seed"] == 0 and m["rows"] == 2 * 5000
    assert m["validation"]["injected"]["by_rule"] == {}


def test_truth_counts_follow_the_rates(defective: Path) -> None:
    m = json.loads((defective / "manifest.json").read_text())
    inj = m["validation"]["injected"]
    truth = pl.read_parquet(defective / "truth.parquet")
    assert inj["by_rule"]["duplicate"] == truth.filter(pl.col("rule") == "duplicate").height
    # 22 ordinary files of ~1000 rows: round(0.01 * rows) duplicates each.
    assert 200 <= inj["by_rule"]["duplicate"] <= 250
    # Label conflicts come in pairs (the original and its conflicting copy).
    assert inj["by_rule"]["label_conflict"] % 2 == 0
    last = pl.read_csv(defective / "flights" / "part-c001-m12.csv", infer_schema=False)
    assert "dep_dly" in last.columns and "dep_delay" not in last.columns
    assert m["parameters"]["defects"]["rename_column"] == ["dep_delay", "dep_dly"]


@pytest.mark.parametrize("text, match", [
    ("duplicates=2", "between 0 and 0.2"),
    ("bogus=0.1", "unknown defect"),
    ("nulls", "NAME=VALUE"),
    ("rename_column=nope:x", "not a flights column"),
    ("retype_column=carrier:float", "integer column"),
])
def test_bad_defect_specs(text: str, match: str) -> None:
    with pytest.raises(BadUsageError, match=match):
        parse_defects(text)


def test_parse_defects() -> None:
    assert parse_defects("nulls=0.01,retype_column=distance:text") == DefectSpec(
        nulls=0.01, retype_column=("distance", "text"))


def test_scales_generated_together_copy_the_earlier_files_exactly(tmp_path: Path) -> None:
    """Scales share their files (Written): with row defects and the file-level ones (which
    land on a different file at every scale), each scale is byte for byte the scale generated
    alone, truth included."""
    spec = "duplicates=0.02,nulls=0.01,rename_column=dep_delay:dep_dly,retype_column=distance:float"
    written = Written()
    cfg = GenerateConfig(scales=(1, 2, 3), out=tmp_path / "together", seed=5, sample=2000,
                         defects=parse_defects(spec))
    base = base_flights(2000)
    together = [generate_one(cfg, k, base, written) for k in cfg.scales]
    # Each (copy, month) drawn once as a plain file (34: x3's last two carry its file-level
    # defects) plus each scale's two file-level files (6): 40 drawn for the 72 written.
    assert len(written.files) == 40
    for k, m in zip(cfg.scales, together, strict=True):
        alone = generate(GenerateConfig(scales=(k,), out=tmp_path / f"alone{k}", seed=5,
                                        sample=2000, defects=parse_defects(spec)))[0]
        assert m["digest"] == alone["digest"] and m["rows"] == alone["rows"]
        assert m["validation"] == alone["validation"]
