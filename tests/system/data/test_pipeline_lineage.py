"""Lineage end to end: `scalelab lineage impacted` is exact after one changed cell."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from scalelab.cli import run
from scalelab.layers.lineage.store import LineageStore
from scalelab.system.data.generate import GenerateConfig, generate
from scalelab.system.data.pipeline import PipelineConfig, run_pipeline


def _impacted(source: Path, db: Path, capsys: pytest.CaptureFixture[str]) -> dict:
    assert run(["lineage", "impacted", str(source), "--lineage", str(db), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_impacted_after_one_cell(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "lineage.db"
    generate(GenerateConfig(scales=(1,), out=tmp_path / "a", seed=0, sample=3000))
    generate(GenerateConfig(scales=(1,), out=tmp_path / "b", seed=1, sample=3000))
    ds_a, ds_b = tmp_path / "ds-a", tmp_path / "ds-b"
    run_pipeline(PipelineConfig(input=tmp_path / "a" / "x1", out=ds_a, lineage=db,
                                row_group_size=500, stats=False))
    assert run(["data", "run", "--input", str(tmp_path / "b" / "x1"), "--out", str(ds_b),
                "--lineage", str(db), "--no-stats", "--json"]) == 0
    capsys.readouterr()
    model = tmp_path / "repo" / "flights" / "1"
    model.mkdir(parents=True)
    (model / "model.safetensors").write_bytes(b"weights")
    (model / "manifest.json").write_text('{"kind": "model"}')
    LineageStore(db).record(output=model, inputs=[ds_a])

    src = tmp_path / "a" / "x1" / "flights" / "part-c000-m03.csv"
    assert _impacted(src, db, capsys)["changed"] is False
    lines = src.read_text().splitlines(keepends=True)
    fields = lines[10].split(",")
    fields[15] = str(int(fields[15]) + 1)  # distance of one flight
    lines[10] = ",".join(fields)
    src.write_text("".join(lines))
    imp = _impacted(src, db, capsys)
    assert imp["changed"] is True and imp["changed_parts"] == {"": [0]}
    assert imp["part_unit"] == {"": "lines"}
    assert {(d["kind"], d["path"]) for d in imp["downstream"]} == {
        ("dataset", str(ds_a.resolve())), ("model", str(model.resolve()))}

    # A dataset as the source: one cell of train.parquet -> its row group, and the model.
    train = pl.read_parquet(ds_a / "train.parquet")
    train = train.with_columns(pl.when(pl.int_range(pl.len()) == 1234).then(pl.lit(-1.0))
                               .otherwise(pl.col("distance")).alias("distance"))
    train.write_parquet(ds_a / "train.parquet", row_group_size=500)
    imp = _impacted(ds_a, db, capsys)
    assert imp["changed_parts"] == {"train.parquet": [2]}
    assert [d["path"] for d in imp["downstream"]] == [str(model.resolve())]

    assert run(["lineage", "show", "--lineage", str(db), "--json"]) == 0
    g = json.loads(capsys.readouterr().out)
    kinds = sorted(n["kind"] for n in g["nodes"])
    assert kinds.count("dataset") == 2 and kinds.count("model") == 1
    assert len(g["edges"]) == 2 * 15 + 1  # 12 monthly files + 3 dimension tables, per dataset
    assert run(["lineage", "show", "--lineage", str(db)]) == 0
    assert "model" in capsys.readouterr().out
    assert run(["lineage", "impacted", str(tmp_path / "nope.csv"), "--lineage", str(db)]) == 2
    assert "not in the lineage store" in capsys.readouterr().err
