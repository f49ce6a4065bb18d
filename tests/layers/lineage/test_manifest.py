"""Manifests: per-row-group digests that change with any single cell, atomic writes."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from scalelab.lab.core.errors import BadInputError
from scalelab.layers.lineage.manifest import (
    LINES_PER_PART,
    Manifest,
    code_version,
    dir_digest,
    file_digest,
    parquet_digest,
    read_manifest,
    table_row_group_digest,
    write_manifest,
)


def _frame(n: int = 1000) -> pl.DataFrame:
    return pl.DataFrame({"a": list(range(n)), "b": [f"s{i}" for i in range(n)],
                         "c": [i / 7 for i in range(n)]})


def test_parquet_digest_changes_with_one_cell_and_names_the_row_group(tmp_path: Path) -> None:
    df = _frame()
    p = tmp_path / "t.parquet"
    df.write_parquet(p, row_group_size=100)
    before = parquet_digest(p)
    assert len(before.parts) == 10 and before.rows == 1000 and before.unit == "row_group"
    # Same values, different codec -> same digest (values and types only).
    df.write_parquet(tmp_path / "u.parquet", row_group_size=100, compression="uncompressed")
    assert parquet_digest(tmp_path / "u.parquet").digest == before.digest
    changed = df.with_columns(pl.when(pl.col("a") == 537).then(pl.lit("x")).otherwise(pl.col("b"))
                              .alias("b"))
    changed.write_parquet(p, row_group_size=100)
    after = parquet_digest(p)
    assert after.digest != before.digest
    assert after.changed_parts(before.parts) == [5]


def test_text_digest_is_per_line_block(tmp_path: Path) -> None:
    p = tmp_path / "x.csv"
    lines = [f"{i},v\n" for i in range(LINES_PER_PART + 10)]
    p.write_text("".join(lines))
    before = file_digest(p)
    assert len(before.parts) == 2 and before.unit == "lines"
    lines[LINES_PER_PART + 3] = "x,v\n"
    p.write_text("".join(lines))
    after = file_digest(p)
    assert after.changed_parts(before.parts) == [1]


def test_dir_digest_skips_manifest_and_hidden(tmp_path: Path) -> None:
    (tmp_path / "a.csv").write_text("1\n")
    d1, files = dir_digest(tmp_path)
    (tmp_path / "manifest.json").write_text("{}")
    (tmp_path / ".tmp").write_text("junk")
    assert dir_digest(tmp_path)[0] == d1 and list(files) == ["a.csv"]


def test_manifest_roundtrip_atomic(tmp_path: Path) -> None:
    m = Manifest(kind="dataset", name="x", digest="0" * 64, rows=3, parameters={"seed": 0})
    write_manifest(tmp_path, m)
    assert [p.name for p in tmp_path.iterdir()] == ["manifest.json"]
    back = read_manifest(tmp_path)
    assert back.rows == 3 and back.parameters == {"seed": 0} and back.code == code_version()
    with pytest.raises(BadInputError):
        Manifest(kind="dataset", name="x", digest="abc")
    with pytest.raises(BadInputError):
        read_manifest(tmp_path / "nope")


def test_digest_ignores_the_writer(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    df = _frame().with_columns(
        pl.when(pl.col("a") % 7 == 0).then(None).otherwise(pl.col("b")).alias("b"),
        pl.from_epoch(pl.col("a"), time_unit="s").alias("t"))
    df.write_parquet(tmp_path / "polars.parquet", row_group_size=250)
    pq.write_table(df.to_arrow(), tmp_path / "arrow.parquet", row_group_size=250)
    pq.write_table(df.to_arrow(), tmp_path / "sliced.parquet", row_group_size=100)
    a, b = parquet_digest(tmp_path / "polars.parquet"), parquet_digest(tmp_path / "arrow.parquet")
    assert a.digest == b.digest and len(a.parts) == 4
    assert parquet_digest(tmp_path / "sliced.parquet").digest != a.digest  # other row groups
    mem = table_row_group_digest(df.to_arrow(), 100)
    assert mem == parquet_digest(tmp_path / "sliced.parquet")


def test_an_empty_table_has_one_digest_whoever_wrote_it(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    df = _frame().head(0)
    df.write_parquet(tmp_path / "polars.parquet", row_group_size=250)  # no row group
    pq.write_table(df.to_arrow(), tmp_path / "arrow.parquet", row_group_size=250)  # one, empty
    assert pq.ParquetFile(tmp_path / "polars.parquet").num_row_groups == 0
    mem = table_row_group_digest(df.to_arrow(), 250)
    assert parquet_digest(tmp_path / "polars.parquet") == mem
    assert parquet_digest(tmp_path / "arrow.parquet") == mem
    assert mem.rows == 0 and len(mem.parts) == 1
